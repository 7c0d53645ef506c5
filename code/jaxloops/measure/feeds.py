"""Chapter 15's instruments: the prefetch experiment's feeds timed in turn beside the core
shares, a loop's time per step split into its phases, the device's idle share of a trace,
and each feed's predicted seconds per step."""

import dataclasses
import statistics
import time

import jax

from jaxloops.measure.profile import busy_seconds
from jaxloops.measure.throughput import core_shares, predicted_step_seconds
from jaxloops.measure.timing import interleaved_samples


def step_phases(step, params, opt_state, batches, steps: int) -> dict[str, float]:
    """Where each step of a loop that reads its loss every step spends its time: the mean
    seconds, over `steps` steps of the jitted `step` fed from the iterable `batches` (after
    one untimed step, which may compile), of "wait" (taking the next batch until it is on
    the device), "dispatch" (the jitted call, until it returns) and "compute" (from then
    until the loss is ready). Means, so that the three add up to the mean step, as the
    per-step times of a timed run of steps are."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    jitted, batches = jax.jit(step), iter(batches)
    params, opt_state, metrics = jitted(params, opt_state, next(batches))
    float(metrics["loss"])
    phases = {"wait": [], "dispatch": [], "compute": []}
    for _ in range(steps):
        start = time.perf_counter()
        batch = jax.block_until_ready(next(batches))
        taken = time.perf_counter()
        params, opt_state, metrics = jitted(params, opt_state, batch)
        dispatched = time.perf_counter()
        float(metrics["loss"])
        done = time.perf_counter()
        phases["wait"].append(taken - start)
        phases["dispatch"].append(dispatched - taken)
        phases["compute"].append(done - dispatched)
    return {name: statistics.fmean(seconds) for name, seconds in phases.items()}


def idle_share(spans) -> float:
    """Share of a trace's length during which no span of the "device" row was open."""
    if not spans:
        raise ValueError("no spans: the trace recorded nothing")
    length = max(span.end for span in spans) - min(span.start for span in spans)
    return 1.0 - busy_seconds(spans, "device") / length


def predicted_feed_seconds(
    host: float, device: float, steps: int, host_share: float, device_share: float
) -> dict[str, float]:
    """Seconds per step of each feed over `steps` steps, for host work h per batch and device
    work d per step (each timed alone), at the shares of their speed they keep beside each
    other (`measure.core_shares`). Streamed, the loop makes a batch, then waits for its step:
    h + d. Prefetched, the first batch is made before the first step; after it the threads
    make batch t + 1 while step t runs (chapter 6's `predicted_step_seconds` without fetches).
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if host < 0 or device < 0 or host_share <= 0 or device_share <= 0:
        raise ValueError(f"need h, d >= 0 s and shares > 0, got h={host}, d={device}, "
                         f"shares {host_share}, {device_share}")  # fmt: skip
    overlapped = predicted_step_seconds(host, device, 1, host_share, device_share)["never fetch"]
    return {
        "on_device": device,
        "streamed": host + device,
        "prefetched": (host + device + (steps - 1) * overlapped) / steps,
    }


def time_feeds(runs, device_work, *, rounds: int):
    """Seconds of every timed call of each feed of `runs` (a `streaming.Feeds`), the feeds
    in turn, `rounds` times (`interleaved_samples`), and the core shares
    (`core_shares(device_work)`), the mean of one measurement before the rounds and one after."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    named = {field.name: getattr(runs, field.name) for field in dataclasses.fields(runs)}
    jax.block_until_ready(device_work())  # compiled first: core_shares sizes its loops by it
    before = core_shares(device_work, tries=2)
    samples = interleaved_samples(named, rounds, warmup_each=0)
    after = core_shares(device_work, tries=2)
    return samples, tuple((a + b) / 2 for a, b in zip(before, after))
