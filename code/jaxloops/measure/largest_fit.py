"""Chapter 14's biggest model that fits, found by compiling.

The largest L (at a batch) and the largest B (at a depth) whose compiled train step holds
no more than a budget (`step_memory.held_bytes`), per technique of `step_memory.TECHNIQUES`:
a search over compiled programs that the memory formula (`memory.biggest_model`) starts.
The search compiles and never runs (`memory_analysis()` needs only shapes); `run_train_step`
runs one step at the size it found.
"""

import concurrent.futures
import dataclasses
import math
import os
import time

import jax

from jaxloops import memory
from jaxloops.accumulate import make_accumulating_step
from jaxloops.data import Batch
from jaxloops.measure.compiled import scratch_bytes
from jaxloops.measure.step_memory import (
    COMPILE_ONLY,
    TECHNIQUES,
    formula_technique,
    held_bytes,
    loss_of,
)
from jaxloops.train import make_optimizer, make_train_step
from jaxloops.transformer import init_transformer


def largest_near(held, budget: int, guess, high: int, *, step=1, limit=2**16, rounds=2):
    """The largest multiple n of `step` in [0, limit] with held(n) <= budget, for a `held`
    that grows with n (n = 0 is taken to fit), and every probe made, {n: held(n)}.

    Args:
      guess: `probes -> n`, the answer the caller expects from the probes so far (none at
        first). Each of the first `rounds` guesses is probed with its neighbour (n + step if
        n fits, n - step if not), so a right guess costs two probes.
      high: where the caller expects nothing to fit: the first upper end of the bisection
        that follows, which doubles the last n that fit while nothing above it is known to
        fail, then halves the bracket.
    """
    if step < 1 or rounds < 0:
        raise ValueError(f"need step >= 1 and rounds >= 0, got step = {step}, rounds = {rounds}")
    for name, value in (("high", high), ("limit", limit)):
        if value < 0 or value % step:
            raise ValueError(f"{name} = {value} is not a multiple >= 0 of the step {step}")
    probes = {}
    lo, hi = 0, limit + step  # held(lo) fits (0 by assumption); held(hi) does not (beyond limit)

    def hints():
        for _ in range(rounds):
            n = guess(probes) // step * step
            yield n
            yield n + step if n <= lo else n - step  # the side the probe of n points to
        yield high

    pending = hints()
    while hi - lo > step:
        n = next((h for h in pending if lo < h < hi and h not in probes), None)
        if n is None and hi > limit:  # nothing above lo is known to fail: double it
            n = min(max(2 * lo, step), limit)
        elif n is None:
            n = lo + (hi - lo) // (2 * step) * step
        probes[n] = held(n)
        lo, hi = (n, hi) if probes[n] <= budget else (lo, n)
    return lo, probes


def search_problems(probes: dict, budget: int, answer: int, step: int = 1) -> list[str]:
    """What contradicts `answer` being the boundary the probes of `largest_near` found: the
    answer over the budget, answer + step not probed or within it, or bytes that do not grow
    with n across the probes (then the search's assumption fails). Empty when none does."""
    problems = []
    if answer and not probes.get(answer, budget + 1) <= budget:
        problems.append(f"the answer {answer} was not probed within the budget")
    if not probes.get(answer + step, budget) > budget:
        problems.append(f"{answer + step} was not probed over the budget")
    sizes = sorted(probes)
    for smaller, larger in zip(sizes, sizes[1:]):
        if probes[larger] <= probes[smaller] and probes[larger] < math.inf:
            problems.append(f"{probes[larger]} bytes at {larger} <= {probes[smaller]} at {smaller}")
    return problems


def held_or_over(config, batch: int, length: int, program: dict) -> float:
    """`held_bytes`, or infinity where the backend refuses to compile the step for want of
    memory: XLA:TPU checks a program against the chip's HBM when it compiles it."""
    try:
        return held_bytes(config, batch, length, program)
    except jax.errors.JaxRuntimeError as error:
        if "RESOURCE_EXHAUSTED" not in str(error):
            raise
        return math.inf


def formula_margin(config, batch: int, length: int, program: dict, held: int) -> float:
    """`held` bytes of a compiled step beyond the formula's fixed bytes, over the formula's
    residuals, at this size: the margin with which `memory.biggest_model` predicts it."""
    fixed, residuals = memory.step_bytes(config, batch, length, **formula_technique(program))
    return (held - fixed) / residuals


def line_guess(points: dict, budget: int, step: int = 1) -> int | None:
    """The largest multiple of `step` at which the line through the two of `points` ({n:
    bytes} compiled) whose bytes lie nearest the budget stays within it. None with fewer than
    two points, or where bytes do not grow between them. A step's bytes grow by about the same
    amount with each block (unrolled, or a scan's stacked arrays) and each example, so the line
    through two compiled sizes predicts a third better than the formula's margin does (whose
    fixed part it counts as residuals); the two nearest the budget, because far from it the
    compiler's choices bend the line. At the chip's sizes (remat, nothing saved) the line
    from B 80 through B 1,011 crossed the budget at 987, the one through B 1,011 and 1,012 at
    821, and the answer was 848: 14 compiles in all through the far point, 6 through the two
    nearest (compiled for a v5e ahead of time, 2026-12-07)."""
    finite = [(n, b) for n, b in points.items() if b < math.inf]
    if len(finite) < 2:
        return None
    (n1, b1), (n2, b2) = sorted(sorted(finite, key=lambda point: abs(point[1] - budget))[:2])
    if b2 <= b1:
        return None
    return (n1 + math.floor((budget - b1) * (n2 - n1) / (b2 - b1))) // step * step


def _search(config, batch, length, budget, program, axis, margin, known):
    """`largest_near` over L (at `batch`) or B (at config's L) for one technique, each guess
    the line through two compiled sizes (`line_guess`), `known` ({n: bytes} compiled before
    the search) among them, or, with one, the formula's answer at the margin measured there
    (`margin` at first)."""
    technique = formula_technique(program)
    step = technique["micro"] if axis == "B" else 1

    def sized(n):  # (config, batch) with n layers, or a batch of n
        return (dataclasses.replace(config, num_layers=n), batch) if axis == "L" else (config, n)

    def predicted(m):
        # Below 1 where the compiled step keeps less than the formula counts (XLA:TPU can)
        return memory.biggest_model(config, batch, length, budget, margin=max(m, 0.01), **technique)

    def guess(probes):
        points = {**known, **probes}
        line = line_guess(points, budget, step)
        if line is not None:
            return line
        compiled = [n for n, held in points.items() if held < math.inf]
        m = margin or 1  # the margin at the last size that compiled, else the one given
        if compiled:
            m = formula_margin(*sized(compiled[-1]), length, program, points[compiled[-1]])
        return predicted(m)[axis]

    def held(n):
        return held_or_over(*sized(n), length, program)

    exact = predicted(1)[axis]
    # Where XLA:CPU keeps more than the formula counts, no more fits; XLA:TPU can keep less
    # (chapter 14's first section), and the search then doubles past this first upper end.
    high = exact + step
    limit = step * max(2**10 // step, 4 * high // step)  # room to double past a wrong formula
    n, probes = largest_near(held, budget, guess, high, step=step, limit=limit, rounds=3)
    return {"formula": exact, "compiled": n, "probes": probes, "step": step}


def compiled_largest(config, batch: int, length: int, budget: int, program: dict) -> dict:
    """The largest L (at `batch`) and B (at config's L, a multiple of the micro-batches)
    whose compiled step fits `budget` (`held_bytes`), each found by `largest_near` from the
    formula's answer at the margin measured at config's L and `batch` (None where that step
    does not compile for want of memory: then from the formula's exact answer).

    Returns:
      {"margin": that margin, "L": ..., "B": ...}, each axis {"formula", "compiled",
      "probes", "step"}: the formula's exact answer, the compiled one, {n: held bytes}.
    """
    held = held_or_over(config, batch, length, program)
    margin = formula_margin(config, batch, length, program, held) if held < math.inf else None
    axes = {"L": config.num_layers, "B": batch}
    search = lambda axis: _search(config, batch, length, budget, program, axis, margin,
                                  {axes[axis]: held})  # fmt: skip
    at_once = 2 if SEARCHES_AT_ONCE > 1 else 1  # SEARCHES_AT_ONCE says why
    with concurrent.futures.ThreadPoolExecutor(max_workers=at_once) as pool:
        return {"margin": margin, **dict(zip(axes, pool.map(search, axes)))}


# The searches run at once, each in a thread of its own, on a host with cores to spare: a
# search's compiles follow one another, but the ten searches (five techniques, L and B)
# share nothing. One XLA:TPU compile kept 1.7 of a 2-core machine's cores busy, so the table
# runs half as many searches at once as the host has cores, at most all ten. Compiled for a
# v5e ahead of time on that machine (2026-12-07), the table at the chip's sizes took 790 s
# for 54 compiles in turn, 792 s for 46 in threads (11 GB of compilers' memory): there they
# gain nothing, and there it now runs in turn. The chip's host has 13 cores; its device run
# says whether they gain. The answers do not depend on the order: each probe is a pure
# function of its program, and no two searches probe the same one.
SEARCHES_AT_ONCE = max(1, min(10, (os.cpu_count() or 1) // 2))


def largest_fit_table(config, batch, length, budget, techniques=TECHNIQUES) -> list[dict]:
    """`compiled_largest` per technique, one row each: the formula's largest L and B, the
    compiled ones, the held bytes at each over the budget, the compiles each search made,
    and what contradicts each answer (`search_problems`, empty when nothing does)."""
    largest = lambda program: compiled_largest(config, batch, length, budget, program)
    with concurrent.futures.ThreadPoolExecutor(max(1, SEARCHES_AT_ONCE // 2)) as pool:
        found_all = list(pool.map(largest, techniques.values()))
    rows = []
    for name, found in zip(techniques, found_all):
        row = {"technique": name, "margin": found["margin"]}
        for axis in ("L", "B"):
            n, probes, step = (found[axis][k] for k in ("compiled", "probes", "step"))
            row[f"formula {axis}"] = found[axis]["formula"]
            row[f"compiled {axis}"] = n
            row[f"held / budget at {axis}"] = probes[n] / budget if n else None
            row[f"compiles for {axis}"] = len(probes)
            row[f"problems at {axis}"] = search_problems(probes, budget, n, step)
        rows.append(row)
    return rows


def run_train_step(config, data: Batch, program: dict, key) -> dict:
    """One AdamW train step of one technique (`program`, as in TECHNIQUES) on `data` (a
    (B, T) batch), from parameters drawn with `key`; parameters and optimizer state donated,
    compiled as `grad_program` compiles (COMPILE_ONLY: the default build's bytes).

    Returns:
      {"completed", "error", "loss", "seconds", "step_held", "before", "after"}: whether
      the step ran, the error it raised if not, its loss, its wall seconds, its compiled
      program's held bytes (scratch, arguments, outputs not aliased to them), and the
      device's `memory_stats()` before and after (None where the backend reports none).
    """
    scanned, micro = program.get("scanned", False), program.get("micro", 1)
    loss = loss_of(scanned, program.get("policy"), dtype=program.get("dtype"))
    optimizer = make_optimizer(1e-3, 0.1)
    step = make_train_step(loss, optimizer)
    if micro > 1:
        step = make_accumulating_step(loss, optimizer, micro)
    device = next(iter(jax.tree.leaves(data)[0].sharding.device_set))  # where the step runs
    before = device.memory_stats()
    params = jax.jit(init_transformer, static_argnums=1)(key, config)  # one program, not one per op
    params = jax.jit(memory.stack_blocks)(params) if scanned else params
    opt_state = jax.jit(optimizer.init)(params)
    result = {"step_held": None, "error": None, "loss": None, "seconds": None}
    try:  # the compile too: XLA:TPU refuses a program larger than the chip when compiling it
        lowered = jax.jit(step, donate_argnums=(0, 1)).lower(params, opt_state, data)
        compiled = lowered.compile(compiler_options=COMPILE_ONLY)
        stats = compiled.memory_analysis()
        held = stats.argument_size_in_bytes + stats.output_size_in_bytes
        result["step_held"] = held - stats.alias_size_in_bytes + scratch_bytes(stats)
        start = time.perf_counter()
        params, opt_state, metrics = compiled(params, opt_state, data)
        result["loss"] = float(metrics["loss"])  # waits for the step to finish
        result["seconds"] = time.perf_counter() - start
    except jax.errors.JaxRuntimeError as error:  # out of memory, say: the page reports it
        result["error"] = f"{type(error).__name__}: {error}"
    result["completed"] = result["error"] is None
    return {**result, "before": before, "after": device.memory_stats()}
