"""Chapter 15's instruments: the feeds' prediction and the device's idle share of a trace."""

import pytest

from jaxloops.measure import Span, feeds


def test_the_prediction_overlaps_only_with_free_cores():
    h, d, steps = 0.003, 0.005, 11
    free = feeds.predicted_feed_seconds(h, d, steps, 1.0, 1.0)
    assert free["streamed"] == pytest.approx(h + d)
    assert free["prefetched"] == pytest.approx((h + d + (steps - 1) * d) / steps)
    busy = feeds.predicted_feed_seconds(h, d, steps, 0.5, 0.5)  # no free core
    assert busy["prefetched"] == pytest.approx(h + d)
    with pytest.raises(ValueError, match="steps must be >= 1"):
        feeds.predicted_feed_seconds(h, d, 0, 1.0, 1.0)


def test_idle_share_is_the_time_no_device_span_was_open():
    spans = [Span("device", "a", 0.0, 1.0), Span("device", "b", 0.5, 2.0), Span("wait", "w", 0, 4)]
    assert feeds.idle_share(spans) == pytest.approx(0.5)


def test_bad_counts_and_times_are_refused_by_name():
    with pytest.raises(ValueError, match="no spans"):
        feeds.idle_share([])
    for args, message in [
        ((-1.0, 1.0, 5, 1.0, 1.0), "h=-1.0"),
        ((1.0, -1.0, 5, 1.0, 1.0), "d=-1.0"),
        ((1.0, 1.0, 5, 0.0, 1.0), "shares 0.0, 1.0"),
        ((1.0, 1.0, 0, 1.0, 1.0), "steps must be >= 1, got 0"),
    ]:
        with pytest.raises(ValueError, match=message):
            feeds.predicted_feed_seconds(*args)
    with pytest.raises(ValueError, match="rounds must be >= 1, got 0"):
        feeds.time_feeds(None, None, rounds=0)
