import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxloops
from jaxloops import measure, train


def _setup(key, sizes=(64, 11, 10)):
    params = jaxloops.init_mlp(key, sizes)
    optimizer = jaxloops.make_optimizer(1e-2, 1e-2)
    return params, optimizer, optimizer.init(params)


def test_decay_mask_selects_weight_matrices_only(key):
    params = jaxloops.init_mlp(key, (5, 7, 3))
    assert train.decay_mask(params) == {
        "dense_0": {"w": True, "b": False},
        "dense_1": {"w": True, "b": False},
    }


def test_weight_decay_leaves_biases_alone(key):
    params = jaxloops.init_mlp(key, (5, 7, 3))
    params = jax.tree.map(lambda p: p + 1.0, params)  # nonzero biases
    optimizer = jaxloops.make_optimizer(0.1, 0.5)
    zero_grads = jax.tree.map(jnp.zeros_like, params)
    updates, _ = optimizer.update(zero_grads, optimizer.init(params), params)
    # With zero gradients only the decay moves anything: -lr * wd * w on weights, 0 on biases.
    np.testing.assert_allclose(
        updates["dense_0"]["w"], -0.1 * 0.5 * params["dense_0"]["w"], rtol=1e-6
    )
    np.testing.assert_array_equal(updates["dense_1"]["b"], 0.0)


def test_train_step_compiles_once_for_a_whole_epoch(digits, key):
    params, optimizer, opt_state = _setup(key)
    step = jax.jit(jaxloops.make_train_step(jaxloops.mlp_loss, optimizer), donate_argnums=(0, 1))
    batches = jaxloops.unstack(jaxloops.epoch_batches(key, digits.train, 128))
    with measure.count_compiles() as log:
        for batch in batches:
            params, opt_state, metrics = step(params, opt_state, batch)
    assert len(batches) == 10
    assert log.names.count("jit(train_step)") == 1
    assert set(metrics) == {"loss", "accuracy"}


def test_ragged_last_batch_costs_a_second_compilation(digits, key):
    params, optimizer, opt_state = _setup(key)
    step = jax.jit(jaxloops.make_train_step(jaxloops.mlp_loss, optimizer))
    with measure.count_compiles() as log:
        for batch in jaxloops.ragged_batches(digits.train, 128):
            params, opt_state, _ = step(params, opt_state, batch)
    assert log.names.count("jit(train_step)") == 2


def test_train_step_reduces_the_loss(digits, key):
    params, optimizer, opt_state = _setup(key)
    step = jax.jit(jaxloops.make_train_step(jaxloops.mlp_loss, optimizer))
    batch = jaxloops.Batch(digits.train.x[:128], digits.train.y[:128])
    _, _, first = step(params, opt_state, batch)
    for _ in range(20):
        params, opt_state, metrics = step(params, opt_state, batch)
    assert float(metrics["loss"]) < 0.5 * float(first["loss"])


def test_bad_optimizer_settings_are_rejected():
    with pytest.raises(ValueError, match="learning_rate"):
        jaxloops.make_optimizer(0.0, 0.1)


@pytest.mark.parametrize(
    "lr, wd, bad",
    [(float("nan"), 0.0, "nan"), (1e-3, float("nan"), "nan"), (float("inf"), 0.0, "inf")],
)
def test_non_finite_optimizer_settings_are_rejected_by_value(lr, wd, bad):
    with pytest.raises(ValueError, match=bad):
        jaxloops.make_optimizer(lr, wd)
