import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxloops
from conftest import normal

# Jitted once for the module: one compiled program instead of one per eager operation.
sgd_update = jax.jit(jaxloops.sgd_update)
apply_updates = jax.jit(optax.apply_updates)
mlp_logits = jax.jit(jaxloops.mlp_logits)


def _problem(key):
    params = jaxloops.init_mlp(key, (5, 7, 3))
    labels = np.random.default_rng(1).integers(0, 3, 11).astype(np.int32)
    batch = jaxloops.Batch(normal((11, 5)), labels)
    return params, batch


def _float64(params, batch):
    """params and batch.x in float64, as device arrays (no eager conversion to compile)."""
    params64 = jax.tree.map(lambda p: jax.device_put(np.asarray(p, np.float64)), params)
    return params64, jaxloops.Batch(np.asarray(batch.x, np.float64), batch.y)


def test_gradient_tree_has_the_parameter_tree_structure(key):
    params, batch = _problem(key)
    (_, aux), grads = jax.jit(jax.value_and_grad(jaxloops.mlp_loss, has_aux=True))(params, batch)
    assert jax.tree.structure(grads) == jax.tree.structure(params)
    assert jax.tree.map(jnp.shape, grads) == jax.tree.map(jnp.shape, params)
    assert set(aux) == {"accuracy"}


def test_hand_written_sgd_equals_optax_sgd(key):
    params, batch = _problem(key)
    grads = jax.jit(jax.grad(lambda p: jaxloops.mlp_loss(p, batch)[0]))(params)
    by_hand = sgd_update(params, grads, 0.3)
    sgd = optax.sgd(0.3)
    updates, _ = jax.jit(sgd.update)(grads, sgd.init(params), params)
    by_optax = apply_updates(params, updates)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), by_hand, by_optax
    )
    # And it really moved the parameters.
    assert not np.allclose(by_hand["dense_0"]["w"], params["dense_0"]["w"])


def test_finite_differences_agree_with_autodiff(key):
    params, batch = _problem(key)
    with jax.enable_x64(True):
        params64, batch64 = _float64(params, batch)
        loss = jax.jit(lambda p: jaxloops.mlp_loss(p, batch64)[0])
        grads = jax.grad(loss)(params64)
        for path, index in [
            (("dense_0", "w"), (3, 5)),
            (("dense_1", "b"), (2,)),
            (("dense_1", "w"), (6, 0)),
        ]:
            numeric = jaxloops.finite_difference(loss, params64, path, index, eps=1e-5)
            analytic = float(np.asarray(grads[path[0]][path[1]])[index])
            np.testing.assert_allclose(numeric, analytic, rtol=1e-5, atol=1e-8)


def test_a_finite_difference_of_no_entry_is_refused_not_zero(key):
    params = jaxloops.init_mlp(key, (5, 7, 3))
    loss = lambda p: jaxloops.mlp_logits(p, np.ones((2, 5), np.float32)).sum()
    with pytest.raises(ValueError, match=r"path \('dense_2', 'w'\) names no leaf"):
        jaxloops.finite_difference(loss, params, ("dense_2", "w"), (0, 0))
    with pytest.raises(ValueError, match=r"index \(5, 0\) is not an entry of leaf .* \(5, 7\)"):
        jaxloops.finite_difference(loss, params, ("dense_0", "w"), (5, 0))
    with pytest.raises(ValueError, match=r"index \(-1, 0\)"):
        jaxloops.finite_difference(loss, params, ("dense_0", "w"), (-1, 0))


def test_finite_difference_bound_passes_autodiff_and_rejects_wrong_gradients(key):
    params, batch = _problem(key)
    entries = [(("dense_0", "w"), (3, 5)), (("dense_1", "b"), (2,)), (("dense_1", "w"), (6, 0))]
    with jax.enable_x64(True):
        params64, batch64 = _float64(params, batch)
        loss = jax.jit(lambda p: jaxloops.mlp_loss(p, batch64)[0])
        grads = jax.grad(loss)(params64)
        logits = np.asarray(mlp_logits(params64, batch64.x))
        scale = float(loss(params64)) + 2 * float(np.abs(logits).max())
        terms = batch.x.shape[1] + batch.x.shape[0] + logits.shape[1]
        for path, index in entries:
            numeric = jaxloops.finite_difference(loss, params64, path, index, eps=1e-6)
            bound = jaxloops.grads.finite_difference_bound(
                loss, params64, path, index, eps=1e-6, terms=terms, scale=scale
            )
            leaf = np.asarray(grads[path[0]][path[1]])
            right = float(leaf[index])
            # Off by one: the neighbouring entry's gradient (an index shifted in the leaf).
            shifted = float(np.roll(leaf, 1, axis=0)[index])
            assert abs(numeric - right) <= bound < 0.01 * abs(right)
            for wrong in (-right, 0.0, shifted):  # sign-flipped, zeroed, off by one entry
                assert abs(numeric - wrong) > bound, (path, index, wrong)


def test_finite_difference_bound_refuses_bad_sizes(key):
    params, batch = _problem(key)
    loss = lambda p: jaxloops.mlp_loss(p, batch)[0]
    entry = (("dense_0", "w"), (0, 0))
    with pytest.raises(ValueError, match="eps > 0"):
        jaxloops.grads.finite_difference_bound(loss, params, *entry, eps=0.0, terms=3, scale=1.0)
    with pytest.raises(ValueError, match="2000000000 terms"):
        jaxloops.grads.finite_difference_bound(
            loss, params, *entry, eps=1e-3, terms=2 * 10**9, scale=1.0
        )


@pytest.mark.parametrize("eps", [0.0, -0.0, float("nan"), float("inf")])
def test_a_finite_difference_step_that_is_not_positive_is_refused(key, eps):
    # eps = 0 would return 0 / 0 = NaN for every entry.
    params, batch = _problem(key)
    loss = lambda p: jaxloops.mlp_loss(p, batch)[0]
    with pytest.raises(ValueError, match=f"eps must be a finite number > 0, got {eps}"):
        jaxloops.finite_difference(loss, params, ("dense_0", "w"), (0, 0), eps=eps)


@pytest.mark.parametrize("learning_rate", [-0.3, 0.0, float("nan")])
def test_sgd_refuses_a_learning_rate_that_climbs_or_stands_still(key, learning_rate):
    params, batch = _problem(key)
    grads = jax.grad(lambda p: jaxloops.mlp_loss(p, batch)[0])(params)
    with pytest.raises(
        ValueError, match=f"learning_rate must be a finite number > 0, got {learning_rate}"
    ):
        jaxloops.sgd_update(params, grads, learning_rate)
