import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxloops
from jaxloops import measure
from jaxloops.measure import random_batches, scan_throughput


def _step(key):
    params = jaxloops.init_mlp(key, (5, 7, 3))
    optimizer = jaxloops.make_optimizer(1e-3, 1e-4)
    return jaxloops.make_train_step(jaxloops.mlp_loss, optimizer), params, optimizer.init(params)


def test_scan_flops_per_step_equal_the_steps_own_cost_analysis(key):
    train_step, params, opt_state = _step(key)
    batches = random_batches(key, 11, 13, 5, 3)
    row = scan_throughput(train_step, params, opt_state, batches, repeats=1)
    one = jax.tree.map(lambda a: a[0], batches)
    per_step = measure.compiled_flops(train_step, params, opt_state, one)
    np.testing.assert_allclose(row["flops_per_step"], per_step, rtol=0.01)
    assert row["batch_size"] == 13


def test_every_overlap_driver_trains_the_same_parameters(key):
    """Fetching the loss, or not, or scanning, changes when the host waits, never the values."""
    train_step, params, opt_state = _step(key)
    batches = random_batches(key, 7, 11, 5, 3)
    drivers = measure.overlap_drivers(train_step, params, opt_state, batches, 1e-4, k=3)
    host_alone = drivers.pop("host work alone")
    assert len(host_alone()) == 7  # the host work of each of the 7 batches, without a step
    results = {name: run() for name, run in drivers.items()}
    assert len(results) == 5
    reference = results["scan, data on device"]
    for name, got in results.items():
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(reference)):
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6, err_msg=name)


def test_predicted_step_seconds_follow_the_overlap_model():
    p = measure.predicted_step_seconds(host=3.0, device=5.0, k=4)
    assert p["fetch every step"] == 8.0
    assert p["never fetch"] == 5.0
    assert p["fetch every 4 steps"] == 5.0 + 3.0 / 4
    none = measure.predicted_step_seconds(host=3.0, device=5.0, k=4, overlap=0.0)
    assert set(none.values()) == {8.0}  # no free core: every driver h + d
    half = measure.predicted_step_seconds(host=3.0, device=5.0, k=4, overlap=0.5)
    assert half["never fetch"] == 5.0 + 1.5 and half["fetch every 4 steps"] == 6.5 + 1.5 / 4
    with pytest.raises(ValueError, match="overlap in \\[0, 1\\]"):
        measure.predicted_step_seconds(host=3.0, device=5.0, k=4, overlap=1.5)


def test_free_core_share_is_a_share_and_sees_a_core_taken_by_the_device():
    share = measure.free_core_share(lambda: jnp.ones(3) + 1, tries=3)
    assert 0.0 <= share <= 1.0

    # "Device work" that is a Python thread holding the interpreter lock while it spins: the
    # host's loop beside it gets about half a core, so the share must say so.
    class Hog:
        def __init__(self):
            iterations = measure.spin_iterations(0.06)
            self.thread = threading.Thread(target=measure.throughput._spin, args=(iterations,))
            self.thread.start()

        def block_until_ready(self):
            self.thread.join()
            return self

    assert measure.free_core_share(Hog, tries=3) < 0.8
    with pytest.raises(ValueError, match="tries must be >= 1, got 0"):
        measure.free_core_share(Hog, tries=0)


def test_host_pipeline_yields_every_batch_in_order():
    batches = [jaxloops.Batch(np.full((2, 3), i), np.full((2,), i)) for i in range(5)]
    out = list(measure.host_pipeline(batches, 10))
    assert [int(b.y[0]) for b in out] == [0, 1, 2, 3, 4]


def test_fit_against_bare_epoch_counts_the_steps_of_both(digits, key):
    params = jaxloops.init_mlp(key, (64, 7, 10))
    optimizer = jaxloops.make_optimizer(1e-3, 0.0)
    step = jaxloops.make_train_step(jaxloops.mlp_loss, optimizer)
    out = measure.fit_against_bare_epoch(
        key, params, optimizer.init(params), step, digits.train, batch_size=300, epochs=2, rounds=1
    )
    assert out["steps"] == 2 * (digits.train.x.shape[0] // 300)
    assert out["fit"] > 0 and out["bare epoch"] > 0
    assert not params["dense_0"]["w"].is_deleted()  # copies were donated, not the caller's
