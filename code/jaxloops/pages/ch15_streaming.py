"""Chapter 15's page: what the timed feeds say against their predictions
(book/15_streaming.md)."""

import numpy as np

from jaxloops.measure.timing import paired_ratio


def serial_ratio(samples: dict[str, list[float]]) -> float:
    """The median over rounds of the streamed feed's time over h + d in the same round."""
    serial = [h + d for h, d in zip(samples["host_alone"], samples["on_device"], strict=True)]
    return float(paired_ratio(samples["streamed"], serial))


def feed_failures(samples: dict[str, list[float]], steps: int, band: float) -> list[str]:
    """What the timed feeds (`time_feeds`' samples, `steps` steps a call) contradict, each
    with its figures; empty when nothing does.

    The streamed feed must be within `band` (a fraction) of h + d: the median over rounds of
    its time over host_alone's plus on_device's in the same round, so that a slow moment of
    a shared machine divides out. The prefetched one (median) is held to what overlap can do
    at all, between full overlap, max(h, d), and none, h + d, widened by `band`: its own
    prediction rests on core shares measured before and after the rounds, not during them.
    """
    if steps < 1 or not 0 <= band < 1:
        raise ValueError(f"need steps >= 1 and 0 <= band < 1, got steps={steps}, band={band}")
    serial = serial_ratio(samples)
    h, d = (float(np.median(samples[name])) / steps for name in ("host_alone", "on_device"))
    prefetched = float(np.median(samples["prefetched"])) / steps
    failures = []
    if abs(serial - 1) > band:
        failures.append(f"streamed: {serial:.2f} times h + d, in the same rounds")
    low, high = (1 - band) * max(h, d), (1 + band) * (h + d)
    if not low <= prefetched <= high:
        failures.append(
            f"prefetched: measured {1e3 * prefetched:.2f} ms, outside "
            f"[{1e3 * low:.2f}, {1e3 * high:.2f}] ms (h = {1e3 * h:.2f}, d = {1e3 * d:.2f})"
        )
    return failures
