"""Gradient accumulation (jaxloops.accumulate)."""

import jax
import numpy as np
import optax
import pytest

import jaxloops
import memory_model
from conftest import SMALL_TRANSFORMER
from jaxloops import accumulate, memory
from jaxloops.measure import step_memory as measured
from memory_model import B, T


@pytest.fixture(scope="module")
def model():
    # The reference gradient as NumPy: the checks' arithmetic, and the known-wrong answers
    # made from it, run in NumPy rather than as eager ops per leaf shape.
    params, batch, loss, grads = memory_model.model()
    return params, batch, loss, jax.device_get(grads)


def loss_fn(params, batch):
    return jaxloops.transformer_loss(params, batch)


@pytest.mark.parametrize("M", [1, 2, 3, 6])
def test_accumulation_equals_the_full_batch_and_a_missing_one_over_m_does_not(model, M):
    params, batch, loss, reference = model
    acc_loss, aux, grads = jax.jit(lambda p, b: accumulate.accumulated_grads(loss_fn, p, b, M))(
        params, batch
    )
    grads = jax.device_get(grads)
    terms = memory.rounding_terms(SMALL_TRANSFORMER, T, extra=B * T)
    assert memory.close_within(reference, grads, terms)["ok"]
    assert float(acc_loss) == pytest.approx(float(loss), rel=1e-6)
    assert set(aux) == {"accuracy"}
    if M > 1:
        summed = jax.tree.map(lambda g: M * g, grads)  # the known-wrong sum of the M gradients
        assert not memory.close_within(reference, summed, terms)["ok"]


def test_a_mean_of_means_over_unequal_batches_is_rejected(model):
    params, batch, _, reference = model
    batch = jax.device_get(batch)
    parts = [jax.tree.map(lambda a: a[:1], batch), jax.tree.map(lambda a: a[1:], batch)]  # 1 + 5
    grad = jax.jit(jax.grad(lambda p, b: loss_fn(p, b)[0]))
    grads = [jax.device_get(grad(params, b)) for b in parts]
    mean_of_means = jax.tree.map(lambda a, b: (a + b) / 2, *grads)
    weighted = jax.tree.map(lambda a, b: (1 * a + 5 * b) / 6, *grads)
    terms = memory.rounding_terms(SMALL_TRANSFORMER, T, extra=B * T)
    assert memory.close_within(reference, weighted, terms)["ok"]
    assert not memory.close_within(reference, mean_of_means, terms)["ok"]


def test_the_accumulating_step_and_multisteps_take_the_same_update(model):
    params, batch, _, _ = model
    sgd = optax.sgd(0.1)
    ours, _, metrics = jax.jit(accumulate.make_accumulating_step(loss_fn, sgd, 3))(
        params, sgd.init(params), batch
    )
    multi = accumulate.multi_steps(sgd, 3)
    step = jax.jit(jaxloops.make_train_step(loss_fn, multi))
    theirs, state = params, jax.jit(multi.init)(params)  # one program, not one per leaf
    # The micro-batches split in NumPy (the same reshape and rows), the updates compared there.
    for i, micro in enumerate(jaxloops.unstack(accumulate.split_micro(jax.device_get(batch), 3))):
        before = jax.device_get(theirs)
        theirs, state, _ = step(theirs, state, micro)
        if i < 2:  # no update until the M-th call
            assert all(
                jax.tree.leaves(jax.tree.map(np.array_equal, jax.device_get(theirs), before))
            )
    moved = jax.tree.map(np.subtract, jax.device_get(ours), jax.device_get(params))
    moved_multi = jax.tree.map(np.subtract, jax.device_get(theirs), jax.device_get(params))
    terms = memory.rounding_terms(SMALL_TRANSFORMER, T, extra=B * T)
    new = jax.device_get(ours)  # each run rounds params + update once: the bound adds it
    assert memory.close_within(moved, moved_multi, terms, added_to=new)["ok"]
    tripled = jax.tree.map(lambda m: 3 * m, moved_multi)
    assert not memory.close_within(moved, tripled, terms, added_to=new)["ok"]
    extra = memory.tree_bytes(state) - memory.tree_bytes(sgd.init(params))
    assert memory.tree_bytes(params) <= extra <= memory.tree_bytes(params) + 64  # + counters


def test_accumulation_keeps_less_scratch_as_m_grows():
    one = measured.grad_program(SMALL_TRANSFORMER, B, T)
    three = measured.grad_program(SMALL_TRANSFORMER, B, T, micro=3)
    assert three.temp < one.temp


@pytest.mark.parametrize("M", [4, 5, 0, -2, 2.0])
def test_an_m_that_does_not_divide_the_batch_is_refused_by_value(model, M):
    _, batch, _, _ = model
    with pytest.raises(ValueError, match=f"{M!r}|batch of 6 does not split into {M} equal"):
        accumulate.split_micro(batch, M)


def test_the_step_builders_refuse_a_bad_m():
    with pytest.raises(ValueError, match="got 0"):
        accumulate.make_accumulating_step(loss_fn, optax.sgd(0.1), 0)
    with pytest.raises(ValueError, match="got 1.5"):
        accumulate.multi_steps(optax.sgd(0.1), 1.5)
