"""Chapter 14's measurements: what compiled train steps keep, recompute and cost to compile.

Programs are compiled from shapes alone (`jax.eval_shape`), so a memory figure needs no
execution; `memory_analysis()` is then exact for the program XLA built. They are compiled
with LLVM's optimisations off (COMPILE_ONLY): XLA assigns every buffer before LLVM runs, so
the bytes are those of the default build (tests/test_memory.py checks it), at half the
compile time.
"""

import contextlib
import dataclasses
import functools
import io
import math
import re
import time

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import print_saved_residuals

from jaxloops import memory
from jaxloops.accumulate import accumulated_grads
from jaxloops.data import Batch
from jaxloops.measure.compiled import lowered_flops, scratch_bytes
from jaxloops.measure.published import published_peaks
from jaxloops.precision import compute_in
from jaxloops.transformer import TransformerConfig, init_transformer

COMPILE_ONLY = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


@dataclasses.dataclass(frozen=True)
class Measured:
    """What XLA says about one compiled program."""

    temp: int  # scratch bytes the program allocates (residuals and intermediates)
    argument: int
    output: int
    flops: float  # cost analysis: a loop body is counted once, not once per trip
    instructions: int  # HLO instructions of the optimized program
    compile_seconds: float  # CPU seconds to trace, lower and compile (all threads)
    program: object = dataclasses.field(default=None, compare=False, repr=False)  # callable


def measure_compiled(fn, *args, options=COMPILE_ONLY) -> Measured:
    """`memory_analysis()` and `cost_analysis()` of `jax.jit(fn)(*args)`; compiles only.

    Compile time is CPU time (`time.process_time`): on a shared machine other processes
    stretch the wall clock, not the work this one does."""
    start = time.process_time()
    lowered = jax.jit(fn).lower(*args)
    compiled = lowered.compile(compiler_options=options)
    seconds = time.process_time() - start
    stats = compiled.memory_analysis()
    return Measured(
        temp=scratch_bytes(stats),
        argument=int(stats.argument_size_in_bytes),
        output=int(stats.output_size_in_bytes),
        flops=lowered_flops(lowered, compiled),  # the lowered count: compiled.py says why
        instructions=sum(" = " in line for line in compiled.as_text().splitlines()),
        compile_seconds=seconds,
        program=compiled,
    )


def model_shapes(config: TransformerConfig, batch: int, length: int, scanned: bool):
    """ShapeDtypeStructs of the parameters (stacked when `scanned`) and of a (B, T) batch."""
    key = jax.eval_shape(lambda: jax.random.key(0))  # traced: nothing runs on the device
    params = jax.eval_shape(lambda key: init_transformer(key, config), key)
    if scanned:
        params = jax.eval_shape(memory.stack_blocks, params)
    tokens = jax.ShapeDtypeStruct((batch, length), jnp.int32)
    return params, Batch(tokens, tokens)


def loss_of(scanned=False, policy=None, whole=False, dtype=None):
    """`(params, batch) -> (loss, metrics)` of one variant of the chapter's model: scanned or
    unrolled, remat `policy` per block (or around the `whole` loss), computing in `dtype`."""
    base = memory.scanned_loss if scanned else memory.remat_loss
    if whole:
        wrapped = jax.checkpoint(base, policy=memory.remat_policy(policy), static_argnums=(2,))
        loss = lambda params, batch: wrapped(params, batch, None)  # noqa: E731
    else:
        loss = lambda params, batch: base(params, batch, policy)  # noqa: E731
    return loss if dtype is None else compute_in(loss, dtype)


def grad_program(config, batch: int, length: int, *, scanned=False, policy=None, whole=False,
                 micro=1, dtype=None) -> Measured:  # fmt: skip
    """Measured of one variant's compiled gradient (cached): `jax.value_and_grad` of
    `loss_of(...)`, or with `micro` > 1 `accumulated_grads` over that many micro-batches.
    Its `program` runs on real parameters and batch of those shapes."""
    return _grad_program(config, batch, length, scanned, policy, whole, micro, dtype)


def compile_count() -> int:
    """How many gradient programs `grad_program` has compiled in this process so far."""
    return _grad_program.cache_info().misses


@functools.lru_cache(maxsize=128)  # all of chapter 14's, its biggest-model search's among them
def _grad_program(config, batch, length, scanned, policy, whole, micro, dtype) -> Measured:
    params, tokens = model_shapes(config, batch, length, scanned)
    loss = loss_of(scanned, policy, whole, dtype)
    if micro > 1:
        return measure_compiled(lambda p, b: accumulated_grads(loss, p, b, micro), params, tokens)
    return measure_compiled(jax.value_and_grad(lambda p, b: loss(p, b)[0]), params, tokens)


@functools.lru_cache(maxsize=8)
def forward_program(config, batch: int, length: int, scanned=False) -> Measured:
    """Measured of the compiled loss alone, no gradient: the forward pass's FLOPs."""
    params, tokens = model_shapes(config, batch, length, scanned)
    return measure_compiled(lambda p, b: loss_of(scanned)(p, b)[0], params, tokens)


_RESIDUAL = re.compile(r"^(\w+)\[([\d,]*)\] (.*)$")


@functools.lru_cache(maxsize=16)
def saved_residuals(config: TransformerConfig, batch: int, length: int) -> list[tuple]:
    """What autodiff saves for the backward pass of the unrolled loss, read from
    `jax.ad_checkpoint.print_saved_residuals`: (bytes per element, shape, where from) per
    residual, the arguments (parameters and tokens) left out."""
    params, tokens = model_shapes(config, batch, length, scanned=False)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        print_saved_residuals(lambda p, b: loss_of()(p, b)[0], params, tokens)
    rows = []
    for line in printed.getvalue().splitlines():
        dtype, dims, source = _RESIDUAL.match(line).groups()  # e.g. f32 [16,4,64,64] output of
        if not source.startswith("from the argument"):
            bits = int(re.sub(r"\D", "", dtype) or 8)  # f32, bf16, i32; bool is one byte
            rows.append((bits // 8, tuple(int(d) for d in dims.split(",") if d), source))
    return tuple(rows)


def residual_census(config: TransformerConfig, batch: int, length: int) -> dict:
    """`saved_residuals` summed: their bytes, and per layer how many are attention weights
    (B, N, T, S), whatever the grouping of N, and how many are the hidden layer (B, T, F), flat
    or not. Told apart by shape, not only size: where N * T = F (chapter 14's sizes) the two
    have the same size, and a count by size would count every such array in both."""
    rows = saved_residuals(config, batch, length)
    L, F, N, T = config.num_layers, config.hidden_dim, config.num_heads, length
    scores = [math.prod(s) == batch * N * T * T and len(s) >= 4 and s[-2:] == (T, T)
              for _, s, _ in rows]  # fmt: skip
    hidden = [not is_scores and math.prod(s) == batch * T * F and s[-1:] == (F,)
              for is_scores, (_, s, _) in zip(scores, rows)]  # fmt: skip
    return {
        "bytes": sum(math.prod(shape) * itemsize for itemsize, shape, _ in rows),
        "scores": sum(scores) / L,
        "hidden": sum(hidden) / L,
    }


def formula_sweep(config: TransformerConfig, points) -> list[dict]:
    """For each (B, T, L): the formula's bytes, the compiled gradient's temp bytes, and the
    residuals autodiff saves (`print_saved_residuals`), with the two ratios to the formula."""
    rows = []
    for B, T, L in points:
        c = dataclasses.replace(config, num_layers=L)
        row = {"B": B, "T": T, "L": L, "formula": memory.activation_bytes(c, B, T)["total"]}
        row["compiled"] = grad_program(c, B, T).temp
        row["autodiff"] = residual_census(c, B, T)["bytes"]
        row["compiled / formula"] = row["compiled"] / row["formula"]
        row["autodiff / formula"] = row["autodiff"] / row["formula"]
        rows.append(row)
    return rows


def compile_sweep(config: TransformerConfig, batch: int, length: int, layers) -> list[dict]:
    """HLO instructions and compile CPU seconds of the gradient, unrolled and scanned, per L."""
    rows = []
    for L in layers:
        c = dataclasses.replace(config, num_layers=L)
        for kind in ("unrolled", "scanned"):
            m = grad_program(c, batch, length, scanned=kind == "scanned")
            rows.append(
                {
                    "L": L,
                    "kind": kind,
                    "instructions": m.instructions,
                    "compile s": m.compile_seconds,
                }
            )
    return rows


def growth(rows: list[dict], kind: str, key: str) -> float:
    """`key` at the largest L over `key` at the smallest, for one kind of `compile_sweep`."""
    line = sorted((r for r in rows if r["kind"] == kind), key=lambda r: r["L"])
    return line[-1][key] / line[0][key]


# The techniques of chapter 14's biggest-model table, as `grad_program` builds them and as
# `memory.step_bytes` counts them: none, remat per block under each policy inside the scan
# over layers (the form remat is used in), and bfloat16 compute. Each costs the table about
# four compiles of its step (a second or two each on a CPU); accumulation, which
# `grad_program(micro=M)` and `step_bytes(micro=M)` also build and count, is left out.
TECHNIQUES = {
    "none": {},
    "remat, nothing saved": {"scanned": True, "policy": "nothing"},
    "remat, names saved": {"scanned": True, "policy": "names"},
    "remat, dots saved": {"scanned": True, "policy": "dots"},
    "bfloat16 compute": {"dtype": jnp.bfloat16},
}


def formula_technique(program: dict) -> dict:
    """`memory.step_bytes`'s arguments for one of TECHNIQUES."""
    itemsize = 4 if program.get("dtype") is None else jnp.dtype(program["dtype"]).itemsize
    return {"remat": program.get("policy"), "micro": program.get("micro", 1), "itemsize": itemsize}


def library_scratch_bytes() -> int:
    """The scratch a compiled program holds for its matmul library alone: the temp bytes of
    one small float32 matmul. 0 on a CPU; on a GPU, the workspace XLA gives cuBLAS, which
    `held_bytes` counts and the memory formula does not (an H200 step of a 1.7 MB model held
    35.2 MB)."""
    x = jax.ShapeDtypeStruct((64, 64), jnp.float32)
    return measure_compiled(jnp.matmul, x, x).temp


def held_bytes(config, batch: int, length: int, program: dict) -> int:
    """Bytes the compiled step holds: the gradient program's scratch (residuals,
    intermediates; the gradient sum under accumulation, the 16-bit parameters under mixed
    precision), its arguments (parameters, tokens) and outputs (loss, gradients), and
    AdamW's two float32 moments, which the gradient program does not see."""
    m = grad_program(config, batch, length, **program)
    return m.temp + m.argument + m.output + memory.state_bytes(config)["adam"]


def published_biggest_models(config, batch, length, fraction, margin, boards) -> list[dict]:
    """The formula's largest L and B per technique for a `fraction` of each board's published
    memory (`measure.published`): predicted only, nothing compiled on that board."""
    rows = []
    for board in boards:
        peaks = published_peaks(board)
        budget = fraction * peaks.memory_bytes
        for name, program in TECHNIQUES.items():
            technique = formula_technique(program)
            safe = memory.biggest_model(config, batch, length, budget, margin=margin, **technique)
            rows.append(
                {
                    "board": peaks.board,
                    "budget GB": budget / 1e9,
                    "technique": name,
                    "safe L": safe["L"],
                    "safe B": safe["B"],
                }
            )
    return rows


def recorded_bf16_steps(results: dict | None) -> list[dict] | None:
    """A GPU run's chapter-14 step times in float32 and bfloat16 (`results["memory_steps"]`,
    rows as a GPU run would record them), or None where the run has none."""
    rows = (results or {}).get("memory_steps")
    return list(rows) if rows else None
