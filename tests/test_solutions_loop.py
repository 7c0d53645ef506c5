"""The book's exercise solutions, each checked against a reference."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from sklearn import metrics

import jaxloops
from jaxloops import measure
from jaxloops.solutions import loop as exercises


# Chapter 1.
def test_traced_shapes_records_exactly_the_cache_misses():
    f32, i32 = jnp.float32, jnp.int32
    inputs = [
        jnp.ones(3, f32),
        jnp.zeros(3, f32),
        jnp.ones(5, f32),
        jnp.ones(3, f32),
        jnp.ones(3, i32),
    ]
    traced = exercises.traced_shapes(lambda x: x * 2, inputs)
    assert traced == [((3,), "float32"), ((5,), "float32"), ((3,), "int32")]


# Chapter 2.
@pytest.mark.parametrize("n, batch_size", [(21, 7), (23, 7), (11, 3), (13, 13)])
def test_ragged_compile_count_matches_counted_compilations(n, batch_size):
    data = jaxloops.Batch(jnp.ones((n, 5)), jnp.zeros(n, jnp.int32))
    total = jax.jit(lambda batch: batch.x.sum() + batch.y.sum())
    with measure.count_compiles() as log:
        for batch in jaxloops.ragged_batches(data, batch_size):
            total(batch)
    assert log.names.count("jit(<lambda>)") == exercises.ragged_compile_count(n, batch_size)


def test_ragged_compile_count_refuses_a_batch_larger_than_the_data():
    with pytest.raises(ValueError, match="batch size 9"):
        exercises.ragged_compile_count(7, 9)


@pytest.mark.parametrize("n, batch_size", [(23, 7), (21, 7), (17, 5)])
def test_an_epoch_uses_each_example_at_most_once_and_drops_the_remainder(key, n, batch_size):
    counts = exercises.epoch_example_counts(key, n, batch_size)
    assert set(np.unique(counts)) <= {0, 1}
    assert (counts == 0).sum() == n % batch_size


def test_different_keys_drop_different_examples():
    dropped = [
        np.flatnonzero(exercises.epoch_example_counts(jax.random.key(s), 23, 7) == 0)
        for s in range(5)
    ]
    assert len({tuple(d) for d in dropped}) > 1


# Chapter 3.
def test_mlp_parameter_count_equals_the_leaves_of_init_mlp(key):
    sizes = (7, 11, 5, 3)
    params = jaxloops.init_mlp(key, sizes)
    assert exercises.mlp_parameter_count(sizes) == sum(p.size for p in jax.tree.leaves(params))


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
def test_label_smoothing_equals_optax(key, smoothing):
    logits = 3 * jax.random.normal(key, (5, 7))
    labels = jnp.array([0, 6, 3, 3, 1])
    targets = optax.smooth_labels(jax.nn.one_hot(labels, 7), smoothing)
    expected = optax.softmax_cross_entropy(logits, targets).mean()
    np.testing.assert_allclose(
        exercises.label_smoothed_cross_entropy(logits, labels, smoothing), expected, rtol=1e-6
    )


def test_label_smoothing_is_stable_and_reduces_to_cross_entropy():
    logits = jnp.array([[10.0, 20.0, 1000.0]])
    labels = jnp.array([2])
    smoothed = exercises.label_smoothed_cross_entropy(logits, labels, 0.0)
    assert jnp.isfinite(smoothed)
    np.testing.assert_allclose(smoothed, jaxloops.cross_entropy(logits, labels), atol=1e-6)
    assert jnp.isfinite(exercises.label_smoothed_cross_entropy(logits, labels, 0.1))


# Chapter 4.
def test_cross_entropy_gradient_is_softmax_minus_one_hot(key):
    logits = jax.random.normal(key, (5, 7))
    labels = jnp.array([0, 6, 3, 3, 1])
    autodiff = jax.grad(jaxloops.cross_entropy)(logits, labels)
    np.testing.assert_allclose(
        exercises.softmax_cross_entropy_grad(logits, labels), autodiff, atol=1e-7
    )


def test_momentum_by_hand_equals_optax_sgd_with_momentum(key):
    params = jaxloops.init_mlp(key, (5, 7, 3))
    optimizer = optax.sgd(0.1, momentum=0.9)
    opt_state = optimizer.init(params)
    by_hand, velocity = params, jax.tree.map(jnp.zeros_like, params)
    for step in range(3):
        grads = jax.tree.map(
            lambda p, step=step: jnp.sin(p * (step + 1)), by_hand
        )  # a different gradient each step
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        by_hand, velocity = exercises.momentum_update(by_hand, grads, velocity, 0.1, 0.9)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), by_hand, params
    )


# Chapter 5.
def test_adamw_by_hand_equals_make_optimizer(key):
    params = jaxloops.init_mlp(key, (5, 7, 3))
    optimizer = jaxloops.make_optimizer(1e-2, 0.1)
    opt_state = optimizer.init(params)
    by_hand = params
    state = (0, jax.tree.map(jnp.zeros_like, params), jax.tree.map(jnp.zeros_like, params))
    for step in range(3):
        grads = jax.tree.map(lambda p, step=step: jnp.cos(p * (step + 2)), by_hand)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        by_hand, state = exercises.adamw_update(by_hand, grads, state, 1e-2, 0.1)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), by_hand, params
    )


def test_clipping_rescales_large_gradients_and_leaves_small_ones(key):
    params = jaxloops.init_mlp(key, (5, 7, 3))
    clipped, plain = (
        exercises.make_clipped_optimizer(1e-2, 0.1, 1.0),
        jaxloops.make_optimizer(1e-2, 0.1),
    )
    big = jax.tree.map(lambda p: 100.0 * jnp.ones_like(p), params)
    norm = optax.tree.norm(big)
    small = jax.tree.map(lambda g: g / (2 * norm), big)  # global norm 0.5
    for grads, equivalent in [(big, jax.tree.map(lambda g: g / norm, big)), (small, small)]:
        got, _ = clipped.update(grads, clipped.init(params), params)
        want, _ = plain.update(equivalent, plain.init(params), params)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), got, want)


# Chapter 6.
def test_accumulated_gradients_give_the_full_batch_step(key):
    init_key, data_key = jax.random.split(key)
    params = jaxloops.init_mlp(init_key, (5, 7, 3))
    batch = jaxloops.Batch(jax.random.normal(data_key, (15, 5)), jnp.arange(15) % 3)
    optimizer = jaxloops.make_optimizer(1e-2, 0.1)
    full = jax.jit(jaxloops.make_train_step(jaxloops.mlp_loss, optimizer))
    micro = jax.jit(exercises.make_accumulating_train_step(jaxloops.mlp_loss, optimizer, 3))
    want_params, _, want_metrics = full(params, optimizer.init(params), batch)
    got_params, _, got_metrics = micro(params, optimizer.init(params), batch)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), got_params, want_params
    )
    np.testing.assert_allclose(got_metrics["loss"], want_metrics["loss"], rtol=1e-5)


def test_accumulation_refuses_an_uneven_split(key):
    params = jaxloops.init_mlp(key, (5, 3))
    step = exercises.make_accumulating_train_step(jaxloops.mlp_loss, optax.sgd(0.1), 4)
    with pytest.raises(ValueError, match="15 does not split into 4"):
        step(params, (), jaxloops.Batch(jnp.ones((15, 5)), jnp.zeros(15, jnp.int32)))


@pytest.mark.parametrize("steps, log_every", [(11, 1), (11, 3), (9, 3), (7, None)])
def test_host_syncs_equals_the_losses_python_loop_fetches(steps, log_every):
    batches = [jnp.float32(i) for i in range(steps)]
    step = lambda params, opt_state, batch: (params, opt_state, {"loss": batch})
    _, _, logged = jaxloops.python_loop(step, None, None, batches, log_every)
    assert len(logged) == exercises.host_syncs(steps, log_every)


# Chapter 7.
def test_precision_recall_f1_equal_scikit_learn():
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 5, 97)
    predictions = np.where(
        rng.random(97) < 0.6, labels, rng.integers(0, 4, 97)
    )  # class 4 never predicted wrongly
    counts = jaxloops.confusion_matrix(jnp.asarray(labels), jnp.asarray(predictions), 5)
    want = metrics.precision_recall_fscore_support(
        labels, predictions, labels=range(5), zero_division=0
    )[:3]
    for got, expected in zip(exercises.precision_recall_f1(counts), want):
        np.testing.assert_allclose(got, expected)


@pytest.mark.parametrize("k", [1, 2, 5])
def test_top_k_accuracy_equals_scikit_learn(key, k):
    logits = jax.random.normal(key, (13, 7))
    labels = jnp.arange(13) % 7
    expected = metrics.top_k_accuracy_score(
        np.asarray(labels), np.asarray(logits), k=k, labels=range(7)
    )
    np.testing.assert_allclose(exercises.top_k_accuracy(logits, labels, k), expected, rtol=1e-6)


def test_top_k_accuracy_ignores_masked_rows(key):
    logits = jax.random.normal(key, (11, 5))
    labels = jnp.arange(11) % 5
    mask = jnp.arange(11) < 7
    np.testing.assert_allclose(
        exercises.top_k_accuracy(logits, labels, 2, mask),
        exercises.top_k_accuracy(logits[:7], labels[:7], 2),
        rtol=1e-6,
    )


def test_a_global_read_inside_jit_is_frozen_at_trace_time(key):
    params = jaxloops.init_mlp(key, (5, 3))
    grads = jax.tree.map(jnp.ones_like, params)
    before, after = exercises.frozen_global_demo(params, grads)
    assert float(before) > 0
    assert float(after) == float(before)  # setting LEARNING_RATE = 0 changed nothing
