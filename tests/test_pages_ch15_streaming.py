"""Chapter 15's page: the feed checks reject what the timed feeds contradict."""

import pytest

from jaxloops.pages import ch15_streaming as page


def test_the_feed_checks_reject_a_wrong_prediction():
    h, d, steps = 0.004, 0.004, 10  # seconds per batch and per step; a call is `steps` steps
    rounds = lambda per_step, *slow: [steps * per_step * f for f in (1.0, *slow)]
    right = {
        "host_alone": rounds(h, 2.0, 1.0),
        "on_device": rounds(d, 2.0, 1.0),
        "streamed": rounds(h + d, 2.0, 1.0),
        "prefetched": rounds(1.1 * d, 2.0, 1.0),
    }
    # A round that slows every feed divides out.
    assert page.feed_failures(right, steps, 0.4) == []
    # A streamed loop that overlapped (max(h, d)) where h + d serialise: half the time.
    overlapped = {**right, "streamed": rounds(max(h, d), 2.0, 1.0)}
    assert page.feed_failures(overlapped, steps, 0.4)[0].startswith("streamed: 0.50")
    # A prefetched step faster than full overlap allows.
    too_fast = {**right, "prefetched": rounds(0.5 * max(h, d), 2.0, 1.0)}
    assert page.feed_failures(too_fast, steps, 0.4)[0].startswith("prefetched")


def test_bad_steps_and_bands_are_refused_by_name():
    samples = {name: [1.0] for name in ("host_alone", "on_device", "streamed", "prefetched")}
    for steps, band in [(0, 0.4), (10, -0.1), (10, 1.0)]:
        with pytest.raises(ValueError, match=f"steps={steps}, band={band}"):
            page.feed_failures(samples, steps, band)
