import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

import jaxloops
from conftest import normal
from jaxloops import rounding

# Jitted once for the module: one compiled program per shape instead of one per eager
# operation and shape. The tests that check what an eager call refuses call the package.
cross_entropy = jax.jit(jaxloops.cross_entropy)
accuracy = jax.jit(jaxloops.accuracy)
mlp_logits = jax.jit(jaxloops.mlp_logits, static_argnames="dropout_rate")
checked_cross_entropy = jax.jit(checkify.checkify(jaxloops.checked_cross_entropy))


def test_init_mlp_shapes_follow_sizes(key):
    params = jaxloops.init_mlp(key, (5, 7, 11, 3))
    shapes = {name: (layer["w"].shape, layer["b"].shape) for name, layer in params.items()}
    assert shapes == {
        "dense_0": ((5, 7), (7,)),
        "dense_1": ((7, 11), (11,)),
        "dense_2": ((11, 3), (3,)),
    }


def test_logits_shape_and_wrong_feature_count(key):
    params = jaxloops.init_mlp(key, (5, 7, 3))
    assert mlp_logits(params, np.ones((13, 5), np.float32)).shape == (13, 3)
    with pytest.raises(ValueError, match="first layer expects \\(B, 5\\)"):
        jaxloops.mlp_logits(params, np.ones((13, 6), np.float32))


def test_bad_sizes_are_rejected(key):
    with pytest.raises(ValueError, match="sizes"):
        jaxloops.init_mlp(key, (5,))


def cross_entropy_bound(logits, labels) -> float:
    """The largest error this backend's rounding explains in `cross_entropy` (eps: one
    operation's relative error, `rounding.backend_eps` of exp and log). Per row, lse =
    m + log s with s = sum of C exp(z - m) <= 1 each: the exponentials and their sum err by
    C eps relative to s, which the log turns into as much absolute; the log adds eps |log s|;
    m + log s and z_y - lse add eps (|m| + |log s| + |z_y|). The mean adds eps |loss|."""
    z = np.asarray(logits, np.float64)
    m = z.max(-1)
    log_s = np.log(np.exp(z - m[:, None]).sum(-1))
    z_y = np.take_along_axis(z, np.asarray(labels)[:, None], -1)[:, 0]
    rows = z.shape[-1] + 2 * np.abs(log_s) + np.abs(m) + np.abs(z_y)
    eps = rounding.backend_eps(rounding.LOG_SUM_EXP)
    return float(eps * (rows.max() + abs((m + log_s - z_y).mean())))


def test_cross_entropy_matches_log_softmax_and_is_stable():
    logits = np.array([[1.0, 2.0, 3.0], [0.5, -1.0, 4.0]], np.float32)
    labels = np.array([2, 0], np.int32)
    # The reference in float64 NumPy: log_softmax(z) = z - log(sum(exp(z))).
    log_softmax = lambda z: z - np.log(np.exp(np.float64(z)).sum())
    expected = -np.mean([log_softmax(logits[0])[2], log_softmax(logits[1])[0]])
    bound = cross_entropy_bound(logits, labels)
    assert abs(float(cross_entropy(logits, labels)) - expected) <= bound
    wrong = float(cross_entropy(logits, (labels + 1) % 3))  # each label one class off
    assert abs(wrong - expected) > 100 * bound
    # Shifting every logit by a huge constant changes nothing (no overflow to inf/nan).
    np.testing.assert_allclose(cross_entropy(logits + 1e4, labels), expected, atol=2e-3)
    assert np.isfinite(cross_entropy(logits * 1e4, labels))


def test_accuracy_counts_argmax_hits():
    logits = np.array([[0.0, 1.0], [2.0, 1.0], [0.0, 3.0]], np.float32)
    assert float(accuracy(logits, np.array([1, 1, 1], np.int32))) == pytest.approx(2 / 3)


def test_checked_loss_raises_on_a_bad_label_where_the_unchecked_one_gives_nan():
    logits, bad = np.zeros((3, 5), np.float32), np.array([0, 7, 1], np.int32)
    assert np.isnan(cross_entropy(logits, bad))
    error, _ = checked_cross_entropy(logits, bad)
    with pytest.raises(ValueError, match=r"labels must be in \[0, 5\); got min 0, max 7"):
        error.throw()
    error, loss = checked_cross_entropy(logits, bad % 5)
    assert error.get() is None
    assert abs(float(loss) - np.log(5)) <= cross_entropy_bound(logits, bad % 5)


def test_init_mlp_names_sizes_that_are_not_a_tuple_of_ints(key):
    with pytest.raises(ValueError, match=r"sizes \[64, 10\] must be a tuple"):
        jaxloops.init_mlp(key, [64, 10])
    with pytest.raises(ValueError, match="tuple of ints"):
        jaxloops.init_mlp(key, (64, 10.0))


def test_a_negative_label_is_refused_by_value_and_never_wraps_to_another_class():
    # Device arrays put there as they are (jnp.asarray would compile a copy per shape).
    logits = jax.device_put(normal((3, 10)))
    bad = jax.device_put(np.array([0, -1, 1], np.int32))
    with pytest.raises(ValueError, match=r"got -1 at index \(1,\)"):
        jaxloops.cross_entropy(logits, bad)
    with pytest.raises(ValueError, match=r"got 10 at index \(2,\)"):
        jaxloops.cross_entropy(logits, jax.device_put(np.array([0, 1, 10], np.int32)))
    # Traced, nothing can raise: the loss is NaN, not the loss of class 9 (what -1 wrapped to).
    assert np.isnan(cross_entropy(logits, bad))
    wrapped = cross_entropy(logits, np.asarray(bad) % 10)
    assert np.isfinite(wrapped)
    error, _ = checked_cross_entropy(logits, bad)
    with pytest.raises(ValueError, match=r"got min -1, max 1"):
        error.throw()


def test_labels_of_the_wrong_shape_are_refused_not_broadcast():
    logits = jax.device_put(normal((5, 3)))
    labels = jax.device_put(np.zeros((5, 1), np.int32))
    with pytest.raises(ValueError, match=r"labels \(5, 1\)"):
        jaxloops.accuracy(logits, labels)
    with pytest.raises(ValueError, match=r"labels \(5, 1\)"):
        jaxloops.cross_entropy(logits, labels)


def test_chance_loss_predicts_the_loss_of_uninformative_logits_and_rejects_others():
    from jaxloops.losses import chance_loss

    rng = np.random.default_rng(3)
    labels = rng.integers(0, 10, 5000).astype(np.int32)
    for sigma in (0.5, 1.0):
        logits = (sigma * rng.standard_normal((5000, 10))).astype(np.float32)
        predicted, spread = chance_loss(logits)
        assert abs(float(cross_entropy(logits, labels)) - predicted) < spread / 4
    # Known-wrong answers fall outside the band: logits that know the label, and logits
    # 10x too large (sigma^2 = 100: the loss is set by the largest logit, not by sigma^2 / 2).
    informed = logits.copy()
    informed[np.arange(5000), labels] += 3.0
    predicted, spread = chance_loss(informed)
    assert abs(float(cross_entropy(informed, labels)) - predicted) > spread / 4
    predicted, spread = chance_loss(10 * logits)
    assert abs(float(cross_entropy(10 * logits, labels)) - predicted) > spread / 4


def test_known_value_is_none_for_traced_and_abstract_values():
    from jaxloops.losses import known_value

    np.testing.assert_array_equal(known_value(jax.device_put(np.arange(3))), [0, 1, 2])
    assert known_value(3) == 3
    assert known_value(jax.ShapeDtypeStruct((2,), jnp.int32)) is None
    seen = []
    jax.jit(lambda x: seen.append(known_value(x)) or x)(np.ones(2, np.float32))
    assert seen == [None]


@pytest.mark.parametrize("rate", [-0.1, 1.0, 1.5, float("nan")])
def test_a_dropout_rate_outside_zero_one_is_rejected_by_value(key, rate):
    params = jaxloops.init_mlp(key, (5, 7, 3))
    with pytest.raises(ValueError, match=f"dropout rate {rate}"):
        jaxloops.mlp_logits(params, np.ones((13, 5), np.float32), key, dropout_rate=rate)


def test_without_a_key_the_mlp_is_deterministic_and_drops_nothing(key):
    params = jaxloops.init_mlp(key, (5, 17, 11, 3))
    x = normal((13, 5))
    plain = np.asarray(mlp_logits(params, x))
    # Evaluation passes no key: a rate changes nothing, call after call.
    for _ in range(2):
        np.testing.assert_array_equal(mlp_logits(params, x, dropout_rate=0.5), plain)
    # With a key it does drop (so the equality above could fail), the same for the same key.
    dropped = mlp_logits(params, x, jax.random.key(1), dropout_rate=0.5)
    assert not np.array_equal(dropped, plain)
    again = mlp_logits(params, x, jax.random.key(1), dropout_rate=0.5)
    np.testing.assert_array_equal(dropped, again)
    other = mlp_logits(params, x, jax.random.key(2), dropout_rate=0.5)
    assert not np.array_equal(dropped, other)
