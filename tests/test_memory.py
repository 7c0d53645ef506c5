"""Remat policies, the scan over layers and the memory formula (jaxloops.memory)."""

import contextlib
import dataclasses
import io
import math
import re

import jax
import numpy as np
import pytest
from jax.ad_checkpoint import print_saved_residuals

import jaxloops
import memory_model
from backend_marks import not_xla_tpus_choice
from conftest import SMALL_TRANSFORMER, device_bytes
from jaxloops import measure, memory
from jaxloops.measure import step_memory as measured
from memory_model import B, T


@pytest.fixture(scope="module")
def model():
    # The reference loss and gradient (jitted), as NumPy: the checks' arithmetic on them and
    # the known-wrong answers made from them run in NumPy, not as eager ops per leaf shape.
    params, batch, loss, grads = memory_model.model()
    return params, batch, float(loss), jax.device_get(grads)


def loss_grad(loss, params, batch, *args):
    value, grads = jax.jit(jax.value_and_grad(lambda p: loss(p, batch, *args)[0]))(params)
    return value, jax.device_get(grads)


@pytest.mark.parametrize("policy", [None, "nothing", "dots", "names", "everything"])
def test_every_policy_gives_the_gradient_of_the_model_within_the_float32_bound(model, policy):
    params, batch, loss, reference = model
    value, grads = loss_grad(memory.remat_loss, params, batch, policy)
    assert value == pytest.approx(loss, rel=1e-6)  # jaxloops.transformer_loss's, jitted
    terms = memory.rounding_terms(SMALL_TRANSFORMER, T)
    assert memory.close_within(reference, grads, terms)["ok"]
    # A gradient 1 % off, or a sign flipped in one leaf, is rejected by the same bound.
    assert not memory.close_within(reference, jax.tree.map(lambda g: 1.01 * g, grads), terms)["ok"]
    flipped = {**grads, "unembed": {"w": -grads["unembed"]["w"]}}
    assert not memory.close_within(reference, flipped, terms)["ok"]


def test_whole_loss_remat_gives_the_same_gradient(model):
    params, batch, _, reference = model
    _, grads = loss_grad(memory.whole_remat_loss, params, batch)
    assert memory.close_within(reference, grads, memory.rounding_terms(SMALL_TRANSFORMER, T))["ok"]


def test_the_scan_over_layers_has_the_unrolled_loss_and_gradient(model):
    params, batch, loss, reference = model
    stacked = jax.jit(memory.stack_blocks)(params)  # one program, not a stack per leaf
    assert stacked["blocks"]["mlp"]["w_in"].shape == (2, 30, 21)  # (L, D, F)
    for policy in (None, "nothing"):
        value, grads = loss_grad(memory.scanned_loss, stacked, batch, policy)
        assert value == pytest.approx(loss, rel=1e-6)
        unstacked = {k: v for k, v in grads.items() if k != "blocks"}
        for i in range(SMALL_TRANSFORMER.num_layers):
            unstacked[f"block_{i}"] = jax.tree.map(lambda a, i=i: a[i], grads["blocks"])
        terms = memory.rounding_terms(SMALL_TRANSFORMER, T)
        assert memory.close_within(reference, unstacked, terms)["ok"]
        # The layers in the wrong order are a different model: rejected.
        swapped = {**unstacked, "block_0": unstacked["block_1"], "block_1": unstacked["block_0"]}
        assert not memory.close_within(reference, swapped, terms)["ok"]


def test_the_parameter_count_is_the_parameter_tree(model):
    params, _, _, _ = model
    assert memory.parameter_count(SMALL_TRANSFORMER) == sum(a.size for a in jax.tree.leaves(params))
    assert memory.state_bytes(SMALL_TRANSFORMER)["adam"] == 2 * memory.tree_bytes(params)


def test_the_activation_formula_counts_each_term():
    c = SMALL_TRANSFORMER
    D, F, N, K, H, V = 30, 21, 10, 5, 3, 13
    per_layer = (
        4 * B * T * D + B * T * (2 * N + 2 * K) * H + B * N * T * T + 2 * B * T * F + 2 * B * T
    )
    got = memory.activation_bytes(c, B, T)
    assert got["per_layer"] == 4 * per_layer
    assert got["head"] == 4 * (2 * B * T * D + B * T * V)
    deeper = memory.activation_bytes(dataclasses.replace(c, num_layers=5), B, T)
    assert deeper["total"] - got["total"] == 3 * got["per_layer"]
    assert memory.activation_bytes(c, B, T, itemsize=2)["total"] == got["total"] // 2


def test_the_formula_bounds_the_compiled_gradient_and_autodiff_saves_the_scores():
    row = measured.formula_sweep(SMALL_TRANSFORMER, [(B, T, 2)])[0]
    # Shape bytes: a device that pads its arrays to tiles (a TPU) only adds to the compiled.
    assert row["formula"] <= row["compiled"]
    census = measured.residual_census(SMALL_TRANSFORMER, B, T)
    assert census["bytes"] == row["autodiff"] and census["scores"] >= 1 and census["hidden"] > 2
    # print_saved_residuals' lines, parsed: the (B, N, T, S) softmax weights are among them.
    shapes = [shape for _, shape, _ in measured.saved_residuals(SMALL_TRANSFORMER, B, T)]
    assert any(
        s[-2:] == (T, T) and math.prod(s) == B * SMALL_TRANSFORMER.num_heads * T * T for s in shapes
    )


@not_xla_tpus_choice(
    "the compiled gradient kept 2,072,576 bytes against autodiff's 260,490 (8.0x): at D 30, "
    "H 3, T 7 each array is padded to (8, 128) tiles, and the (B, T, N, H) arrays are also "
    "copied into a second layout for the chip's matmuls, which autodiff's list does not name"
)
def test_autodiff_saves_more_than_the_compiled_gradient_keeps():
    row = measured.formula_sweep(SMALL_TRANSFORMER, [(B, T, 2)])[0]
    assert row["compiled"] <= row["autodiff"]


def test_compiling_without_llvm_optimisation_assigns_the_same_bytes():
    fast = measured.grad_program(SMALL_TRANSFORMER, B, T)  # COMPILE_ONLY
    params, tokens = measured.model_shapes(SMALL_TRANSFORMER, B, T, scanned=False)
    grad = jax.value_and_grad(lambda p, b: measured.loss_of()(p, b)[0])
    full = measured.measure_compiled(grad, params, tokens, options={})
    assert fast.temp == full.temp > 0 and fast.flops == full.flops


def test_remat_under_the_scan_keeps_less():
    c = dataclasses.replace(SMALL_TRANSFORMER, num_layers=3)
    none = measured.grad_program(c, B, T, scanned=True)
    nothing = measured.grad_program(c, B, T, scanned=True, policy="nothing")
    assert nothing.temp < none.temp
    assert nothing.flops > none.flops  # it recomputes


def test_the_scanned_program_does_not_grow_with_layers_and_the_unrolled_one_does():
    rows = measured.compile_sweep(SMALL_TRANSFORMER, B, T, (2, 3))
    added = {
        kind: measured.growth(rows, kind, "instructions") - 1 for kind in ("scanned", "unrolled")
    }
    assert added["unrolled"] > 0.25  # 3 blocks' code, not 2
    # The scanned program holds one block's code whatever L: a third block adds none of it.
    # (XLA:CPU's program is the same; a TPU v5e's, 1.6 % larger at L = 3, its layouts chosen
    # per shape: a tenth of a block is the margin.)
    assert added["scanned"] < added["unrolled"] / 10
    assert all(r["compile s"] > 0 for r in rows)


def test_a_policy_that_does_not_exist_is_refused_by_name():
    with pytest.raises(ValueError, match="'dots_saveable'.*known: nothing, dots, names"):
        memory.remat_policy("dots_saveable")


def test_max_error_is_the_largest_difference_and_close_within_holds_exactly_at_its_bound():
    a = {"w": np.array([[1.0, -3.0]], np.float32), "b": np.array([0.5], np.float32)}
    b = {"w": np.array([[1.5, -3.0]], np.float32), "b": np.array([0.25], np.float32)}
    assert memory.max_error(a, b) == (0.5, 3.0)  # max |a - b| over leaves, max |a|
    # Bounds of terms * eps * 3 on either side of the error 0.5: one term apart decides.
    terms = math.ceil(0.5 / (float(np.finfo(np.float32).eps) * 3.0))
    assert memory.close_within(a, b, terms)["ok"]
    assert not memory.close_within(a, b, terms - 1)["ok"]


def test_close_within_rejects_a_bound_of_no_terms():
    with pytest.raises(ValueError, match="terms must be >= 1, got 0"):
        memory.close_within(np.ones(2), np.ones(2), 0)


# `rounding.backend_eps(("matmul",))` on a TPU v5e at JAX's default precision, where a float32
# matmul is one bfloat16 pass (rounding.py): the error chapter 14's bound adds per matmul there.
TPU_DEFAULT_MATMUL_EPS = 3e-3
EPS = float(np.finfo(np.float32).eps)


def test_rounding_terms_add_each_matmuls_error_beyond_float32s_and_refuse_a_void_one():
    c = SMALL_TRANSFORMER
    terms = memory.rounding_terms(c, T)
    assert memory.rounding_matmuls(c) == 5 * c.num_layers + 1
    # A float32 matmul (a CPU's, or a TPU's at "highest", 6e-8) adds nothing to the bound.
    assert memory.rounding_terms(c, T, matmul_eps=EPS) == terms
    assert memory.rounding_terms(c, T, matmul_eps=6e-8) == terms
    added = memory.rounding_terms(c, T, extra=5, matmul_eps=TPU_DEFAULT_MATMUL_EPS) - terms - 5
    assert added == math.ceil((5 * c.num_layers + 1) * (TPU_DEFAULT_MATMUL_EPS / EPS - 1))
    with pytest.raises(ValueError, match="matmul_eps must be a positive relative error, got 0"):
        memory.rounding_terms(c, T, matmul_eps=0)


def bfloat16_pass(dot_general):
    """`lax.dot_general` as a TPU runs a float32 matmul at JAX's default precision: its
    float32 inputs rounded to bfloat16, the products (exact in float32) summed in float32."""

    def dot(lhs, rhs, *args, **kwargs):
        if lhs.dtype == rhs.dtype == np.float32:
            bf16, f32 = jax.numpy.bfloat16, np.float32
            lhs, rhs = lhs.astype(bf16).astype(f32), rhs.astype(bf16).astype(f32)
        return dot_general(lhs, rhs, *args, **kwargs)

    return dot


def test_a_bfloat16_pass_gradient_is_within_the_widened_bound_and_a_wrong_one_is_not(
    model, monkeypatch
):
    params, batch, _, reference = model
    from jax._src.lax import lax as lax_module  # what jnp.matmul and jnp.einsum call

    # jnp.matmul is jitted: a trace cached by an earlier test (any order, any worker) would
    # never call the patch, and one made under it must not serve later tests: clear both ways
    monkeypatch.setattr(lax_module, "dot_general", bfloat16_pass(lax_module.dot_general))
    jax.clear_caches()
    _, grads = loss_grad(memory.remat_loss, params, batch)
    monkeypatch.undo()
    jax.clear_caches()
    float32_terms = memory.rounding_terms(SMALL_TRANSFORMER, T)
    terms = memory.rounding_terms(SMALL_TRANSFORMER, T, matmul_eps=TPU_DEFAULT_MATMUL_EPS)
    # The passes' rounding is beyond float32's bound (here 0.3 % of max|g|, 80x it) ...
    assert not memory.close_within(reference, grads, float32_terms)["ok"]
    # ... and within the bound that counts it, which still rejects a known-wrong gradient:
    # a mean over two micro-batches left undivided, or a sign flipped in one leaf.
    assert memory.close_within(reference, grads, terms)["ok"]
    assert not memory.close_within(reference, jax.tree.map(lambda g: 2 * g, grads), terms)["ok"]
    flipped = {**grads, "unembed": {"w": -grads["unembed"]["w"]}}
    assert not memory.close_within(reference, flipped, terms)["ok"]


def test_close_within_adds_the_rounding_of_each_update_to_the_parameters():
    params = np.array([1.0, 0.5], np.float32)
    # Two updates 2^-29 apart on either side of half a spacing of 1.0 (2^-24): their sums
    # round one spacing (2^-23) apart, far more than the updates' own difference.
    updates = [np.array([2.0**-24 + sign * 2.0**-30, 0.0], np.float32) for sign in (1, -1)]
    new = [{"w": params + u} for u in updates]  # float32 sums, each rounded once
    moves = [{"w": n["w"] - params} for n in new]
    assert moves[0]["w"][0] - moves[1]["w"][0] == 2.0**-23
    assert not memory.close_within(moves[0], moves[1], 1)["ok"]
    assert memory.close_within(moves[0], moves[1], 1, added_to=new[0])["ok"]
    # A move three times as large is still told apart.
    tripled = {"w": 3 * moves[0]["w"]}
    assert not memory.close_within(moves[0], tripled, 1, added_to=new[0])["ok"]


def test_remat_keeps_the_block_inputs_and_one_block():
    c = SMALL_TRANSFORMER
    full = memory.activation_bytes(c, B, T)
    remat = memory.remat_activation_bytes(c, B, T)
    assert remat == 4 * c.num_layers * B * T * c.model_dim + full["per_layer"] + full["head"]
    assert remat < full["total"]


def test_step_bytes_counts_each_technique():
    c = SMALL_TRANSFORMER
    P, state = memory.parameter_count(c), sum(memory.state_bytes(c).values())
    full = memory.activation_bytes(c, B, T)["total"]
    assert memory.step_bytes(c, B, T) == (state, full)
    assert memory.step_bytes(c, B, T, micro=3) == (
        state + 4 * P,  # the float32 gradient sum
        memory.activation_bytes(c, B // 3, T)["total"],
    )
    assert memory.step_bytes(c, B, T, itemsize=2) == (state + 2 * P, full // 2)
    assert memory.step_bytes(c, B, T, remat="nothing")[1] == memory.remat_activation_bytes(c, B, T)
    names = memory.step_bytes(c, B, T, remat="names")[1]  # the residual stream too, per block
    assert names == memory.remat_activation_bytes(c, B, T) + 4 * c.num_layers * B * T * c.model_dim
    with pytest.raises(ValueError, match="M = 4 micro-batches must be >= 1 and divide the batch 6"):
        memory.step_bytes(c, B, T, micro=4)


def test_largest_is_the_largest_multiple_that_fits():
    assert memory.largest(lambda n: n * 10 + 5 <= 100) == 9  # 95 fits, 105 does not
    assert memory.largest(lambda n: n <= 10, step=4) == 8
    assert memory.largest(lambda n: False) == 0
    assert memory.largest(lambda n: n < 2**20, limit=100) == 100


@pytest.mark.parametrize(
    "technique", [{}, {"remat": "nothing"}, {"remat": "dots"}, {"micro": 2}, {"itemsize": 2}]
)
def test_the_biggest_model_fits_and_one_more_layer_or_example_does_not(technique):
    c, budget, margin = SMALL_TRANSFORMER, 2 * 10**6, 2.0
    got = memory.biggest_model(c, B, T, budget, margin=margin, **technique)

    def held(config, batch):
        fixed, residuals = memory.step_bytes(config, batch, T, **technique)
        return fixed + margin * residuals

    deeper = dataclasses.replace(c, num_layers=got["L"] + 1)
    assert held(dataclasses.replace(c, num_layers=got["L"]), B) <= budget < held(deeper, B)
    step = technique.get("micro", 1)
    assert got["B"] % step == 0 and held(c, got["B"]) <= budget < held(c, got["B"] + step)
    with pytest.raises(ValueError, match="need margin > 0 and budget >= 1 byte, got 0, 1000"):
        memory.biggest_model(c, B, T, 1000, margin=0, **technique)


@pytest.mark.parametrize("policy", ["nothing", "names", "dots"])
def test_kept_per_block_is_what_autodiff_saves_under_each_policy(policy):
    # The reference: print_saved_residuals of one checkpointed block, its input x and what
    # the policy saves inside it (the parameters, also arguments, left out).
    c = SMALL_TRANSFORMER
    params = jax.eval_shape(lambda k: jaxloops.init_transformer(k, c), jax.random.key(0))
    x = jax.ShapeDtypeStruct((B, T, c.model_dim), np.float32)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        print_saved_residuals(
            lambda p, x: memory.remat_block(policy)(p, x).sum(), params["block_0"], x
        )
    shapes = re.findall(r"^f32\[([\d,]*)\] (?!from the argument p\[)", printed.getvalue(), re.M)
    saved = sum(math.prod(int(d) for d in shape.split(",")) for shape in shapes)
    assert memory.kept_per_block(c, B, T, policy) == saved
    with pytest.raises(
        ValueError, match="counts remat policies nothing, names, dots; got 'everything'"
    ):
        memory.kept_per_block(c, B, T, "everything")


def test_held_bytes_are_the_gradients_program_and_adams_moments(model):
    c = SMALL_TRANSFORMER
    m = measured.grad_program(c, 8, T)
    held = measured.held_bytes(c, 8, T, measured.TECHNIQUES["none"])
    assert held == m.temp + m.argument + m.output + 2 * 4 * memory.parameter_count(c)
    # Less a matmul library's workspace (a GPU's cuBLAS), what is held is the model's own: at
    # most twice its arrays (parameters, gradients and Adam's two moments, the tokens and the
    # residuals autodiff saves), each as this device lays it out. A TPU pads each to its
    # tiles: a TPU v5e held 3,045,088 bytes here against 3,212,800 of such arrays; a CPU
    # about 340,000 against 487,240.
    dtypes = {4: np.float32, 1: np.bool_}
    residuals = measured.saved_residuals(c, 8, T)
    arrays = 4 * measure.allocated_bytes(model[0]) + 2 * device_bytes((8, T), np.int32)
    arrays += sum(device_bytes(shape, dtypes[itemsize]) for itemsize, shape, _ in residuals)
    own = held - measured.library_scratch_bytes()
    assert 0 < own <= 2 * arrays, (own, arrays)
    # An H200's cuBLAS workspace (35.2 MB, `library_scratch_bytes`) left in is rejected.
    assert not own + 35.2e6 <= 2 * arrays


def test_the_published_table_uses_each_boards_memory():
    assert measured.published_peaks("NVIDIA H200").memory_bytes == 141e9
    rows = measured.published_biggest_models(SMALL_TRANSFORMER, 8, T, 0.9, 2.5, ["H100", "H200"])
    h100, h200 = ({r["technique"]: r for r in rows if b in r["board"]} for b in ("H100", "H200"))
    assert h200["none"]["budget GB"] == pytest.approx(0.9 * 141)
    assert all(h200[k]["safe L"] >= h100[k]["safe L"] for k in h100)


def test_a_gpu_run_without_bf16_steps_records_no_row():
    assert measured.recorded_bf16_steps(None) is None
    assert measured.recorded_bf16_steps({"device": "NVIDIA H200"}) is None
    rows = [{"dtype": "bfloat16", "step ms": 1.5}]
    assert measured.recorded_bf16_steps({"memory_steps": rows}) == rows


def test_the_census_counts_each_array_once_where_scores_and_hidden_have_one_size():
    # N * T = F: the (B, N, T, S) weights and the (B, T, F) hidden layer have the same size.
    # Counted by size (the census before), every such array was counted in both, so its
    # check that more than one score-sized array is saved per block could not fail.
    length, batch = 7, 3
    config = dataclasses.replace(
        SMALL_TRANSFORMER, model_dim=6, num_heads=2, num_kv_heads=1, hidden_dim=2 * length,
        max_len=length,
    )  # fmt: skip
    census = measured.residual_census(config, batch, length)
    shapes = [s for _, s, _ in measured.saved_residuals(config, batch, length)]
    same_size = sum(math.prod(s) == batch * 2 * length**2 for s in shapes)
    assert (census["scores"] + census["hidden"]) * config.num_layers == same_size
    assert census["scores"] == 1  # the exponentials `attention` mixes the values with
    assert census["hidden"] > 2


def test_a_margin_below_one_predicts_a_bigger_model():
    c, budget = SMALL_TRANSFORMER, 2**20
    at = {m: memory.biggest_model(c, B, T, budget, margin=m) for m in (0.5, 1.0, 2.0)}
    # A compiled step that keeps less than the formula counts (XLA:TPU's can) fits more.
    assert at[0.5]["L"] > at[1.0]["L"] > at[2.0]["L"] and at[0.5]["B"] > at[1.0]["B"]
