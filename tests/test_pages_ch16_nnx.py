"""Chapter 16's numbers: the large batch found by measurement, each form's figures from
paired rounds, the no-overlap prediction and the glue names."""

import jax
import numpy as np
import pytest

pytest.importorskip("flax.nnx")

import jaxloops  # noqa: E402
from jaxloops.data import Batch  # noqa: E402
from jaxloops.pages import ch16_nnx as page  # noqa: E402


def test_a_batch_of_any_size_repeats_the_examples_in_order():
    data = Batch(np.arange(7 * 3, dtype=np.float32).reshape(7, 3), np.arange(7, dtype=np.int32))
    batch = page.batch_of(data, 11)
    assert batch.x.shape == (11, 3) and batch.y.shape == (11,)
    np.testing.assert_array_equal(batch.y, [0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3])
    np.testing.assert_array_equal(batch.x[8], data.x[1])
    np.testing.assert_array_equal(page.batch_of(data, 5).y, [0, 1, 2, 3, 4])
    with pytest.raises(ValueError, match="got 0, 7"):
        page.batch_of(data, 0)


def test_the_compute_bound_batch_is_the_first_power_of_two_past_the_target():
    asked = []

    def seconds_at(size):  # a step of 1 ms of overhead-free compute per 100 examples
        asked.append(size)
        return size * 1e-5

    # 5 × 2 ms = 10 ms: 1000 examples; from 64, doubling: 64 .. 1024.
    assert page.compute_bound_batch(seconds_at, 2e-3, start=64, factor=5) == (1024, 1024e-5)
    assert asked == [64, 128, 256, 512, 1024]
    # Known-wrong: a target one size short must not stop there.
    assert page.compute_bound_batch(seconds_at, 2.1e-3, start=64, factor=5)[0] == 2048
    # The cap stops the search where no size reaches the target.
    assert page.compute_bound_batch(seconds_at, 1.0, start=64, cap=300) == (256, 256e-5)
    for bad in (dict(start=0), dict(start=64, cap=32), dict(start=64, factor=0)):
        with pytest.raises(ValueError, match="need 1 <= start <= cap"):
            page.compute_bound_batch(seconds_at, 2e-3, **bad)
    with pytest.raises(ValueError, match="overhead nan"):
        page.compute_bound_batch(seconds_at, float("nan"), start=64)


def test_per_form_figures_come_from_paired_rounds():
    samples = {
        "pytree": [1.0, 2.0, 1.0],
        "nnx.jit": [3.0, 4.0, 5.0],
        "split/merge": [1.5, 2.2, 1.1],
    }
    got = page.per_form(samples, steps=10)
    assert got["pytree"] == {"us": 1e5, "ratio": 1.0, "over": 0.0}
    assert got["nnx.jit"]["us"] == pytest.approx(4e5)
    assert got["nnx.jit"]["ratio"] == pytest.approx(3.0)  # median of 3, 2, 5
    assert got["nnx.jit"]["over"] == pytest.approx(3e5)
    # Paired, not the ratio of medians (1.5 / 1): the median of 1.5, 1.1, 1.1.
    assert got["split/merge"]["ratio"] == pytest.approx(1.1)
    with pytest.raises(ValueError, match="need the pytree step's samples"):
        page.per_form({"nnx.jit": [1.0]}, steps=10)


def test_the_no_overlap_prediction_and_the_glue_names():
    assert page.predicted_ratio(500.0, 2000.0) == pytest.approx(1.25)
    assert page.predicted_ratio(-30.0, 2000.0) == 1.0  # a noisy negative overhead adds nothing
    with pytest.raises(ValueError, match="got 0.0 µs"):
        page.predicted_ratio(5.0, 0.0)
    figures = {"nnx.jit(graph=False)": {"us": 7.0, "ratio": 2.0}}
    assert page.glue_values(figures, "big_") == {"big_tree_us": 7.0, "big_tree_ratio": 2.0}
    with pytest.raises(ValueError, match=r"unknown forms \['nnx.vmap'\]"):
        page.glue_values({"nnx.vmap": {"us": 1.0}})


def test_the_pytree_step_timed_at_a_size_is_positive_and_goes_on_from_its_state():
    params = jaxloops.init_mlp(jax.random.key(0), (13, 11, 5))
    tx = jaxloops.make_optimizer(3e-3, 1e-2)
    data = jax.device_put(Batch(np.ones((7, 13), np.float32), np.zeros(7, np.int32)))
    seconds_at = page.pytree_seconds_at(params, tx, data)
    assert 0 < seconds_at(3) < 60 and 0 < seconds_at(9) < 60
    with pytest.raises(ValueError, match="steps must be >= 1"):
        page.step_seconds(lambda batch: batch.x.sum(), data, steps=0)
