"""Measuring training loops: ways to drive the same step, host/device overlap, steps/s."""

import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxloops.data import Batch, epoch_batches
from jaxloops.loop import fit, make_epoch, python_loop, unstack
from jaxloops.measure.profile import HOST_WORK
from jaxloops.measure.roofline import (
    CEILING_MARGIN,
    MATMUL,
    ceiling_rates,
    ceiling_runs,
    raise_roofline,
    roofline,
)
from jaxloops.measure.timing import interleaved_samples, interleaved_seconds, time_call


def random_batches(
    key: jax.Array, steps: int, batch_size: int, num_features: int, num_classes: int
) -> Batch:
    """Synthetic batches (steps, B, F_in) / (steps, B): throughput does not depend on the values."""
    x_key, y_key = jax.random.split(key)
    x = jax.random.normal(x_key, (steps, batch_size, num_features))
    y = jax.random.randint(y_key, (steps, batch_size), 0, num_classes)
    return Batch(x, y)


def _compiled_epoch(train_step, params, opt_state, batches: Batch):
    """The scanned epoch, compiled, and its FLOPs per step from XLA's cost analysis (which
    counts a loop body once: the epoch's count is one step's, a test checks it)."""
    compiled = jax.jit(make_epoch(train_step)).lower(params, opt_state, batches).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return compiled, float(cost["flops"])


def _throughput_row(batches: Batch, flops_per_step: float, seconds: float) -> dict[str, float]:
    steps, batch_size = batches.x.shape[:2]
    return {
        "batch_size": int(batch_size),
        "steps_per_s": steps / seconds,
        "examples_per_s": steps * batch_size / seconds,
        "flops_per_step": flops_per_step,
        "flops_per_s": flops_per_step * steps / seconds,
    }


def scan_throughput(
    train_step, params, opt_state, batches: Batch, repeats: int
) -> dict[str, float]:
    """Steps/s and FLOP/s of the scanned epoch, compiled once (median of `repeats` calls)."""
    compiled, flops_per_step = _compiled_epoch(train_step, params, opt_state, batches)
    seconds = time_call(compiled, params, opt_state, batches, repeats=repeats)
    return _throughput_row(batches, flops_per_step, seconds)


def scan_throughputs(epochs: dict, *, rounds: int, tries: int = 3):
    """Each scanned epoch's throughput, judged against a matmul ceiling sampled beside it.

    Every round times each epoch once and the roofline's matmul once, in turn; a rate is
    the median of its epoch's samples, and the matmul samples raise the build's roofline.
    An epoch whose rate still beats the ceiling (by more than CEILING_MARGIN) is measured
    again with the matmul, up to `tries` times in all: a rate above the ceiling means the
    ceiling was sampled at a bad moment.

    Args:
      epochs: {label: (train_step, params, opt_state, batches)}, batches (steps, B, ...).
    Returns:
      ({label: row of `scan_throughput`'s keys}, the raised Roofline).
    """
    if rounds < 1 or tries < 1:
        raise ValueError(f"need rounds >= 1 and tries >= 1, got {rounds}, {tries}")
    roof = roofline()
    matmul = ceiling_runs(jax.random.key(1), matmul_size=roof.matmul_size)[MATMUL]
    runs, flops, rows = {}, {}, {}
    for label, (step, params, opt_state, batches) in epochs.items():
        compiled, flops[label] = _compiled_epoch(step, params, opt_state, batches)
        runs[label] = lambda c=compiled, a=(params, opt_state, batches): c(*a)
    for _ in range(tries):
        samples = interleaved_samples({**runs, MATMUL: matmul}, rounds)
        roof = raise_roofline(ceiling_rates(samples, roof.matmul_size)["flops"])
        for label in runs:
            seconds = statistics.median(samples[label])
            rows[label] = _throughput_row(epochs[label][3], flops[label], seconds)
        limit = (1 + CEILING_MARGIN) * roof.flops_per_s
        runs = {label: run for label, run in runs.items() if rows[label]["flops_per_s"] > limit}
        if not runs:
            break
    return rows, roof


def _spin(n: int) -> float:
    """Seconds a fixed CPU-bound Python loop of n additions takes: host work that needs a core."""
    start, total = time.perf_counter(), 0
    for i in range(n):
        total += i
    return time.perf_counter() - start


def free_core_share(device_work: Callable[[], Any], *, tries: int = 5) -> float:
    """How much of a core the host gets while the device works, now: 0 (none) to 1 (all).

    A fixed CPU-bound Python loop is timed alone, then while `device_work()` (dispatched, not
    awaited) runs, `tries` times in turn; the share is the median time alone over the median
    time beside the device, at most 1. The loop is sized to a third of the device work, so
    that it ends before the work does.
    """
    if tries < 1:
        raise ValueError(f"tries must be >= 1, got {tries}")
    start = time.perf_counter()
    jax.block_until_ready(device_work())
    work_s = time.perf_counter() - start
    n = spin_iterations(work_s / 3)
    alone, beside = [], []
    for _ in range(tries):
        alone.append(_spin(n))
        out = device_work()
        beside.append(_spin(n))
        jax.block_until_ready(out)
    return min(statistics.median(alone) / statistics.median(beside), 1.0)


def interleaved_with_free_core(
    runs: dict, device_work: Callable[[], Any], rounds: int
) -> tuple[dict[str, float], float]:
    """Median seconds of each run over `rounds` rounds taken in turn (`interleaved_seconds`),
    and the mean `free_core_share(device_work)` measured before each round: what the
    machine offered while the runs were timed."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    samples, free = {name: [] for name in runs}, []
    for i in range(rounds):
        free.append(free_core_share(device_work))
        for name, seconds in interleaved_samples(runs, 1, warmup_each=0, compile=i == 0).items():
            samples[name] += seconds
    medians = {name: statistics.median(seconds) for name, seconds in samples.items()}
    return medians, statistics.fmean(free)


def spin_iterations(seconds: float) -> int:
    """Iterations of `_spin` that take `seconds` on this machine now (best of three timings)."""
    if seconds <= 0:
        raise ValueError(f"seconds must be > 0, got {seconds}")
    per_iteration = min(_spin(100_000) for _ in range(3)) / 100_000
    return max(1, round(seconds / per_iteration))


def host_pipeline(batches, iterations: int):
    """Yields each batch after a fixed amount of host work, as an input pipeline that reads
    and decodes files would: `iterations` of a CPU-bound Python loop (`spin_iterations`
    sizes it). Like real decoding it needs a core, so it overlaps with the device only as
    far as the machine has one free."""
    for batch in batches:
        with jax.profiler.TraceAnnotation(HOST_WORK):
            _spin(iterations)
        yield batch


def overlap_drivers(train_step, params, opt_state, batches: Batch, host_seconds: float, k: int):
    """The drivers of the overlap experiment, each `() -> final params`, and the host work
    of the pipeline alone.

    Three feed the jitted step from `host_pipeline` (`host_seconds` of work per batch, sized
    now) and fetch the loss every step, every k steps, or never; the scan runs the epoch on
    batches already on the device (the pipeline moved onto the device, as chapter 2 does),
    with no per-step host work. Two controls: the jitted step driven from Python with a fetch
    every step and no host work (the device work of a fed step, its dispatch and fetch
    included), and the pipeline's host work without a step.
    """
    iterations = spin_iterations(host_seconds)
    as_list = unstack(batches)
    jitted = jax.jit(train_step)
    epoch = jax.jit(make_epoch(train_step))
    fed = lambda log_every: python_loop(
        jitted, params, opt_state, host_pipeline(as_list, iterations), log_every
    )[0]
    return {
        "fetch every step": lambda: fed(1),
        f"fetch every {k} steps": lambda: fed(k),
        "never fetch": lambda: fed(None),
        "scan, data on device": lambda: epoch(params, opt_state, batches)[0],
        "steps alone, fetch every step": lambda: python_loop(jitted, params, opt_state, as_list, 1)[
            0
        ],
        "host work alone": lambda: [_spin(iterations) for _ in as_list],
    }


def predicted_step_seconds(host: float, device: float, k: int, overlap: float = 1.0):
    """Seconds per step each fed driver should take, for host work h and device work d,
    when a share `overlap` of the shorter of the two can run beside the other.

    Fetching every step serialises them: h + d. Otherwise the host prepares step t+1 while
    the device runs step t, as far as a free core allows: max(h, d) + (1 - overlap) min(h, d);
    a fetch every k steps drains the queue once per k steps, adding overlap * min(h, d) / k.
    With overlap = 0 (no free core) every driver takes h + d.
    """
    if not 0.0 <= overlap <= 1.0 or k < 1:
        raise ValueError(f"need overlap in [0, 1] and k >= 1, got {overlap}, {k}")
    shorter, never = min(host, device), max(host, device) + (1 - overlap) * min(host, device)
    return {
        "fetch every step": host + device,
        f"fetch every {k} steps": never + overlap * shorter / k,
        "never fetch": never,
    }


def fit_against_bare_epoch(
    key, params, opt_state, train_step, data: Batch, *, batch_size: int, epochs: int, rounds: int
) -> dict[str, float]:
    """Seconds of `fit` and of the same jitted epoch driven directly from Python, reshuffling
    included, each compiled beforehand (median of `rounds`, taken in turn); and a control:
    the bare loop with its reshuffle jitted too, one program per epoch's data instead of
    `epoch_batches` run op by op.

    All start from fresh copies of `params` and `opt_state` (fit donates what it is given).
    """
    copies = lambda: jax.tree.map(jnp.copy, (params, opt_state))
    epoch = jax.jit(make_epoch(train_step), donate_argnums=(0, 1))
    jitted_shuffle = jax.jit(epoch_batches, static_argnums=2)

    def bare(shuffle):
        p, s = copies()
        for e in range(epochs):
            batches = shuffle(jax.random.fold_in(key, e), data, batch_size)  # (steps, B, ...)
            p, s, _ = epoch(p, s, batches)
        return p

    def through_fit():
        return fit(key, *copies(), train_step, data, batch_size=batch_size, epochs=epochs)[0]

    runs = {
        "fit": through_fit,
        "bare epoch": lambda: bare(epoch_batches),
        "bare epoch, reshuffle jitted": lambda: bare(jitted_shuffle),
    }
    seconds = interleaved_seconds(runs, rounds)
    seconds["steps"] = epochs * (data.x.shape[0] // batch_size)
    return seconds
