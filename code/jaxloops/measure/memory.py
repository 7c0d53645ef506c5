"""Chapter 14's measurements: what compiled train steps keep, recompute and cost to compile.

Programs are compiled from shapes alone (`jax.eval_shape`), so a memory figure needs no
execution; `memory_analysis()` is then exact for the program XLA built.
"""

import dataclasses
import functools
import math
import time

import jax
import jax.numpy as jnp

from jaxloops import memory
from jaxloops.accumulate import make_accumulating_step
from jaxloops.data import Batch
from jaxloops.measure.compiled import compile_call, costs_of
from jaxloops.train import make_optimizer
from jaxloops.transformer import TransformerConfig, init_transformer


@dataclasses.dataclass(frozen=True)
class Measured:
    """What XLA says about one compiled program."""

    temp: int  # scratch bytes the program allocates (residuals and intermediates)
    argument: int
    output: int
    alias: int
    flops: float  # cost analysis: a loop body is counted once, not once per trip
    instructions: int  # HLO instructions of the optimized program
    compile_seconds: float
    program: object = dataclasses.field(default=None, compare=False, repr=False)  # callable


def measure_compiled(fn, *args) -> Measured:
    """`memory_analysis()` and `cost_analysis()` of `jax.jit(fn)(*args)`; compiles only."""
    start = time.perf_counter()
    compiled = compile_call(fn, *args)
    seconds = time.perf_counter() - start
    stats = compiled.memory_analysis()
    text = compiled.as_text()
    return Measured(
        temp=int(stats.temp_size_in_bytes),
        argument=int(stats.argument_size_in_bytes),
        output=int(stats.output_size_in_bytes),
        alias=int(stats.alias_size_in_bytes),
        flops=costs_of(compiled)["flops"],
        instructions=sum(" = " in line for line in text.splitlines()),
        compile_seconds=seconds,
        program=compiled,
    )


def model_shapes(config: TransformerConfig, batch: int, length: int, scanned: bool):
    """ShapeDtypeStructs of the parameters (stacked when `scanned`) and of a (B, T) batch."""
    params = jax.eval_shape(lambda key: init_transformer(key, config), jax.random.key(0))
    if scanned:
        params = jax.eval_shape(memory.stack_blocks, params)
    tokens = jax.ShapeDtypeStruct((batch, length), jnp.int32)
    return params, Batch(tokens, tokens)


def loss_of(scanned: bool, policy: str | None, whole: bool = False):
    """The scalar loss `(params, batch) -> loss` of one variant of the chapter's model."""
    base = memory.scanned_loss if scanned else memory.remat_loss
    if whole:
        wrapped = jax.checkpoint(base, policy=memory.remat_policy(policy), static_argnums=(2,))
        return lambda params, batch: wrapped(params, batch, None)[0]
    return lambda params, batch: base(params, batch, policy)[0]


@functools.lru_cache(maxsize=64)
def grad_program(config, batch: int, length: int, scanned=False, policy=None, whole=False):
    """Measured of the compiled `jax.value_and_grad(loss)` of one variant (cached); its
    `program` runs on real parameters and batch of those shapes."""
    params, tokens = model_shapes(config, batch, length, scanned)
    return measure_compiled(jax.value_and_grad(loss_of(scanned, policy, whole)), params, tokens)


def saved_residual_bytes(config: TransformerConfig, batch: int, length: int, policy=None) -> dict:
    """What autodiff saves for the backward pass (the residuals of `jax.vjp`), from shapes.

    Returns:
      {"total": bytes besides the parameters, "scores": how many residuals per layer have
       the (B, N, T, S) size of the attention weights, "hidden": how many the (B, T, F) size}.
    """
    params, tokens = model_shapes(config, batch, length, scanned=False)
    loss = loss_of(False, policy)
    residuals = jax.eval_shape(lambda p, b: jax.vjp(lambda q: loss(q, b), p)[1], params, tokens)
    B, T, L, F = batch, length, config.num_layers, config.hidden_dim
    shapes = [a.shape for a in jax.tree.leaves(residuals)]
    scores = [
        s for s in shapes if s[-2:] == (T, T) and math.prod(s) == B * config.num_heads * T * T
    ]
    hidden = [s for s in shapes if s[-1:] == (F,) and math.prod(s) == B * T * F]
    return {
        "total": memory.tree_bytes(residuals) - memory.tree_bytes(params),
        "scores": len(scores) / L,
        "hidden": len(hidden) / L,
    }


def formula_sweep(config: TransformerConfig, points) -> list[dict]:
    """For each (B, T, L): the formula's bytes, the compiled gradient's temp bytes, and the
    residuals autodiff saves."""
    rows = []
    for B, T, L in points:
        c = dataclasses.replace(config, num_layers=L)
        rows.append(
            {
                "B": B,
                "T": T,
                "L": L,
                "formula": memory.activation_bytes(c, B, T)["total"],
                "compiled": grad_program(c, B, T).temp,
                "autodiff": saved_residual_bytes(c, B, T)["total"],
            }
        )
    return rows


def best_seconds(fn, *args, repeats: int = 5) -> float:
    """Fastest of `repeats` timed calls of `fn(*args)` after one warm-up (a busy machine only
    slows a call down)."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return min(times)


@functools.lru_cache(maxsize=16)
def accumulation_program(config, batch: int, length: int, num_micro: int) -> Measured:
    """Measured of the compiled AdamW step accumulating over M micro-batches (cached)."""
    params, tokens = model_shapes(config, batch, length, scanned=False)
    optimizer = make_optimizer(1e-3, 0.1)
    opt_state = jax.eval_shape(optimizer.init, params)
    step = make_accumulating_step(memory.remat_loss, optimizer, num_micro)
    return measure_compiled(step, params, opt_state, tokens)


def biggest_batch_table(config, length: int, budget: int, margin: float, micro: int) -> list:
    """For each technique: the formula's bytes per example, the fixed bytes (AdamW state;
    plus the gradient sum under accumulation), the largest B the formula allows, and the
    largest with the residuals multiplied by `margin` (the compiled program's measured
    excess over the formula). Accumulation over `micro` micro-batches holds one micro-batch's
    residuals, so its B is `micro` times the largest micro-batch."""
    state = sum(memory.state_bytes(config).values())
    grads = memory.state_bytes(config)["grads"]
    plain = memory.activation_bytes(config, 1, length)["total"]
    remat = memory.remat_activation_bytes(config, 1, length)
    rows = []
    for name, per_example, fixed, m in (
        ("none", plain, state, 1),
        ("remat (nothing saved)", remat, state, 1),
        (f"accumulation, M = {micro}", plain, state + grads, micro),
        (f"remat and accumulation, M = {micro}", remat, state + grads, micro),
    ):
        rows.append(
            {
                "technique": name,
                "bytes per example": per_example,
                "fixed bytes": fixed,
                "largest B": m * memory.largest_fitting(per_example, fixed, budget),
                "safe B": m * memory.largest_fitting(per_example, fixed, budget, margin),
            }
        )
    return rows
