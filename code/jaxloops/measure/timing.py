"""Honest timing, by one rule; and a compile counter.

The timing rule, for every figure the book publishes:
- A sample is one call, timed from its dispatch until `block_until_ready` returns, after
  warm-up calls that absorb compilation. A sample should last at least a millisecond
  (MIN_SAMPLE_SECONDS), ten dispatches' worth (chapter 1 measures one): shorter work is put
  in one call (a scanned epoch of steps, a decode call of several steps), so that a call's
  fixed cost is small against what it measures; where it cannot be (a GPU kernel of tens of
  microseconds), a sample is several calls queued back to back (`queued`,
  `calls_per_sample`) and is reported per call.
- Samples of the things compared are interleaved: each round times every run once, in
  turn, so that a busy moment of a shared machine hits all of them (`interleaved_samples`).
- A measured time is the median of its samples (`time_call`, `interleaved_seconds`).
- A ceiling, the rate no program beats, is the best of its samples (`roofline`): a busy
  moment only slows a call down, so the fastest sample is the least disturbed.
"""

import contextlib
import dataclasses
import json
import math
import os
import pathlib
import statistics
import subprocess
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxloops import processes
from jaxloops import sizes as sizes_module

# The event JAX records once per XLA compilation (jax/_src/dispatch.py).
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
MIN_SAMPLE_SECONDS = 1e-3  # the rule's shortest sample


def queued(run: Callable[[], Any], calls: int) -> Callable[[], Any]:
    """`calls` calls of `run` dispatched back to back, returning the last one's result: one
    sample of work too short to time alone (the device, not Python, sets the pace)."""
    if calls < 1:
        raise ValueError(f"need calls >= 1, got {calls}")

    def many():
        out = None
        for _ in range(calls):
            out = run()
        return out

    return many


def _seconds(run: Callable[[], Any]) -> float:
    start = time.perf_counter()
    jax.block_until_ready(run())
    return time.perf_counter() - start


def calls_per_sample(run: Callable[[], Any], min_seconds: float, max_calls: int = 4096) -> int:
    """How many calls of `run`, `queued`, make a sample of at least `min_seconds`: doubled
    until the shorter of two tries lasts that long (one slow moment cannot end the doubling
    early), then once more, so that a faster moment later still leaves samples above it."""
    if min_seconds <= 0 or max_calls < 1:
        raise ValueError(f"need min_seconds > 0 and max_calls >= 1, got {min_seconds}, {max_calls}")
    jax.block_until_ready(run())  # compiled and warm
    calls = 1
    while calls < max_calls and min(_seconds(queued(run, calls)) for _ in range(2)) < min_seconds:
        calls *= 2
    return min(2 * calls, max_calls)


def _warm_up(fn, args, warmup: int, repeats: int) -> None:
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats=}, {warmup=}")
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))


def time_call(fn: Callable[..., Any], *args, warmup: int = 2, repeats: int = 7) -> float:
    """Median wall time of `fn(*args)` in seconds, waiting for the result each time: the
    timing rule (module docstring) for one run, after `warmup` untimed calls."""
    _warm_up(fn, args, warmup, repeats)
    samples = interleaved_samples({"fn": lambda: fn(*args)}, repeats, warmup_each=0, compile=False)
    return statistics.median(samples["fn"])


def time_dispatch(fn: Callable[..., Any], *args, warmup: int = 2, repeats: int = 7) -> float:
    """Median seconds until `fn(*args)` *returns*, without waiting for its result.

    JAX dispatches asynchronously: the call returns once the work is queued. The result is
    awaited between repeats (outside the clock) so the queue starts empty each time.
    """
    _warm_up(fn, args, warmup, repeats)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn(*args)
        times.append(time.perf_counter() - start)
        jax.block_until_ready(out)
    return statistics.median(times)


@dataclasses.dataclass
class CompileLog:
    """Names of the functions XLA compiled while the log was open, and how long each took."""

    names: list[str] = dataclasses.field(default_factory=list)
    seconds: list[float] = dataclasses.field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.names)

    def seconds_of(self, name: str) -> float:
        """Total XLA compile seconds of the programs called `name`, e.g. "jit(epochs)"."""
        return sum(s for n, s in zip(self.names, self.seconds) if n == name)


@contextlib.contextmanager
def count_compiles():
    """Counts XLA compilations inside the `with` block, from JAX's monitoring events.

    A program loaded from the persistent compilation cache counts too: JAX's event times
    `compile_or_get_cached`, a compilation or a load.

    Yields:
      A `CompileLog`; `log.count` is the number of compilations so far.
    """
    log = CompileLog()

    def listener(event: str, duration: float, **kwargs) -> None:
        if event == _COMPILE_EVENT:
            log.names.append(str(kwargs.get("fun_name", "?")))
            log.seconds.append(float(duration))

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield log
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


def allocated_bytes(tree) -> int:
    """Bytes the device buffers of every array in `tree` really occupy."""
    return sum(
        shard.data.on_device_size_in_bytes()
        for leaf in jax.tree.leaves(tree)
        for shard in leaf.addressable_shards
    )


def laid_out_bytes(shape, dtype, layout) -> int:
    """Bytes of an array of `shape` and `dtype` as `layout` (a `jax.Layout`: an array's
    `.format.layout`, or a compiled program's `input_formats`) lays it out on its device.

    The dims are taken in the layout's major-to-minor order and the minor-most ones padded to
    a multiple of its first tile: a TPU stores float32 in tiles of (8, 128) (sublanes by
    lanes; the compiler picks smaller ones, such as (4, 128), for small arrays), so a
    (5, 7, 11, 9) array with 7 and 11 minor-most holds 5 x 9 x 8 x 128 elements. A layout
    without tiles (a CPU's) holds the shape's bytes.
    """
    dims = [shape[d] for d in layout.major_to_minor] if layout.major_to_minor else list(shape)
    for tile in (layout.tiling or ())[:1]:  # later tiles subdivide the first: no more padding
        dims = [1] * max(len(tile) - len(dims), 0) + dims  # a tile longer than the rank
        for i, t in zip(range(len(dims) - len(tile), len(dims)), tile):
            dims[i] = -(-dims[i] // t) * t if t > 0 else dims[i]
    bits = layout.sub_byte_element_size_in_bits or 8 * jnp.dtype(dtype).itemsize
    return -(-math.prod(dims) * bits // 8)


def compile_in_fresh_process(cache_dir: str | os.PathLike | None, sizes=None) -> float:
    """Seconds a new Python process takes to trace, lower and compile the book's training
    program (`jaxloops.workers.cache_probe`), with JAX's persistent compilation cache in
    `cache_dir` (None: no cache).

    Every compilation is cached (the minimum compile time to cache is set to 0 s); a second
    process with the same `cache_dir` loads the executable instead of compiling it. The
    process runs on this process's default backend where a second process can open it (on a
    TPU, whose chip this process holds, on the CPU: `processes.device_env`), at `sizes` (a
    `LoopSizes`; default: `experiment_sizes().loop` of this process).
    """
    sizes = sizes_module.experiment_sizes().loop if sizes is None else sizes
    env = processes.device_env()
    env = {k: v for k, v in env.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    if cache_dir is not None:
        env["JAX_COMPILATION_CACHE_DIR"] = str(cache_dir)
        env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
        env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
    probe = processes.command("cache_probe", "--sizes", processes.sizes_json(loop=sizes))
    done = subprocess.run(probe, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the compile probe failed:\n{done.stderr[-2000:]}")
    return float(json.loads(done.stdout.strip().splitlines()[-1])["seconds"])


def callback_cache_counts(cache_dir: str | os.PathLike) -> dict[str, dict[str, int]]:
    """What JAX's persistent cache (in `cache_dir`) counted for a program with a host
    callback and the same program without one, each compiled in a new process
    (`jaxloops.workers.cache_probe --callback`): {"callback": {"requests", "hits",
    "writes"}, "plain": {...}}. Run twice on one folder, the plain program is loaded the
    second time; the callback program is requested and compiled each time, never stored."""
    env = {k: v for k, v in processes.device_env().items() if not k.startswith("JAX_COMPIL")}
    env["JAX_COMPILATION_CACHE_DIR"] = str(cache_dir)
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
    probe = processes.command("cache_probe", "--callback")
    done = subprocess.run(probe, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the callback probe failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


_BUILD = pathlib.Path(__file__).resolve().parents[3] / "_build"  # in a checkout of the book


def suite_cache_report(
    report_dir: str | os.PathLike = _BUILD / "test-cache-report",
    cache_dir: str | os.PathLike = _BUILD / "jax-cache",
) -> dict | None:
    """What the persistent cache did in the last `make test`, summed over its processes:
    requests (compiles that may use the cache), hits (loaded from it), writes (compiled, then
    stored), and entries (programs in `cache_dir` now). None where no test run left a report
    (tests/conftest.py writes one JSON file per process into `report_dir`).
    """
    reports = sorted(pathlib.Path(report_dir).glob("*.json"))
    if not reports:
        return None
    total = {"requests": 0, "hits": 0, "writes": 0}
    for path in reports:
        counts = json.loads(path.read_text())
        if set(counts) != set(total):
            raise ValueError(f"{path} has counts {sorted(counts)}, expected {sorted(total)}")
        for name in total:
            total[name] += counts[name]
    entries = pathlib.Path(cache_dir).glob("*-cache")
    return {**total, "processes": len(reports), "entries": sum(1 for _ in entries)}


def interleaved_samples(
    runs: dict[str, Callable[[], Any]], rounds: int, *, warmup_each: int = 1, compile: bool = True
) -> dict[str, list[float]]:
    """Every timed call of each run, the runs taken in turn within each of `rounds` rounds.

    Taking turns exposes every run to the same busy moments of a shared machine. Before each
    timed call, `warmup_each` untimed calls of the same run: otherwise a run pays for the
    state the run before it left behind (caches, TLB, memory, idle cores). At T = S = 4096
    on the 2-core CPU, blockwise attention timed straight after naive attention, which
    writes 1 GiB of scores, took 15-40 % longer than after a call of its own. `compile`:
    call each run once first, untimed.

    Returns:
      {name: [seconds of each timed call, in round order]}.
    """
    if rounds < 1 or warmup_each < 0:
        raise ValueError(f"need rounds >= 1 and warmup_each >= 0, got {rounds}, {warmup_each}")
    for run in runs.values() if compile else ():
        jax.block_until_ready(run())
    samples = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            for _ in range(warmup_each):
                jax.block_until_ready(run())
            samples[name].append(_seconds(run))
    return samples


def paired_ratio(a: list[float], b: list[float]) -> float:
    """Median over rounds of a's time over b's in the same round (two runs' lists from
    `interleaved_samples`): a slow moment of a shared machine, which lasts longer than a
    round, divides out of each ratio."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired samples need the same length, at least 1: {len(a)}, {len(b)}")
    return statistics.median(x / y for x, y in zip(a, b))


def paired_spread(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """a's time over b's, round by round (two runs' lists from `interleaved_samples`): the
    median (`paired_ratio`), the least and the most of the rounds."""
    rounds = [x / y for x, y in zip(a, b)]
    return paired_ratio(a, b), min(rounds), max(rounds)


def worst_paired_ratio(a: list[float], b: list[float]) -> float:
    """The largest over rounds of a's time over b's in the same round: the worst of the
    paired rounds, reported beside the rule's count (`faster_rounds`)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired samples need the same length, at least 1: {len(a)}, {len(b)}")
    return max(x / y for x, y in zip(a, b))


# The book's one rule for a claim that one program is faster than another (its sign test):
# the faster one must win at least `rounds_needed(n)` of n paired rounds, the fewest wins a
# fair coin reaches less than once in 100 tries. One disturbed round on a shared machine
# cannot fail it; a program that is not faster fails it 99 times in 100.
CLAIM_LEVEL = 0.01


def rounds_needed(rounds: int, level: float = CLAIM_LEVEL) -> int:
    """The fewest wins out of `rounds` paired rounds that a fair coin reaches with probability
    below `level` (a one-sided sign test)."""
    tail = 0.0
    for wins in range(rounds, -1, -1):
        tail += math.comb(rounds, wins) / 2**rounds  # P(at least `wins` heads)
        if tail >= level:
            if wins == rounds:
                raise ValueError(
                    f"{rounds} paired rounds cannot show a difference at the level {level}: "
                    f"even {rounds} wins of {rounds} happen by chance {tail:.3f} of the time"
                )
            return wins + 1
    raise ValueError(f"rounds must be at least 1: {rounds}")


def paired_wins(fast: list[float], slow: list[float]) -> int:
    """The rounds in which `fast` took less time than `slow` (two runs' lists of
    `interleaved_samples`)."""
    if len(fast) != len(slow) or not fast:
        raise ValueError(
            f"paired samples need the same length, at least 1: {len(fast)}, {len(slow)}"
        )
    return sum(x < y for x, y in zip(fast, slow))


def faster_rounds(fast: list[float], slow: list[float]) -> tuple[int, int]:
    """(the rounds `fast` won, `paired_wins`, and the rounds needed for the claim that it is
    faster, `rounds_needed`)."""
    return paired_wins(fast, slow), rounds_needed(len(fast))


def interleaved_seconds(runs: dict[str, Callable[[], Any]], rounds: int) -> dict[str, float]:
    """Median of `rounds` timed calls of each run, taken in turn (`interleaved_samples`
    without untimed calls between turns: its callers compare whole training runs of one
    kind, which leave each other the same machine)."""
    samples = interleaved_samples(runs, rounds, warmup_each=0)
    return {name: statistics.median(seconds) for name, seconds in samples.items()}
