import dataclasses

import jax
import numpy as np
import pytest

from conftest import SMALL_TRANSFORMER
from jaxloops.data import Batch
from jaxloops.measure import breakdown, compiled
from jaxloops.measure.roofline import Roofline
from jaxloops.train import make_optimizer, make_train_step
from jaxloops.transformer import transformer_loss

ROOF = Roofline("test", 1e9, (1e9,), 1e8, (1e8,), 8, 4)  # 1 GFLOP/s, 100 MB/s


def test_a_matmul_kernel_has_its_flops_and_bytes():
    x, w = np.ones((3, 5), np.float32), np.ones((5, 7), np.float32)  # NumPy: nothing to compile
    kernels = breakdown.kernels_of(jax.jit(lambda x, w: x @ w).lower(x, w).compile())
    (matmul,) = [k for k in kernels if k.flops]
    assert matmul.flops == 2 * 3 * 5 * 7
    assert matmul.bytes == 4 * (3 * 5 + 5 * 7 + 3 * 7)  # both operands and the result
    assert not matmul.backward


def test_a_tpus_matmuls_written_as_convolutions_have_their_flops():
    from test_measure_compiled import tpu_text  # programs as a TPU v5e compiled them

    (matmul,) = [k for k in breakdown.kernels_of(tpu_text("sin_then_matmul")) if k.flops]
    assert matmul.name == "fusion" and matmul.flops == 2 * 3 * 5 * 7
    assert matmul.bytes == 4 * (3 * 5 + 5 * 7 + 3 * 7)  # both operands and the result
    # Attention's two products, each B K G T S H multiply-adds; a batch of 3 heads folded into
    # a spatial dim of a window over a dilated input, whose other taps meet only padding.
    flops = [k.flops for k in breakdown.kernels_of(tpu_text("naive_attention")) if k.flops]
    assert flops == [2 * 3 * 24 * 24 * 8] * 2
    # Without the dilation the 3 windows (stride 2) over the 3 heads meet 3 + 1 + 0 of them:
    # 4 / 3 of the FLOPs. Only the taps that meet the input count.
    undilated = tpu_text("naive_attention").replace(" lhs_dilate=3", "")
    assert [k.flops for k in breakdown.kernels_of(undilated) if k.flops] == [
        f * 4 / 3 for f in flops
    ]


def test_no_entry_raises():
    with pytest.raises(ValueError, match="no ENTRY computation"):
        breakdown.kernels_of("HloModule m")


@pytest.fixture(scope="module")
def step_kernels(small_transformer):
    B, T = 7, 9
    tokens = np.random.default_rng(0).integers(0, 13, (B, T)).astype(np.int32)
    optimizer = make_optimizer(1e-3, 0.1)
    step = jax.jit(make_train_step(transformer_loss, optimizer))
    # Only compiled, never run: the optimizer state's shapes lower the same program as its
    # values, without compiling a zeros program for each of them.
    opt_state = jax.eval_shape(optimizer.init, small_transformer)
    program = step.lower(small_transformer, opt_state, Batch(tokens, tokens)).compile()
    return breakdown.kernels_of(program), compiled.costs_of(program)["flops"], B * T


def test_the_train_steps_matmuls_are_grouped_by_layer_part(step_kernels):
    kernels, _, tokens = step_kernels
    c = SMALL_TRANSFORMER
    D, F, L, V = c.model_dim, c.hidden_dim, c.num_layers, c.vocab_size
    N, K, H = c.num_heads, c.num_kv_heads, c.head_dim
    flops = {}
    for k in kernels:
        group = breakdown.transformer_group(k)
        flops[group] = flops.get(group, 0.0) + k.flops
    # Forward 2 FLOPs per weight per token, backward twice that (the input's and the
    # weight's gradients); the first block's input gradient is still computed (the embedding).
    assert flops["matmul: MLP"] == 3 * 2 * tokens * 2 * D * F * L
    assert flops["matmul: query, key, value"] == 3 * 2 * tokens * D * (N + 2 * K) * H * L
    assert flops["matmul: attention out"] == 3 * 2 * tokens * N * H * D * L
    assert flops["matmul: unembedding"] == 3 * 2 * tokens * D * V
    assert {"norms", "attention", "embedding", "optimizer", "loss"} <= set(flops)


def test_a_matmul_named_after_the_copy_it_ends_with_is_still_its_layer_parts_matmul():
    # XLA:TPU (v5e, JAX 0.10.2) named six of this step's backward matmuls "copy_add_fusion"
    # (the gradient added into another and copied): grouped as copies, the query, key, value
    # matmuls had 907,200 of their 1,360,800 FLOPs. A copy that does no matmul is a copy.
    stack = ("dense", "project_qkv", "attention_block", "apply_blocks")
    op = "jit(train_step)/transpose(jvp())/dot_general"
    matmul = breakdown.Kernel("copy_add_fusion.1", "fusion", op, stack, "transformer.py", 1e5, 1e4)
    copy = dataclasses.replace(matmul, flops=0.0)
    assert breakdown.transformer_group(matmul) == "matmul: query, key, value"
    assert breakdown.transformer_group(copy) == "copies and transposes"
    # Attention's own products, written inside attention_block, are attention's, not the
    # attention output projection's.
    attention = dataclasses.replace(
        matmul, name="fusion.3", stack=("attention", *stack[2:]), file="attention.py"
    )
    assert breakdown.transformer_group(attention) == "attention"


def test_a_pallas_call_of_the_backward_pass_is_attention_not_a_transpose():
    # XLA:TPU (v5e, JAX 0.10.2) names each Pallas call after its operation: chapter 17's
    # backward kernels were "transpose_jvp_jit_pallas_attention___.3", and grouped by that
    # name they put 9.9 ms of attention a step into the copies and transposes (2026-12-07).
    op = "jit(train_step)/transpose(jvp(jit(pallas_attention)))/pallas_call"
    stack = ("backward", "pallas_attention", "attention_block", "apply_blocks")
    kernel = breakdown.Kernel("transpose_jvp_jit_pallas_attention___.3", "custom-call", op,
                              stack, "pallas_attention.py", 0.0, 5.9e7)  # fmt: skip
    assert breakdown.transformer_group(kernel) == "attention"
    # The swaps around it, and a fusion XLA named after the copy it ends with, stay copies.
    for opcode, name in [("copy", "copy.276"), ("fusion", "copy_bitcast_fusion")]:
        copy = dataclasses.replace(kernel, name=name, opcode=opcode)
        assert breakdown.transformer_group(copy) == "copies and transposes"


def test_the_kernels_hold_the_compilers_flops(step_kernels):
    kernels, flops, _ = step_kernels
    dots = sum(k.flops for k in kernels)
    # Cost analysis also counts elementwise FLOPs, which kernels_of leaves out: a few % here.
    assert 0.8 * flops < dots <= flops


def test_grouped_adds_seconds_and_predicts_at_the_roofline():
    kernels = [
        breakdown.Kernel("a", "fusion", "jit(f)/dot_general", ("f",), "x.py", 2e9, 1e6),
        breakdown.Kernel(
            "b", "fusion", "jit(f)/transpose(jvp())/mul", ("g", "h"), "x.py", 0.0, 3e8
        ),
        breakdown.Kernel("c", "fusion", "jit(f)/mul", ("g",), "x.py", 0.0, 1e8),
    ]
    rows = breakdown.grouped(kernels, {"a": 0.5, "b": 4.0, "c": 1.0}, lambda k: k.function, ROOF)
    assert list(rows) == ["g", "f"]  # largest traced time first
    assert rows["f"]["predicted"] == pytest.approx(2.0)  # compute-bound: 2e9 / 1e9
    assert rows["g"]["predicted"] == pytest.approx(4.0)  # memory-bound: 4e8 / 1e8
    assert rows["g"]["seconds"] == 5.0 and rows["g"]["kernels"] == 2
    assert kernels[1].backward and not kernels[2].backward


def test_kernel_seconds_keys_a_tpu_traces_whole_hlo_lines_by_instruction(monkeypatch):
    """A TPU's trace names each "XLA Ops" event by its instruction's whole HLO line; the
    kernels are keyed by the instruction alone, so they meet `kernels_of`'s names (the chip's
    run of 2026-12-07 traced 0.00 ms in every group of chapter 11's breakdown without this).
    A loop and a whole program stay out, as `device_op_seconds` leaves them out."""
    from types import SimpleNamespace as Fake

    from jaxloops.measure import profile

    event = lambda name, start, end: Fake(name=name, start_ns=start, end_ns=end)
    device = Fake(name="/device:TPU:0", lines=[
        Fake(name="XLA Modules", events=[event("jit_step(123)", 0, 10_000)]),
        Fake(name="XLA Ops", events=[
            event("%fusion.40 = bf16[8,128]{1,0:T(8,128)(2,1)} fusion(%p0), kind=kLoop",
                  0, 2_000),
            event("%convolution.3 = f32[8,8]{1,0} convolution(%a, %b), dim_labels=bf_io->bf",
                  2_000, 6_000),
            event("fusion.40", 6_000, 7_000),  # a name already short, as a GPU's
            event('%RPAd.1 custom-call(), custom_call_target="tpu_custom_call"', 7_000, 8_000),
            event("%while.5 = (s32[]) while(%t), body=%b", 8_000, 10_000)]),
    ])  # fmt: skip
    spans = profile.spans_of(Fake(planes=[device]))
    monkeypatch.setattr(breakdown, "trace_spans", lambda run, tries: spans)
    seconds = breakdown.kernel_seconds(lambda: 0.0, tries=1)
    assert seconds == pytest.approx({"fusion.40": 3e-6, "convolution.3": 4e-6, "RPAd.1": 1e-6})
    assert breakdown.instruction_name("fusion.12") == "fusion.12"
    raw = profile.device_op_seconds(spans)  # the reading before: whole lines as names
    assert "convolution.3" not in raw and raw["fusion.40"] == pytest.approx(1e-6)
