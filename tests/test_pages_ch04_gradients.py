"""Chapter 4's tolerance for per-example gradients, and its timing figures."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxloops import equivalence
from jaxloops.pages import ch04_gradients as page


def test_the_tolerance_is_the_factor_times_the_loops_float32_error_per_leaf():
    exact = {"w": np.array([[1.0, -2.0], [3.0, 0.5]]), "b": np.array([0.0, 4.0])}
    got = {"w": exact["w"] + np.array([[1e-7, 0], [-3e-7, 0]]), "b": exact["b"]}
    tolerance = page.float32_tolerance(got, exact)
    assert tolerance["w"] == pytest.approx(page.FACTOR * 3e-7)
    # Where the loop was exact, the floor: FACTOR u max|g|, not 0 (which would reject any
    # other order of the same sums).
    assert tolerance["b"] == pytest.approx(page.FACTOR * equivalence.UNIT_ROUNDOFF * 4.0)
    assert page.float32_tolerance(got, exact, factor=2.0)["w"] == pytest.approx(6e-7)


def test_the_tolerance_refuses_a_bad_factor_or_trees_that_differ():
    tree = {"w": np.ones((3, 2))}
    for factor in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=f"factor must be a finite number > 0, got {factor}"):
            page.float32_tolerance(tree, tree, factor=factor)
    with pytest.raises(ValueError, match="the two trees differ"):
        page.float32_tolerance(tree, {"w": np.ones((2, 3))})


def test_the_mean_tolerance_adds_the_per_example_one_to_the_summation_bound(key):
    import jaxloops

    params = jaxloops.init_mlp(key, (5, 7, 3))
    batch = jaxloops.Batch(jnp.ones((11, 5)), jnp.arange(11) % 3)
    per_example = {n: {"w": 1.0, "b": 2.0} for n in params}
    bound = page.mean_tolerance(jaxloops.mlp_loss, params, batch, per_example)
    order = equivalence.gradient_bound(jaxloops.mlp_loss, params, batch)
    for n in params:
        np.testing.assert_allclose(bound[n]["w"], np.asarray(order[n]["w"]) + 1.0)
        np.testing.assert_allclose(bound[n]["b"], np.asarray(order[n]["b"]) + 2.0)


def test_the_timing_figures_are_medians_and_the_paired_ratio():
    samples = {"vmap": [0.010, 0.012, 0.011], "loop": [0.050, 0.030, 0.044]}
    figures = page.vmap_timing(samples)
    assert figures["vmap_ms"] == pytest.approx(11.0)
    assert figures["loop_ms"] == pytest.approx(44.0)
    assert figures["ratio"] == pytest.approx(4.0)  # rounds: 5, 2.5, 4
    with pytest.raises(ValueError, match=r"need the runs 'vmap' and 'loop', got \['fast'"):
        page.vmap_timing({"fast": [1.0], "loop": [1.0]})
