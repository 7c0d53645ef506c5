import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxloops
from conftest import normal
from jaxloops import equivalence
from jaxloops.pages import ch04_gradients as page

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


def _example_loss(params, x, y):
    """One example's cross-entropy: x (D,), y ()."""
    return jaxloops.cross_entropy(jaxloops.mlp_logits(params, x[None]), y[None])


def _per_example_problem(key):
    params, batch = _problem(key)  # widths 5 -> 7 -> 3, B = 11
    looped = jaxloops.grads.looped_grads(_example_loss, params, batch.x, batch.y)
    with jax.enable_x64(True):
        params64, batch64 = _float64(params, batch)
        looped64 = jaxloops.grads.looped_grads(_example_loss, params64, batch64.x, batch64.y)
    tolerance = page.float32_tolerance(looped, looped64)
    return params, batch, looped, tolerance


def test_per_example_grads_put_b_on_every_leaf_and_agree_with_the_loop(key):
    params, batch, looped, tolerance = _per_example_problem(key)
    vmapped = jax.jit(jaxloops.grads.per_example_grads, static_argnums=0)(
        _example_loss, params, batch.x, batch.y
    )
    want = jax.tree.map(lambda p: (11, *p.shape), params)
    assert jax.tree.map(jnp.shape, vmapped) == want == jax.tree.map(jnp.shape, looped)
    assert equivalence.worst_ratio(vmapped, looped, tolerance) <= 1
    # Known-wrong: the examples one place out of order, or every example given the batch's
    # mean gradient, or one gradient's sign flipped, each fail the same tolerance.
    rolled = jax.tree.map(lambda g: jnp.roll(g, 1, axis=0), vmapped)
    mean = jax.tree.map(lambda g: jnp.broadcast_to(g.mean(0), g.shape), vmapped)
    flipped = jax.tree.map(lambda g: g.at[3].multiply(-1), vmapped)
    for wrong in (rolled, mean, flipped):
        assert equivalence.worst_ratio(wrong, looped, tolerance) > 1


def test_the_mean_of_per_example_grads_is_the_gradient_of_the_mean_loss(key):
    params, batch, looped, tolerance = _per_example_problem(key)
    vmapped = jaxloops.grads.per_example_grads(_example_loss, params, batch.x, batch.y)
    batch_grad = jax.grad(lambda p: jaxloops.mlp_loss(p, batch)[0])(params)
    bound = page.mean_tolerance(jaxloops.mlp_loss, params, batch, tolerance)
    mean = jax.tree.map(lambda g: g.mean(0), vmapped)
    assert equivalence.worst_ratio(mean, batch_grad, bound) <= 1
    # Known-wrong: the sum instead of the mean, and the mean without the last example.
    total = jax.tree.map(lambda g: g.sum(0), vmapped)
    short = jax.tree.map(lambda g: g[:-1].mean(0), vmapped)
    for wrong in (total, short):
        assert equivalence.worst_ratio(wrong, batch_grad, bound) > 1


def test_per_example_grad_norms_are_each_rows_norm_over_every_leaf(key):
    params, batch, looped, _ = _per_example_problem(key)
    norms = np.asarray(jaxloops.grads.per_example_grad_norms(looped))
    flat = np.concatenate([np.asarray(g).reshape(11, -1) for g in jax.tree.leaves(looped)], 1)
    np.testing.assert_allclose(norms, np.linalg.norm(flat, axis=1), rtol=1e-6)
    assert norms.shape == (11,) and len(set(norms.round(6))) == 11  # one per example
    with pytest.raises(ValueError, match="same leading B axis"):
        jaxloops.grads.per_example_grad_norms({"w": jnp.ones((3, 2)), "b": jnp.ones((5,))})
    with pytest.raises(ValueError, match="same leading B axis"):
        jaxloops.grads.per_example_grad_norms({"w": jnp.ones(())})


def test_per_example_grads_refuse_mismatched_or_empty_examples(key):
    params, batch = _problem(key)
    for fn in (jaxloops.grads.per_example_grads, jaxloops.grads.looped_grads):
        with pytest.raises(ValueError, match=r"x \(11, 5\) and y \(10,\)"):
            fn(_example_loss, params, batch.x, batch.y[:10])
        with pytest.raises(ValueError, match=r"x \(0, 5\) holds no examples"):
            fn(_example_loss, params, batch.x[:0], batch.y[:0])
