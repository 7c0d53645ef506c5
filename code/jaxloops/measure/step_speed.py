"""The transformer's train step at a given size: its rate against the roofline, and where its
time goes (chapter 11's last section, and `make bench`).

Sizes are (L, D, N, K, F, T, B), as `LanguageModelSizes.speed` holds them.

Page faults: XLA's CPU runtime takes each call's temporaries from `malloc` and frees them at
its end. glibc serves a block above its mmap threshold (32 MiB at most) with fresh pages from
the kernel, which zeroes each one the first time it is touched: a minor page fault per page.
`page_faults` counts them per call; `rates_in_fresh_process` measures the step in a new
process with one of the `ALLOCATORS`: glibc's defaults, transparent huge pages (2 MiB each),
or memory kept (nothing handed back to the kernel), nothing else changed.
"""

import functools
import json
import os
import pathlib
import platform
import resource
import statistics
import subprocess
import tempfile
import time

import jax
import jax.numpy as jnp

from jaxloops import memory, processes
from jaxloops.attention import attention
from jaxloops.attention import textbook_attention as textbook_attention  # the control, re-exported
from jaxloops.data import Batch
from jaxloops.measure import breakdown
from jaxloops.measure.compiled import lowered_flops
from jaxloops.measure.roofline import ceiling_matmul, roofline, samples_beside_ceiling
from jaxloops.measure.timing import interleaved_samples, paired_ratio, paired_spread
from jaxloops.precision import compute_in
from jaxloops.text import VOCAB_SIZE
from jaxloops.train import make_optimizer, make_train_step
from jaxloops.transformer import TransformerConfig, init_transformer, transformer_loss

PROGRAMS = ("forward", "gradient", "step")
HUGE_PAGES = "glibc.malloc.hugetlb"  # glibc >= 2.35: 1 = malloc madvises transparent huge pages
# The glibc tunables (GLIBC_TUNABLES) of each kind of fresh process.
ALLOCATORS = {
    "4 KiB pages": {HUGE_PAGES: "0"},  # glibc's default
    "huge pages": {HUGE_PAGES: "1"},
    # Nothing handed back: no block mmap'd on its own, the heap never trimmed (below 4 GiB
    # free), one heap for every thread (each thread's own heap is mmap'd and trimmed apart).
    "memory kept": {HUGE_PAGES: "0", "glibc.malloc.mmap_max": "0",
                    "glibc.malloc.trim_threshold": str(2**32), "glibc.malloc.arena_max": "1"},
}  # fmt: skip
_THP = pathlib.Path("/sys/kernel/mm/transparent_hugepage/enabled")


def step_programs(
    sizes: tuple[int, ...],
    key: jax.Array,
    attend=attention,
    compute=None,
    names=PROGRAMS,
    remat: str | None = None,
) -> dict:
    """The compiled forward loss, value-and-gradient and AdamW train step of a transformer of
    `sizes` on one batch of random tokens, with their arguments; `attend` is every block's
    attention (`transformer_loss`); `compute` a 16-bit dtype to compute in, the parameters
    and AdamW's state kept in float32 (`precision.compute_in`, chapter 14's policy), or None;
    `names` the programs to compile (each is a long compile at a chip's sizes), "step" among
    them; `remat` a policy of `memory.POLICIES` for every block (`memory.remat_loss`, chapter
    14's), or None.

    Returns:
      {"forward", "gradient", "step": (compiled, args)}, "tokens": B T per step, and
      "step_flops": the step's FLOPs, from the lowered program (`measure.compiled` says why).
    """
    if len(sizes) != 7 or min(sizes) < 1:
        raise ValueError(f"sizes must be seven positive ints (L, D, N, K, F, T, B), got {sizes}")
    if "step" not in names or not set(names) <= set(PROGRAMS):
        raise ValueError(f"names must include 'step' and be among {PROGRAMS}, got {names}")
    L, D, N, K, F, T, B = sizes
    config = TransformerConfig(VOCAB_SIZE, L, D, N, K, F, T)
    init_key, data_key = jax.random.split(key)
    params = init_transformer(init_key, config)
    tokens = jax.random.randint(data_key, (B, T + 1), 0, VOCAB_SIZE)  # (B, T + 1)
    batch = Batch(x=tokens[:, :-1], y=tokens[:, 1:])
    optimizer = make_optimizer(1e-3, 0.1)
    opt_state = optimizer.init(params)

    if remat is not None and attend is not attention:
        raise ValueError(f"remat {remat!r} checkpoints the blocks of `attention`, not {attend}")
    train_loss = functools.partial(transformer_loss, attend=attend)
    if remat is not None:
        memory.remat_policy(remat)  # a ValueError naming the policy, before any tracing
        train_loss = functools.partial(memory.remat_loss, policy=remat)
    if compute is not None:
        train_loss = compute_in(train_loss, compute)

    def loss(params, batch):
        return train_loss(params, batch)[0]

    programs = {
        "forward": (jax.jit(loss), (params, batch)),
        "gradient": (jax.jit(jax.value_and_grad(loss)), (params, batch)),
        "step": (jax.jit(make_train_step(train_loss, optimizer)), (params, opt_state, batch)),
    }
    programs = {name: programs[name] for name in names}
    lowered = {name: fn.lower(*args) for name, (fn, args) in programs.items()}
    compiled = {name: (lowered[name].compile(), programs[name][1]) for name in programs}
    flops = lowered_flops(lowered["step"], compiled["step"][0])
    return {**compiled, "tokens": B * T, "step_flops": flops}


def step_rates(programs: dict, rounds: int) -> dict:
    """Median seconds of the forward pass, the gradient and the train step, timed in turn
    with the roofline's matmul (whose samples raise the build's ceiling).

    Returns:
      {"seconds": {name: median}, "flops": step FLOPs (cost analysis), "tokens_per_s",
       "flops_per_s", "ceiling": the raised matmul ceiling, "of_ceiling", "gradient_over_forward"}.
    """
    runs = {name: (lambda c=programs[name][0], a=programs[name][1]: c(*a)) for name in PROGRAMS}
    samples, roof = samples_beside_ceiling(runs, rounds)
    seconds = {name: statistics.median(samples[name]) for name in PROGRAMS}
    flops = programs["step_flops"]
    rate = flops / seconds["step"]
    return {
        "seconds": seconds,
        "flops": flops,
        "tokens_per_s": programs["tokens"] / seconds["step"],
        "flops_per_s": rate,
        "ceiling": roof.flops_per_s,
        "of_ceiling": rate / roof.flops_per_s,
        "gradient_over_forward": seconds["gradient"] / seconds["forward"],
    }


def precision_rates(wide: dict, narrow: dict, rounds: int) -> dict:
    """The train steps of two `step_programs` of one size, float32 (`wide`) and computed in
    bfloat16 (`narrow`), timed in turn with a float32 and a bfloat16 matmul of the roofline's
    size: each step's rate against its own precision's matmul ceiling, sampled beside it.

    Returns:
      {"seconds": {"float32", "bfloat16"}: median step seconds, "speedup": float32 time over
       bfloat16 time (median of paired rounds; "speedup_low", "speedup_high": the least and
       the most of the rounds), "ceilings": {"float32", "bfloat16"}: FLOP/s,
       best sample, "matmul_ratio": the bfloat16 matmul's time over the float32 one's
       (`matmul_time_ratio`: a busy moment that slows one precision's best sample divides
       out, where the ratio of the two best samples keeps it), "of_ceiling": {...}: each
       step's FLOP/s over its ceiling, "flops": each step's FLOPs, "tokens_per_s": {...}}.
    """
    n = roofline().matmul_size
    a, b = (jax.random.normal(k, (n, n)) for k in jax.random.split(jax.random.key(2)))
    a16, b16 = a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
    runs = {
        "float32": lambda: wide["step"][0](*wide["step"][1]),
        "bfloat16": lambda: narrow["step"][0](*narrow["step"][1]),
        "matmul float32": lambda: ceiling_matmul(a, b),
        "matmul bfloat16": lambda: ceiling_matmul(a16, b16),
    }
    samples = interleaved_samples(runs, rounds)
    ceilings = {k: 2.0 * n**3 / min(samples[f"matmul {k}"]) for k in ("float32", "bfloat16")}
    seconds = {k: statistics.median(samples[k]) for k in ("float32", "bfloat16")}
    flops = {"float32": wide["step_flops"], "bfloat16": narrow["step_flops"]}
    speedup, slowest, fastest = paired_spread(samples["float32"], samples["bfloat16"])
    return {
        "seconds": seconds,
        "speedup": speedup,
        "speedup_low": slowest,
        "speedup_high": fastest,
        "ceilings": ceilings,
        "matmul_ratio": matmul_time_ratio(a, b, a16, b16),
        "of_ceiling": {k: flops[k] / seconds[k] / ceilings[k] for k in seconds},
        "flops": flops,
        "tokens_per_s": {k: wide["tokens"] / seconds[k] for k in seconds},
    }


def matmul_time_ratio(a, b, a16, b16, pairs: int = 21) -> float:
    """The bfloat16 matmul's time over the float32 one's: the median of `pairs` pairs of calls
    taken straight after each other, so that a busy moment of a shared machine, which lasts
    longer than a pair, slows both calls of a pair alike. (Five rounds spread over whole
    train steps let a loaded 2-core machine give 0.57 in one build, for a bfloat16 matmul
    that XLA:CPU runs as the float32 one plus casts.)"""
    runs = {"float32": lambda: ceiling_matmul(a, b), "bfloat16": lambda: ceiling_matmul(a16, b16)}
    samples = interleaved_samples(runs, pairs)
    return paired_ratio(samples["bfloat16"], samples["float32"])


def time_ratios(base: dict, variants: dict[str, dict], rounds: int) -> dict[str, dict]:
    """Each variant's train step (`step_programs`) timed in turn with `base`'s, in `rounds`
    rounds: {name: {"ratio": the variant's time over base's (median of paired rounds),
    "low", "high": the least and the most round's, "seconds": the variant's median}}."""
    if "base" in variants:
        raise ValueError("'base' names the step the variants are timed against")
    programs = {"base": base, **variants}
    runs = {name: (lambda c=p["step"][0], a=p["step"][1]: c(*a)) for name, p in programs.items()}
    samples = interleaved_samples(runs, rounds)
    ratios = {}
    for name in variants:
        ratio, low, high = paired_spread(samples[name], samples["base"])
        ratios[name] = {"ratio": ratio, "low": low, "high": high,
                        "seconds": statistics.median(samples[name])}  # fmt: skip
    return ratios


def step_seconds(programs: dict[str, dict], rounds: int) -> dict[str, float]:
    """Median seconds of the train step of each of several `step_programs`, timed in turn."""
    runs = {name: (lambda c=p["step"][0], a=p["step"][1]: c(*a)) for name, p in programs.items()}
    return {name: statistics.median(s) for name, s in interleaved_samples(runs, rounds).items()}


def step_breakdown(programs: dict, tries: int = 3) -> dict[str, dict]:
    """The train step's kernels, traced and grouped by `transformer_group`, each group with
    its prediction at this build's roofline (`breakdown.grouped`)."""
    compiled, args = programs["step"]
    seconds = breakdown.kernel_seconds(compiled, *args, tries=tries)
    kernels = breakdown.kernels_of(compiled)
    return breakdown.grouped(kernels, seconds, breakdown.transformer_group, roofline())


def page_faults(programs: dict, name: str = "step", calls: int = 5) -> float:
    """Minor page faults (the kernel mapping a fresh page) per call of program `name` of
    `step_programs`, averaged over `calls` calls after one untimed call; from getrusage."""
    if calls < 1:
        raise ValueError(f"calls must be >= 1, got {calls}")
    compiled, args = programs[name]
    jax.block_until_ready(compiled(*args))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(calls):
        jax.block_until_ready(compiled(*args))
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / calls


def huge_pages_contrast() -> str | None:
    """None where `rates_in_fresh_process` can contrast small and huge pages (glibc >= 2.35
    and transparent huge pages in `madvise` mode, so only a process that asks gets them),
    else why not."""
    libc, version = platform.libc_ver()
    if libc != "glibc" or tuple(map(int, version.split(".")[:2])) < (2, 35):
        return f"malloc is not glibc >= 2.35 ({libc or 'unknown'} {version})"
    mode = _THP.read_text().strip() if _THP.exists() else "absent"
    if "[madvise]" not in mode:
        return f"transparent huge pages are {mode!r}, not madvise"
    return None


def with_tunable(tunables: str, name: str, value: str) -> str:
    """A GLIBC_TUNABLES string ("a=1:b=2") with `name` set to `value`, others kept."""
    if not name or any(c in name + value for c in ":="):
        raise ValueError(f"a tunable needs a name and a value without ':' or '=': {name}={value}")
    kept = [t for t in tunables.split(":") if t and t.split("=")[0] != name]
    return ":".join([*kept, f"{name}={value}"])


def allocator_env(allocator: str, env: dict) -> dict:
    """A copy of `env` whose GLIBC_TUNABLES carry the tunables of `allocator` (a name in
    `ALLOCATORS`), its other tunables kept; a ValueError names an unknown allocator."""
    if allocator not in ALLOCATORS:
        raise ValueError(f"allocator must be one of {list(ALLOCATORS)}, got {allocator!r}")
    env = dict(env)
    for name, value in ALLOCATORS[allocator].items():
        env["GLIBC_TUNABLES"] = with_tunable(env.get("GLIBC_TUNABLES", ""), name, value)
    return env


def run_sized_worker(worker: str, sizes: tuple[int, ...], rounds: int, env: dict, *extra) -> dict:
    """`python -m jaxloops.workers.<worker> --sizes L,D,... --rounds R *extra` in `env`: the
    JSON of its last printed line, plus "wall": its seconds; a RuntimeError with its stderr
    where it fails."""
    sizes_arg = ",".join(str(int(n)) for n in sizes)
    start = time.perf_counter()
    command = processes.command(worker, "--sizes", sizes_arg, "--rounds", rounds, *extra)
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the {worker} worker failed:\n{done.stderr[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {**result, "wall": time.perf_counter() - start}


def rates_in_fresh_process(
    sizes: tuple[int, ...],
    rounds: int,
    allocator: str,
    env: dict | None = None,
    breakdown: bool = False,
) -> dict:
    """`step_rates` and `page_faults` of the train step at `sizes` (and with `breakdown` its
    `step_breakdown`, as "groups"), measured in a new process (`jaxloops.workers.step_speed`)
    whose glibc is given the tunables of `allocator` (a name in `ALLOCATORS`); the same
    environment otherwise (`env`, default this process's), so it shares this build's
    roofline. Returns the worker's JSON, plus "wall": its seconds."""
    env = dict(os.environ if env is None else env, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    env = allocator_env(allocator, env)
    extra = ["--breakdown"] if breakdown else []
    return run_sized_worker("step_speed", sizes, rounds, env, *extra)


def allocator_runs(
    sizes: tuple[int, ...], rounds: int, processes: int = 3, breakdown: str | None = None
) -> dict:
    """`rates_in_fresh_process` with each of the `ALLOCATORS`, `processes` of each, taking
    turns (4 KiB pages, huge pages, memory kept, 4 KiB pages, ...) and sharing one persistent
    compilation cache (the allocator does not change the program, so only the first process
    compiles); the processes of kind `breakdown` also trace the step's groups.

    Returns {allocator: the result of its process with the median step time, plus "steps":
    every process's step seconds in order}. One process slowed by something outside it
    (seen once in a build: +41 %) then decides nothing. Each chosen result's "ceiling" and
    "of_ceiling" are against the highest ceiling any process measured: each raises the
    build's shared ceiling in turn, so the first read a lower one (a build beside a busy
    core read 45 % for a 111.7 ms step and 42 % for an 87.0 ms one).
    """
    if processes < 1 or processes % 2 == 0:
        raise ValueError(f"processes must be odd and >= 1 (a median), got {processes}")
    runs = {name: [] for name in ALLOCATORS}
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=cache,
                   JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")  # fmt: skip
        for _ in range(processes):
            for name in ALLOCATORS:
                traced = name == breakdown
                runs[name].append(rates_in_fresh_process(sizes, rounds, name, env, traced))
    ceiling = max(r["ceiling"] for results in runs.values() for r in results)
    chosen = {}
    for name, results in runs.items():
        steps = [r["seconds"]["step"] for r in results]
        median = sorted(results, key=lambda r: r["seconds"]["step"])[processes // 2]
        of_ceiling = median["flops_per_s"] / ceiling
        chosen[name] = {**median, "steps": steps, "ceiling": ceiling, "of_ceiling": of_ceiling}
    return chosen
