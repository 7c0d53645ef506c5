"""Measuring training loops: ways to drive the same step, host/device overlap, steps/s."""

import hashlib
import os
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxloops.data import Batch, epoch_batches
from jaxloops.loop import fit, make_epoch, python_loop, unstack
from jaxloops.measure.compiled import lowered_flops
from jaxloops.measure.profile import HOST_WORK
from jaxloops.measure.roofline import CEILING_MARGIN, samples_beside_ceiling
from jaxloops.measure.timing import interleaved_samples, paired_ratio, time_call, time_dispatch


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
    lowered = jax.jit(make_epoch(train_step)).lower(params, opt_state, batches)
    compiled = lowered.compile()
    return compiled, lowered_flops(lowered, compiled)


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


def _layer_matmul(params, batch_size: int, copies: int = 8):
    """The offending epoch's own kind of work as a ceiling sample: its largest layer's
    (B, F_in) @ (F_in, F_out) float32 matmul, `copies` of it in one call (a sample must be
    long). Returns (`() -> result`, FLOPs of one call)."""
    w = max((leaf for leaf in jax.tree.leaves(params) if leaf.ndim == 2), key=lambda a: a.size)
    x = jnp.ones((copies, batch_size, w.shape[0]), jnp.float32)  # (copies, B, F_in)
    matmul = jax.jit(lambda x, w: jnp.matmul(x, w, precision=jax.lax.Precision.HIGHEST))
    return (lambda: matmul(x, w)), 2.0 * copies * batch_size * w.shape[0] * w.shape[1]


def scan_throughputs(epochs: dict, *, rounds: int, tries: int = 3):
    """Each scanned epoch's throughput, judged against a matmul ceiling sampled beside it.

    Every round times each epoch once and the roofline's matmul once, in turn; a rate is
    the median of its epoch's samples, and the matmul samples raise the build's roofline.
    An epoch whose rate still beats the ceiling (by more than CEILING_MARGIN) is measured
    again, up to `tries` times in all, beside the roofline's matmul and a matmul of its own
    kind (its largest layer at its batch size), whose samples raise the ceiling too: a rate
    above the ceiling means the ceiling was sampled at a bad moment, or with a matmul less
    suited to the machine than the program's own.

    Args:
      epochs: {label: (train_step, params, opt_state, batches)}, batches (steps, B, ...).
    Returns:
      ({label: row of `scan_throughput`'s keys}, the raised Roofline).
    """
    if rounds < 1 or tries < 1:
        raise ValueError(f"need rounds >= 1 and tries >= 1, got {rounds}, {tries}")
    runs, flops, rows, own_kind = {}, {}, {}, {}
    for label, (step, params, opt_state, batches) in epochs.items():
        compiled, flops[label] = _compiled_epoch(step, params, opt_state, batches)
        runs[label] = lambda c=compiled, a=(params, opt_state, batches): c(*a)
    for _ in range(tries):
        samples, roof = samples_beside_ceiling(runs, rounds, matmuls=own_kind)
        for label in runs:
            seconds = statistics.median(samples[label])
            rows[label] = _throughput_row(epochs[label][3], flops[label], seconds)
        limit = (1 + CEILING_MARGIN) * roof.flops_per_s
        runs = {label: run for label, run in runs.items() if rows[label]["flops_per_s"] > limit}
        for label in runs:  # the offending epoch's own kind of work joins the ceiling's samples
            own_kind[f"ceiling: {label}"] = _layer_matmul(
                epochs[label][1], rows[label]["batch_size"]
            )
        if not runs:
            break
    return rows, roof


def _spin(n: int) -> float:
    """Seconds a fixed CPU-bound Python loop of n additions takes: host work that needs a core."""
    start, total = time.perf_counter(), 0
    for i in range(n):
        total += i
    return time.perf_counter() - start


def _spin_beside(out, n: int) -> tuple[float, float]:
    """Runs `_spin(n)` in chunks while `out` computes: (seconds of the loop, seconds until
    `out` was ready, or until the loop ended if it was not ready yet)."""
    start, ready = time.perf_counter(), None
    for _ in range(max(1, n // 1000)):
        _spin(1000)
        if ready is None and all(leaf.is_ready() for leaf in jax.tree.leaves(out)):
            ready = time.perf_counter() - start
    spun = time.perf_counter() - start
    jax.block_until_ready(out)
    return spun, spun if ready is None else ready


def _hash_seconds(chunks: int, start: threading.Barrier | None = None) -> float:
    """Seconds to SHA-256 `chunks` times a 256 KiB buffer: CPU-bound work that releases the
    GIL (hashlib does for large inputs), so threads of it run on as many cores as they get."""
    buffer, digest = bytes(2**18), hashlib.sha256()
    if start is not None:
        start.wait()
    begin = time.perf_counter()
    for _ in range(chunks):
        digest.update(buffer)
    return time.perf_counter() - begin


def offered_cores(alone: float, beside: list[float]) -> float:
    """Cores a CPU-bound job got: each of len(beside) copies run at once took beside[i]
    seconds for work that took `alone` seconds by itself; their speeds relative to alone,
    each at most 1, summed."""
    if alone <= 0 or not beside or min(beside) <= 0:
        raise ValueError(f"times must be positive: alone {alone}, beside {beside}")
    return sum(min(alone / t, 1.0) for t in beside)


# What `free_cores` reads on a 2-core machine with both cores free (idle: about 2.0; one core
# kept busy: 1.05 to 1.6): the condition of the goals chapters 9 and 11 check.
TWO_FREE_CORES = 1.8


def free_cores(seconds: float = 0.2, tries: int = 3) -> float:
    """How many of this machine's cores a CPU-bound job gets now: 0 to `os.cpu_count()`.

    The same work (`_hash_seconds`, about `seconds` long) is timed on one thread alone, then
    on one thread per core all at once; `offered_cores` of the two; the median of `tries`.
    Two idle cores give about 2. With another process keeping one of two busy, three
    threads share two cores: 1.33 if the three shared evenly; 1.4 to 1.6 measured on this
    book's 2-core machine, and about 1.05 in a notebook beside a busy core.
    """
    if seconds <= 0 or tries < 1:
        raise ValueError(f"seconds must be > 0 and tries >= 1, got {seconds}, {tries}")
    cores = os.cpu_count() or 1
    per_chunk = _hash_seconds(8) / 8
    chunks = max(1, round(seconds / per_chunk))
    offered = []
    for _ in range(tries):
        alone = _hash_seconds(chunks)
        start, beside = threading.Barrier(cores), [0.0] * cores

        def run(i, start=start, beside=beside):
            beside[i] = _hash_seconds(chunks, start)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(cores)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        offered.append(offered_cores(alone, beside))
    return statistics.median(offered)


def core_shares(device_work: Callable[[], Any], *, tries: int = 5) -> tuple[float, float]:
    """How fast host work and device work run beside each other, now: (host share, device
    share), each 0 (stopped) to 1 (as fast as alone).

    A fixed CPU-bound Python loop is timed alone and while `device_work()` (arrays, dispatched,
    not awaited) runs; the device work is timed alone and while a longer loop
    runs; `tries` times in turn. Each share is the median time alone over the median time
    beside the other, at most 1. On a GPU the device share stays near 1; on a CPU backend,
    whose "device" is the processor, both drop when there is no free core.
    """
    if tries < 1:
        raise ValueError(f"tries must be >= 1, got {tries}")
    jax.block_until_ready(device_work())  # compiles: not part of the work's time
    start = time.perf_counter()
    jax.block_until_ready(device_work())
    work_s = time.perf_counter() - start
    short, long = spin_iterations(work_s / 3), spin_iterations(3 * work_s)
    times = {"host alone": [], "host beside": [], "device alone": [], "device beside": []}
    for _ in range(tries):
        times["host alone"].append(_spin(short))
        times["host beside"].append(_spin_beside(device_work(), short)[0])
        start = time.perf_counter()
        jax.block_until_ready(device_work())
        times["device alone"].append(time.perf_counter() - start)
        times["device beside"].append(_spin_beside(device_work(), long)[1])
    median = {name: statistics.median(seconds) for name, seconds in times.items()}
    return tuple(min(median[f"{w} alone"] / median[f"{w} beside"], 1.0) for w in ("host", "device"))


def interleaved_with_core_shares(
    runs: dict, device_work: Callable[[], Any], rounds: int
) -> tuple[dict[str, list[float]], tuple[float, float]]:
    """Every timed call of each run over `rounds` rounds taken in turn (`interleaved_samples`,
    in round order), and the mean `core_shares(device_work)` measured before each round:
    what the machine offered while the runs were timed."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    samples, shares = {name: [] for name in runs}, []
    for i in range(rounds):
        shares.append(core_shares(device_work, tries=3))
        for name, seconds in interleaved_samples(runs, 1, warmup_each=0, compile=i == 0).items():
            samples[name] += seconds
    return samples, tuple(statistics.fmean(column) for column in zip(*shares))


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
    with no per-step host work. Three controls: the jitted step driven from Python with no
    host work, with a fetch every step (a fed step, its wait for the result and the next
    launch included) and with none (the device's work of a fed step, steps queued back to
    back); and the pipeline's host work without a step.
    """
    iterations = spin_iterations(host_seconds)
    as_list = unstack(batches)
    jitted = jax.jit(train_step)
    epoch = jax.jit(make_epoch(train_step))
    fed = lambda log_every: python_loop(
        jitted, params, opt_state, host_pipeline(as_list, iterations), log_every
    )[0]
    alone = lambda log_every: python_loop(jitted, params, opt_state, as_list, log_every)[0]
    return {
        "fetch every step": lambda: fed(1),
        f"fetch every {k} steps": lambda: fed(k),
        "never fetch": lambda: fed(None),
        "scan, data on device": lambda: epoch(params, opt_state, batches)[0],
        "steps alone, fetch every step": lambda: alone(1),
        "steps alone, never fetch": lambda: alone(None),
        "host work alone": lambda: [_spin(iterations) for _ in as_list],
    }


def predicted_step_seconds(
    host: float,
    device: float,
    k: int,
    host_share: float = 1.0,
    device_share: float = 1.0,
    *,
    fetched: float | None = None,
    dispatch: float = 0.0,
) -> dict[str, float]:
    """Seconds per step each fed driver should take, from its parts, each timed alone: host
    work h, the device's work d of a fed step (steps queued, each launch included), the same
    step with a fetch after it, d_f (`fetched`; default d), and the host's call that dispatches
    a step, c (`dispatch`); host and device run at `host_share` and `device_share` of their speed
    beside each other.

    Fetching every step serialises them: h + d_f, where d_f holds the wait for the step, the
    loss's trip to the host and the next launch reaching an idle device. Otherwise the host
    prepares step t+1 (h + c) while the device runs step t (d): both run side by side until
    the first is done, the rest of the other alone; with shares of 1 that is max(h + c, d),
    with no free core (shares that add up to 1) no faster than h + c + d. A fetch every k
    steps loses that gain once per k steps.
    """
    if not (0.0 < host_share <= 1.0 and 0.0 < device_share <= 1.0) or k < 1:
        raise ValueError(f"need shares in (0, 1] and k >= 1, got {host_share}, {device_share}, {k}")
    if dispatch < 0 or (fetched is not None and fetched <= 0):
        raise ValueError(f"need dispatch >= 0 and fetched > 0, got {dispatch}, {fetched}")
    busy = host + dispatch  # the host's part of a step it does not wait for
    side_by_side = min(busy / host_share, device / device_share)
    host_left = busy - host_share * side_by_side
    device_left = device - device_share * side_by_side
    never = side_by_side + host_left + device_left  # at most one of the two is left
    every = host + (device if fetched is None else fetched)
    return {
        "fetch every step": every,
        f"fetch every {k} steps": never + (every - never) / k,
        "never fetch": never,
    }


# Taking turns is told from overlap only where overlap would save at least this share of h + d.
TURNS_SEPARATION = 0.2


def turns_verdict(
    every: float, host: float, fetched: float, cores: float, band: float, overlapped: float
):
    """Fetching every step (`every` s per step) against h + d_f, host work and a fed step
    with its fetch (`fetched`) one after the other: (the claims it contradicts,
    the sentence that says what was checked).

    Taking turns, a step takes h + d_f and no less; overlapping, it would take `overlapped`
    (`predicted_step_seconds`' "never fetch", from the shares the cores offered). The rule:
    a step took turns when it sits nearer h + d_f than `overlapped`, at least their midpoint,
    checked wherever overlap would save at least `TURNS_SEPARATION` of h + d_f (elsewhere the
    two cannot be told apart, and the sentence says so). What a step takes above h + d_f is
    the hand-off between host and device, which another process on the cores lengthens (a
    fresh-clone CI build, with the tests beside it, read 1.50): at most (1 + band)(h + d_f)
    is checked only with two cores free.
    """
    if min(every, host, fetched, overlapped) <= 0 or not 0 < band < 1:
        raise ValueError(
            f"need positive times and 0 < band < 1, got {every}, {host}, {fetched}, "
            f"{overlapped}, {band}"
        )
    turns, overlap = every / (host + fetched), overlapped / (host + fetched)
    floor = (1 + overlap) / 2
    failed = []
    told_apart = 1 - overlap >= TURNS_SEPARATION
    if told_apart and turns < floor:
        failed.append(
            f"a step overlapped: {turns:.2f}x h + d_f, nearer the overlapped "
            f"{overlap:.2f} than 1 (floor {floor:.2f})"
        )
    two_free = cores >= TWO_FREE_CORES
    if two_free and turns > 1 + band:
        failed.append(f"a step took {turns:.2f}x h + d_f > {1 + band}, {cores:.2f} cores free")
    lower = (
        f"below {floor:.2f} × (h + d_f), midway to the {overlap:.2f} × (h + d_f) overlap would take"
    )
    upper = f"above {1 + band:.1f} × (h + d_f)"
    unchecked = []
    if not told_apart:
        unchecked.append(
            f"it cannot tell taking turns from overlap here: overlap would take "
            f"{overlap:.2f} × (h + d_f), too close to h + d_f"
        )
    if not two_free:
        unchecked.append(
            f"it holds a step {upper} to account only on a build with two cores free, and this "
            f"one found {cores:.2f}: the hand-off then waits for a core"
        )
    checked = [text for text, on in ((upper, two_free), (lower, told_apart)) if on]
    sentence = f"if a step took {' or '.join(checked)}" if checked else "on neither side here"
    if unchecked:
        sentence += "; " + "; ".join(unchecked)
    return failed, sentence


def fit_against_bare_epoch(
    key, params, opt_state, train_step, data: Batch, *, batch_size: int, epochs: int, rounds: int
) -> dict[str, float]:
    """Seconds of `fit`, of the same jitted epoch driven directly from Python (reshuffling
    included), and of a Python loop of the jitted step (`python_loop`, never fetching, over
    the same epochs' batches split beforehand, outside the clock), each compiled beforehand
    (median of `rounds`, taken in turn); "bare_over_fit" and "python_over_fit": the median
    over rounds of that run's time over fit's in the round; "dispatch": seconds until one
    call of the jitted step returns (`time_dispatch`), the Python loop's cost per step where
    the device is faster than the host.

    All start from fresh copies of `params` and `opt_state` (fit donates what it is given).
    """
    copies = lambda: jax.tree.map(jnp.copy, (params, opt_state))
    epoch = jax.jit(make_epoch(train_step), donate_argnums=(0, 1))
    step = jax.jit(train_step, donate_argnums=(0, 1))
    # each epoch's batches, reshuffled: (steps, B, ...)
    shuffled = lambda e: epoch_batches(jax.random.fold_in(key, e), data, batch_size)
    one_by_one = [batch for e in range(epochs) for batch in unstack(shuffled(e))]

    def bare():
        p, s = copies()
        for e in range(epochs):
            p, s, _ = epoch(p, s, shuffled(e))
        return p

    def through_fit():
        return fit(key, *copies(), train_step, data, batch_size=batch_size, epochs=epochs)[0]

    def loop():
        return python_loop(step, *copies(), one_by_one, log_every=None)[0]

    runs = {"fit": through_fit, "bare epoch": bare, "python loop": loop}
    samples = interleaved_samples(runs, rounds)
    seconds = {name: statistics.median(times) for name, times in samples.items()}
    seconds["bare_over_fit"] = paired_ratio(samples["bare epoch"], samples["fit"])
    seconds["python_over_fit"] = paired_ratio(samples["python loop"], samples["fit"])
    seconds["steps"] = epochs * (data.x.shape[0] // batch_size)
    seconds["dispatch"] = time_dispatch(
        jax.jit(train_step), *copies(), one_by_one[0], repeats=max(rounds, 7)
    )
    return seconds


def validation_hook_speed(sizes, rounds: int = 15) -> float:
    """Chapter 7's hook experiment, for `make bench`: `fit` of the digits MLP at `sizes` (a
    `LoopSizes`) with a validation hook every `sizes.validate_every` epochs, against `fit`
    with no hook (all epochs in one call), from the same initial state, taken in turn over
    `rounds` rounds. Returns the speed with the hook as a share of the speed without (the
    median of the rounds' ratios), the figure chapter 7's goal is set on."""
    import jaxloops
    from jaxloops.validation import validation_metrics

    split = jaxloops.load_digits_split(seed=0, validation_fraction=sizes.validation_fraction)
    train, held_out = jaxloops.to_device(split.train), jaxloops.to_device(split.validation)
    init_key, fit_key = jax.random.split(jax.random.key(0))
    optimizer = jaxloops.make_optimizer(sizes.learning_rate, sizes.weight_decay)
    train_step = jaxloops.make_train_step(jaxloops.mlp_loss, optimizer)
    val_metrics = validation_metrics(jaxloops.mlp_loss, held_out)

    def run(**kw):
        params = jaxloops.init_mlp(init_key, sizes.widths)
        state = fit(fit_key, params, optimizer.init(params), train_step, train,
                    batch_size=sizes.batch_size, epochs=sizes.epochs, **kw)  # fmt: skip
        return jax.block_until_ready(state[0])

    samples = interleaved_samples(
        {
            "no hook": run,
            "validation hook": lambda: run(
                epochs_per_call=sizes.validate_every, hook=lambda epoch, p, s: val_metrics(p)
            ),
        },
        rounds,
        warmup_each=0,
    )
    return paired_ratio(samples["no hook"], samples["validation hook"])
