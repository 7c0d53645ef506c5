"""The book's exercise solutions, each checked against a reference."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxloops
from conftest import normal
from jaxloops import equivalence, measure, rounding
from jaxloops.solutions import loop as exercises

# The package's functions, jitted once for the whole module: one compiled program per shape
# (and static argument) instead of one per eager operation and shape. Validation by value
# (smoothing, k) happens at trace time, so those arguments are static.
label_smoothed_cross_entropy = jax.jit(exercises.label_smoothed_cross_entropy, static_argnums=2)
top_k_accuracy = jax.jit(exercises.top_k_accuracy, static_argnums=2)
cross_entropy = jax.jit(jaxloops.cross_entropy)
confusion_matrix = jax.jit(jaxloops.confusion_matrix, static_argnums=2)
apply_updates = jax.jit(optax.apply_updates)
momentum_update = jax.jit(exercises.momentum_update)


# The step t is static: adamw_update's bias corrections 1 - b^t are then Python floats, as
# when it is called eagerly, not float32 arithmetic on a traced t.
@functools.partial(jax.jit, static_argnums=0)
def adamw_update(t, params, grads, m, v, learning_rate, weight_decay):
    return exercises.adamw_update(params, grads, (t, m, v), learning_rate, weight_decay)


cross_entropy_grad = jax.jit(jax.grad(jaxloops.cross_entropy))


@jax.jit
def optax_smoothed_cross_entropy(logits, labels, smoothing):
    """The reference: optax's label smoothing and softmax cross-entropy."""
    targets = optax.smooth_labels(jax.nn.one_hot(labels, logits.shape[-1]), smoothing)
    return optax.softmax_cross_entropy(logits, targets).mean()


# Chapter 1.
def test_traced_shapes_records_exactly_the_cache_misses():
    f32, i32 = np.float32, np.int32  # host arrays: jit caches them by shape and dtype too
    inputs = [
        np.ones(3, f32),
        np.zeros(3, f32),
        np.ones(5, f32),
        np.ones(3, f32),
        np.ones(3, i32),
    ]
    traced = exercises.traced_shapes(lambda x: x * 2, inputs)
    assert traced == [((3,), "float32"), ((5,), "float32"), ((3,), "int32")]


# Chapter 2.
@pytest.mark.parametrize("n, batch_size", [(21, 7), (23, 7), (11, 3), (13, 13)])
def test_ragged_compile_count_matches_counted_compilations(n, batch_size):
    # Host arrays: slicing them compiles nothing, so the log holds the step's compiles only.
    data = jaxloops.Batch(np.ones((n, 5), np.float32), np.zeros(n, np.int32))
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
def test_label_smoothing_equals_optax(smoothing):
    logits = 3 * normal((5, 7))
    labels = np.array([0, 6, 3, 3, 1], np.int32)
    expected = optax_smoothed_cross_entropy(logits, labels, smoothing)
    np.testing.assert_allclose(
        label_smoothed_cross_entropy(logits, labels, smoothing), expected, rtol=1e-6
    )


def test_label_smoothing_is_stable_and_reduces_to_cross_entropy():
    logits = np.array([[10.0, 20.0, 1000.0]], np.float32)
    labels = np.array([2], np.int32)
    smoothed = label_smoothed_cross_entropy(logits, labels, 0.0)
    assert np.isfinite(smoothed)
    np.testing.assert_allclose(smoothed, cross_entropy(logits, labels), atol=1e-6)
    assert np.isfinite(label_smoothed_cross_entropy(logits, labels, 0.1))


# Chapter 4.
def test_cross_entropy_gradient_is_softmax_minus_one_hot():
    logits = normal((5, 7))
    labels = np.array([0, 6, 3, 3, 1], np.int32)
    autodiff = cross_entropy_grad(logits, labels)
    np.testing.assert_allclose(
        jax.jit(exercises.softmax_cross_entropy_grad)(logits, labels), autodiff, atol=1e-7
    )


def test_momentum_by_hand_equals_optax_sgd_with_momentum(key):
    params = jaxloops.init_mlp(key, (5, 7, 3))
    optimizer = optax.sgd(0.1, momentum=0.9)
    opt_state, update = optimizer.init(params), jax.jit(optimizer.update)
    by_hand, velocity = params, jax.tree.map(np.zeros_like, params)
    for step in range(3):
        grads = jax.tree.map(
            lambda p, step=step: np.sin(np.asarray(p) * (step + 1)), by_hand
        )  # a different gradient each step
        updates, opt_state = update(grads, opt_state, params)
        params = apply_updates(params, updates)
        by_hand, velocity = momentum_update(by_hand, grads, velocity, 0.1, 0.9)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), by_hand, params
    )


def adamw_rounding_bound(path, b1=0.9, b2=0.999):
    """Per parameter: how far two float32 AdamW runs through the parameters `path` (p_0, ...,
    p_T, one per step) can drift apart by rounding alone.

    Step t divides the moments by 1 - b^t. Where b^t errs by d relative (b = 0.999: a
    device's pow, in optax; a Python float, by hand), 1 - b^t errs by d b^t / (1 - b^t): 999 d
    at t = 1 for b2. So the update m_hat / (sqrt(v_hat) + eps) errs by r_t = k1 d1 + k2 d2 / 2
    plus 8 roundings (the moments, the two divisions, the square root, the sum, the product
    with the learning rate): |p_t - p_(t-1)| r_t per step, and eps |p_t| for the subtraction.
    eps is this backend's for the divisions and the square root (`rounding.backend_eps`); d
    is the larger of eps and the error of `b ** count` on the device, measured as optax
    computes it (an int32 count).
    """
    eps = rounding.backend_eps(("divide", "sqrt"))
    count = np.arange(1, len(path), dtype=np.int32)
    d = {}
    for b in (b1, b2):
        device = np.asarray(jax.jit(lambda t, b=b: b**t)(count), np.float64)
        exact = np.float64(np.float32(b)) ** count.astype(np.float64)
        d[b] = max(eps, float((np.abs(device - exact) / exact).max()))
    bound = jax.tree.map(lambda p: np.zeros(np.shape(p)), path[0])
    for t in range(1, len(path)):
        k1, k2 = (b**t / (1 - b**t) for b in (b1, b2))
        r = k1 * d[b1] + k2 * d[b2] / 2 + 8 * eps
        bound = jax.tree.map(
            lambda acc, p, q, r=r: acc + r * np.abs(np.asarray(q, np.float64) - p)
            + eps * np.abs(np.asarray(q, np.float64)),
            bound, path[t - 1], path[t],
        )  # fmt: skip
    return bound


# Chapter 5.
def test_adamw_by_hand_equals_make_optimizer(key):
    params = jaxloops.init_mlp(key, (5, 7, 3))
    optimizer = jaxloops.make_optimizer(1e-2, 0.1)
    opt_state, update = optimizer.init(params), jax.jit(optimizer.update)
    by_hand = no_decay = ascent = params
    path = [jax.tree.map(np.asarray, params)]
    state = (0, jax.tree.map(np.zeros_like, params), jax.tree.map(np.zeros_like, params))
    for step in range(3):
        grads = jax.tree.map(lambda p, step=step: np.cos(np.asarray(p) * (step + 2)), by_hand)
        updates, opt_state = update(grads, opt_state, params)
        params = apply_updates(params, updates)
        t, m, v = state
        by_hand, (_, m, v) = adamw_update(t, by_hand, grads, m, v, 1e-2, 0.1)
        # Two wrong rules on the same moments: no weight decay; a step up the gradient.
        no_decay, _ = adamw_update(t, no_decay, grads, *state[1:], 1e-2, 0.0)
        ascent, _ = adamw_update(t, ascent, grads, *state[1:], -1e-2, -0.1)
        state = (t + 1, m, v)
        path.append(jax.tree.map(np.asarray, by_hand))
    bound = adamw_rounding_bound(path)
    assert equivalence.worst_ratio(by_hand, params, bound) <= 1
    assert equivalence.worst_ratio(ascent, params, bound) > 100
    # Without the decay, the matrices move by lr wd |p| a step: outside the bound too (by
    # 3,000 times on a CPU; by less where a backend's rounding widens it).
    assert equivalence.worst_ratio(no_decay, params, bound) > 1


def test_clipping_rescales_large_gradients_and_leaves_small_ones(key):
    params = jaxloops.init_mlp(key, (5, 7, 3))
    clipped, plain = (
        exercises.make_clipped_optimizer(1e-2, 0.1, 1.0),
        jaxloops.make_optimizer(1e-2, 0.1),
    )
    big = jax.tree.map(lambda p: np.full(p.shape, 100.0, np.float32), params)
    norm = np.asarray(jax.jit(optax.tree.norm)(big))
    small = jax.tree.map(lambda g: g / (2 * norm), big)  # global norm 0.5
    clipped_update, plain_update = jax.jit(clipped.update), jax.jit(plain.update)
    for grads, equivalent in [(big, jax.tree.map(lambda g: g / norm, big)), (small, small)]:
        got, _ = clipped_update(grads, clipped.init(params), params)
        want, _ = plain_update(equivalent, plain.init(params), params)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), got, want)


# Chapter 6.
def test_accumulated_gradients_give_the_full_batch_step(key):
    params = jaxloops.init_mlp(key, (5, 7, 3))
    batch = jaxloops.Batch(normal((15, 5)), np.arange(15, dtype=np.int32) % 3)
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
        step(params, (), jaxloops.Batch(np.ones((15, 5), np.float32), np.zeros(15, np.int32)))


@pytest.mark.parametrize("steps, log_every", [(11, 1), (11, 3), (9, 3), (7, None)])
def test_host_syncs_equals_the_losses_python_loop_fetches(steps, log_every):
    batches = [jnp.float32(i) for i in range(steps)]
    step = lambda params, opt_state, batch: (params, opt_state, {"loss": batch})
    _, _, logged = jaxloops.python_loop(step, None, None, batches, log_every)
    assert len(logged) == exercises.host_syncs(steps, log_every)


# Chapter 7.
def test_precision_recall_f1_equal_scikit_learn():
    from sklearn import metrics  # here, not at the top: 1 s that each worker would pay

    rng = np.random.default_rng(3)
    labels = rng.integers(0, 5, 97)
    predictions = np.where(
        rng.random(97) < 0.6, labels, rng.integers(0, 4, 97)
    )  # class 4 never predicted wrongly
    counts = confusion_matrix(labels, predictions, 5)
    want = metrics.precision_recall_fscore_support(
        labels, predictions, labels=range(5), zero_division=0
    )[:3]
    for got, expected in zip(exercises.precision_recall_f1(counts), want):
        np.testing.assert_allclose(got, expected)


@pytest.mark.parametrize("k", [1, 2, 5])
def test_top_k_accuracy_equals_scikit_learn(k):
    from sklearn import metrics

    logits = normal((13, 7))
    labels = np.arange(13, dtype=np.int32) % 7
    expected = metrics.top_k_accuracy_score(labels, logits, k=k, labels=range(7))
    np.testing.assert_allclose(top_k_accuracy(logits, labels, k), expected, rtol=1e-6)


def test_top_k_accuracy_ignores_masked_rows():
    logits = normal((11, 5))
    labels = np.arange(11, dtype=np.int32) % 5
    mask = np.arange(11) < 7
    np.testing.assert_allclose(
        top_k_accuracy(logits, labels, 2, mask),
        top_k_accuracy(logits[:7], labels[:7], 2),
        rtol=1e-6,
    )


def test_a_global_read_inside_jit_is_frozen_at_trace_time(key):
    params = jaxloops.init_mlp(key, (5, 3))
    grads = jax.tree.map(np.ones_like, params)
    before, after = exercises.frozen_global_demo(params, grads)
    assert float(before) > 0
    assert float(after) == float(before)  # setting LEARNING_RATE = 0 changed nothing
