"""Remat policies, the scan over layers and the memory formula (jaxloops.memory)."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

import jaxloops
from conftest import SMALL_TRANSFORMER
from jaxloops import memory

B, T = 3, 7


@pytest.fixture(scope="module")
def model():
    params = jaxloops.init_transformer(jax.random.key(0), SMALL_TRANSFORMER)
    tokens = jax.random.randint(jax.random.key(1), (B, T + 1), 0, SMALL_TRANSFORMER.vocab_size)
    batch = jaxloops.Batch(tokens[:, :-1], tokens[:, 1:])
    grads = jax.grad(lambda p: jaxloops.transformer_loss(p, batch)[0])(params)
    return params, batch, grads


def loss_grad(loss, params, batch, *args):
    return jax.jit(jax.value_and_grad(lambda p: loss(p, batch, *args)[0]))(params)


@pytest.mark.parametrize("policy", [None, "nothing", "dots", "names", "everything"])
def test_every_policy_gives_the_gradient_of_the_model_within_the_float32_bound(model, policy):
    params, batch, reference = model
    value, grads = loss_grad(memory.remat_loss, params, batch, policy)
    assert value == pytest.approx(float(jaxloops.transformer_loss(params, batch)[0]), rel=1e-6)
    terms = memory.rounding_terms(SMALL_TRANSFORMER, T)
    assert memory.close_within(reference, grads, terms)["ok"]
    # A gradient 1 % off, or a sign flipped in one leaf, is rejected by the same bound.
    assert not memory.close_within(reference, jax.tree.map(lambda g: 1.01 * g, grads), terms)["ok"]
    flipped = {**grads, "unembed": {"w": -grads["unembed"]["w"]}}
    assert not memory.close_within(reference, flipped, terms)["ok"]


def test_whole_loss_remat_gives_the_same_gradient(model):
    params, batch, reference = model
    _, grads = loss_grad(memory.whole_remat_loss, params, batch)
    assert memory.close_within(reference, grads, memory.rounding_terms(SMALL_TRANSFORMER, T))["ok"]


def test_the_scan_over_layers_has_the_unrolled_loss_and_gradient(model):
    params, batch, reference = model
    stacked = memory.stack_blocks(params)
    assert stacked["blocks"]["mlp"]["w_in"].shape == (2, 30, 21)  # (L, D, F)
    for policy in (None, "nothing"):
        value, grads = loss_grad(memory.scanned_loss, stacked, batch, policy)
        assert value == pytest.approx(float(jaxloops.transformer_loss(params, batch)[0]), rel=1e-6)
        unstacked = {k: v for k, v in grads.items() if k != "blocks"}
        for i in range(SMALL_TRANSFORMER.num_layers):
            unstacked[f"block_{i}"] = jax.tree.map(lambda a, i=i: a[i], grads["blocks"])
        terms = memory.rounding_terms(SMALL_TRANSFORMER, T)
        assert memory.close_within(reference, unstacked, terms)["ok"]
        # The layers in the wrong order are a different model: rejected.
        swapped = {**unstacked, "block_0": unstacked["block_1"], "block_1": unstacked["block_0"]}
        assert not memory.close_within(reference, swapped, terms)["ok"]


def test_the_parameter_count_is_the_parameter_tree(model):
    params, _, _ = model
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


def test_the_formula_bounds_the_compiled_gradient_from_below():
    from jaxloops.measure import memory as measured

    row = measured.formula_sweep(SMALL_TRANSFORMER, [(B, T, 2)])[0]
    assert row["formula"] <= row["compiled"] <= row["autodiff"]


def test_remat_under_the_scan_keeps_less():
    from jaxloops.measure import memory as measured

    c = dataclasses.replace(SMALL_TRANSFORMER, num_layers=3)
    none = measured.grad_program(c, B, T, scanned=True)
    nothing = measured.grad_program(c, B, T, scanned=True, policy="nothing")
    assert nothing.temp < none.temp
    assert nothing.flops > none.flops  # it recomputes


def test_a_policy_that_does_not_exist_is_refused_by_name():
    with pytest.raises(ValueError, match="'dots_saveable'.*known: nothing, dots, names"):
        memory.remat_policy("dots_saveable")


def test_close_within_rejects_a_bound_of_no_terms():
    with pytest.raises(ValueError, match="terms must be >= 1, got 0"):
        memory.close_within(jnp.ones(2), jnp.ones(2), 0)


def test_remat_keeps_the_block_inputs_and_one_block():
    c = SMALL_TRANSFORMER
    full = memory.activation_bytes(c, B, T)
    remat = memory.remat_activation_bytes(c, B, T)
    assert remat == 4 * c.num_layers * B * T * c.model_dim + full["per_layer"] + full["head"]
    assert remat < full["total"]


def test_largest_fitting_is_the_largest_and_refuses_a_margin_below_one():
    assert memory.largest_fitting(10, 5, 100) == 9  # 9 * 10 + 5 = 95 <= 100 < 105
    assert memory.largest_fitting(10, 5, 100, margin=2.5) == 3  # 3 * 25 + 5 = 80 < 105
    assert memory.largest_fitting(10, 200, 100) == 0
    with pytest.raises(ValueError, match="got 10, 0.5"):
        memory.largest_fitting(10, 5, 100, margin=0.5)


def test_the_biggest_batch_table_multiplies_accumulation_by_m():
    from jaxloops.measure import memory as measured

    rows = measured.biggest_batch_table(SMALL_TRANSFORMER, T, 10**7, margin=2.0, micro=4)
    none, remat, acc, both = rows
    assert remat["largest B"] > none["largest B"] >= none["safe B"]
    assert acc["largest B"] % 4 == 0 and acc["largest B"] > none["largest B"]
    assert both["safe B"] >= acc["safe B"]
