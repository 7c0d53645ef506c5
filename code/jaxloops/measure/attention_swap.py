"""Chapter 17's last section: chapter 11's train step with one attention swapped for another,
timed beside the bfloat16 matmul ceiling, and predicted from one layer's attention passes
timed alone.

Sizes are (L, D, N, K, F, T, B), as `LanguageModelSizes.speed` holds them.
"""

import pathlib
import statistics

import jax
import jax.numpy as jnp

from jaxloops.measure import breakdown, step_speed
from jaxloops.measure.roofline import ceiling_matmul, roofline
from jaxloops.measure.timing import interleaved_samples


def swap_sizes(sizes) -> tuple[int, ...]:
    """The step's sizes for `sizes` (an `experiment_sizes()`): chapter 11's timed step on a
    TPU; elsewhere, where Pallas's interpreter runs a grid step at a time, one layer at
    chapter 17's check sizes, its T one block."""
    if sizes.backend == "tpu":
        return sizes.lm.speed
    k = sizes.kernel
    D = k.heads * k.head_dim
    return (1, D, k.heads, k.kv_heads, 4 * D, k.block, k.batch)


def masked_flops(sizes: tuple[int, ...]) -> float:
    """FLOPs of a causal step's attention above the diagonal, which an unmasked count credits:
    half of the scores' and the mix's 4·B·N·T²·H a layer forward, three times that forward and
    backward, over L layers."""
    L, D, N, _, _, T, B = sizes
    return 6.0 * L * B * N * T * T * (D // N)


def swap_bytes(sizes: tuple[int, ...], itemsize: int = 2) -> float:
    """Bytes a step's swaps between the book's (B, T, N, H) and a kernel's heads-major
    (B, N, T, H) move if each is a copy of its own (read once, written once): forward the
    query, key, value and output, backward their four gradients, in every one of L layers.
    `itemsize`: the compute dtype's bytes (bfloat16's 2)."""
    L, D, N, K, _, T, B = sizes
    if min(sizes) < 1 or itemsize < 1:
        raise ValueError(f"need positive sizes and itemsize, got {sizes}, {itemsize}")
    query, key = B * T * N * (D // N) * itemsize, B * T * K * (D // N) * itemsize
    one_way = 2 * query + 2 * key  # query and output; key and value
    return float(L * 2 * (2 * one_way))  # forward and backward, each read and written


def predicted_step(step: float, layer: float, other_layer: float, layers: int) -> float:
    """Seconds of the step with the other attention, if only the attention's time changes: the
    step's, less `layers` times the difference between one layer's two passes."""
    if min(step, layer, other_layer) < 0 or layers < 1:
        raise ValueError(
            f"need seconds >= 0 and layers >= 1, got {step, layer, other_layer, layers}"
        )
    return step - layers * (layer - other_layer)


def layer_pass(attend):
    """One layer's causal attention, forward and backward, as the step runs it, jitted:
    `(q, k, v, d_out) -> (dq, dk, dv)`."""

    def forward_backward(q, k, v, d_out):
        _, vjp = jax.vjp(lambda q, k, v: attend(q, k, v, is_causal=True), q, k, v)
        return vjp(d_out)

    return jax.jit(forward_backward)


def attention_swap(sizes: tuple[int, ...], attends: dict, rounds: int, key=None) -> dict:
    """The train step of `sizes` in bfloat16 compute (float32 master weights) with each of two
    attentions, `attends` = {name: attend}, the first the reference; each one's layer pass
    alone; and a bfloat16 matmul of the roofline's size, all taken in turn over `rounds`.

    Returns:
      {"steps": each name's `step_programs`, "seconds": {"step, NAME", "layer, NAME"}: medians,
       "ceiling": the bfloat16 matmul's best FLOP/s, "flops": the reference step's FLOPs (XLA's
       count: it counts nothing inside a Pallas call, so both steps are credited with the same
       model's work), "predicted": the second step's seconds from the first's
       (`predicted_step`), "of_ceiling": {name: share of the ceiling}, "of_ceiling_unmasked":
       the second's share without `masked_flops`, "measured_over_predicted"}.
    """
    if len(attends) != 2:
        raise ValueError(f"attends must name two attentions, got {list(attends)}")
    L, D, N, K, _, T, B = sizes
    H = D // N
    key = jax.random.key(3) if key is None else key
    steps = {name: step_speed.step_programs(sizes, key, attend=fn, compute=jnp.bfloat16,
                                            names=("step",))
             for name, fn in attends.items()}  # fmt: skip
    keys = jax.random.split(jax.random.fold_in(key, 1), 4)
    shapes = [(B, T, N, H), (B, T, K, H), (B, T, K, H), (B, T, N, H)]  # q, k, v, d_out
    operands = [jax.random.normal(k, s, jnp.bfloat16) for k, s in zip(keys, shapes)]
    n = roofline().matmul_size
    a, b = (jax.random.normal(k, (n, n), jnp.bfloat16) for k in jax.random.split(keys[0]))
    runs = {f"step, {name}": (lambda c=p["step"][0], args=p["step"][1]: c(*args))
            for name, p in steps.items()}  # fmt: skip
    passes = {name: layer_pass(fn) for name, fn in attends.items()}
    runs |= {f"layer, {name}": (lambda f=f: f(*operands)) for name, f in passes.items()}
    runs["bfloat16 matmul"] = lambda: ceiling_matmul(a, b)
    samples = interleaved_samples(runs, rounds)
    ceiling = 2.0 * n**3 / min(samples.pop("bfloat16 matmul"))
    seconds = {name: statistics.median(s) for name, s in samples.items()}
    first, second = attends
    flops = steps[first]["step_flops"]
    predicted = predicted_step(seconds[f"step, {first}"], seconds[f"layer, {first}"],
                               seconds[f"layer, {second}"], L)  # fmt: skip
    return {
        "steps": steps,
        "seconds": seconds,
        "ceiling": ceiling,
        "flops": flops,
        "predicted": predicted,
        "of_ceiling": {name: flops / seconds[f"step, {name}"] / ceiling for name in attends},
        "of_ceiling_unmasked": (flops - masked_flops(sizes)) / seconds[f"step, {second}"] / ceiling,
        "measured_over_predicted": predicted / seconds[f"step, {second}"],
    }


def traced_step(programs: dict, tries: int = 3) -> dict[str, dict]:
    """A step of `step_programs` traced on the device, its kernels grouped twice: "groups", as
    chapter 11 groups them (`step_speed.step_breakdown`'s rows), and "copies by file", the
    group of copies and transposes by the file whose line made each kernel ("" for none)."""
    compiled, args = programs["step"]
    seconds = breakdown.kernel_seconds(compiled, *args, tries=tries)
    kernels = breakdown.kernels_of(compiled)
    group, roof = breakdown.transformer_group, roofline()
    copies = [k for k in kernels if group(k) == "copies and transposes"]
    return {
        "groups": breakdown.grouped(kernels, seconds, group, roof),
        "copies by file": breakdown.grouped(
            copies, seconds, lambda k: pathlib.Path(k.file).name, roof
        ),
    }
