import functools

import jax
import numpy as np
import optax
import pytest

import jaxloops
from jaxloops import measure, train

# One optimizer for the module, its init and plain step jitted once: the tests that do not
# count compilations share their compiled programs.
OPTIMIZER = jaxloops.make_optimizer(1e-2, 1e-2)
INIT = jax.jit(OPTIMIZER.init)
STEP = jax.jit(jaxloops.make_train_step(jaxloops.mlp_loss, OPTIMIZER))


def _setup(key, sizes=(64, 11, 10)):
    params = jaxloops.init_mlp(key, sizes)
    return params, OPTIMIZER, INIT(params)


def _first(data, n):
    """The first n examples, sliced on the host (an eager slice compiles per shape)."""
    return jaxloops.Batch(*(jax.device_put(np.asarray(a)[:n]) for a in data))


def test_decay_mask_selects_weight_matrices_only(key):
    params = jaxloops.init_mlp(key, (64, 11, 10))  # _setup's widths: its init compiled once
    assert train.decay_mask(params) == {
        "dense_0": {"w": True, "b": False},
        "dense_1": {"w": True, "b": False},
    }


def test_weight_decay_leaves_biases_alone(key):
    params = jaxloops.init_mlp(key, (64, 11, 10))  # _setup's widths: its init compiled once
    params = jax.tree.map(lambda p: np.asarray(p) + 1.0, params)  # nonzero biases
    optimizer = jaxloops.make_optimizer(0.1, 0.5)
    zero_grads = jax.tree.map(np.zeros_like, params)
    # the first update from a fresh state, init and update as one program
    first_update = jax.jit(lambda grads, p: optimizer.update(grads, optimizer.init(p), p)[0])
    updates = first_update(zero_grads, params)
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
    step = STEP
    batch = _first(digits.train, 128)
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


def test_the_step_count_is_the_optimizers_counter(digits, key):
    params, optimizer, opt_state = _setup(key)
    step = STEP
    batch = _first(digits.train, 128)  # the batch of the test above: STEP compiled once
    assert int(train.step_count(opt_state)) == 0
    for _ in range(3):
        params, opt_state, _ = step(params, opt_state, batch)
    assert int(train.step_count(opt_state)) == 3
    with pytest.raises(ValueError, match="no step counter"):
        train.step_count(optax.sgd(0.1).init(params))  # plain SGD counts nothing


def test_the_keyed_step_without_dropout_is_the_plain_step(digits, key):
    params, optimizer, opt_state = _setup(key)
    batch = _first(digits.train, 128)  # STEP's batch in the tests above: compiled once
    plain = STEP
    keyed = jax.jit(train.make_keyed_train_step(jaxloops.mlp_loss, optimizer))
    want = plain(params, opt_state, batch)
    got = keyed(params, opt_state, batch, jax.random.key(5))
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_keyed_step_draws_from_fold_in_of_its_key_and_the_count(digits, key):
    params, optimizer, opt_state = _setup(key)
    batch = _first(digits.train, 32)

    def loss(params, batch, key):  # reports the number it drew, to see which key it got
        value, aux = jaxloops.mlp_loss(params, batch)
        return value, {**aux, "draw": jax.random.uniform(key)}

    step = jax.jit(train.make_keyed_train_step(loss, optimizer))
    run_key, draws = jax.random.key(5), []
    for _ in range(3):
        params, opt_state, metrics = step(params, opt_state, batch, run_key)
        draws.append(float(metrics["draw"]))
    want = [float(jax.random.uniform(jax.random.fold_in(run_key, t))) for t in range(3)]
    assert draws == want and len(set(draws)) == 3
    # An off-by-one count (t + 1) or the raw key would draw other numbers: the rule is exact.
    assert draws[:2] != want[1:]
    assert draws[0] != float(jax.random.uniform(run_key))


def test_the_keyed_step_with_dropout_is_deterministic_given_key_and_state(digits, key):
    params, optimizer, opt_state = _setup(key)
    batch = _first(digits.train, 32)
    loss = functools.partial(jaxloops.mlp_loss, dropout_rate=0.5)
    step = jax.jit(train.make_keyed_train_step(loss, optimizer))
    first = step(params, opt_state, batch, jax.random.key(5))[0]["dense_0"]["w"]
    again = step(params, opt_state, batch, jax.random.key(5))[0]["dense_0"]["w"]
    other = step(params, opt_state, batch, jax.random.key(6))[0]["dense_0"]["w"]
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)
