import os
import time
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxloops
from conftest import normal
from jaxloops import measure
from jaxloops.measure import random_batches, scan_throughput


def _step(key):
    params = jaxloops.init_mlp(key, (5, 7, 3))
    optimizer = jaxloops.make_optimizer(1e-3, 1e-4)
    return jaxloops.make_train_step(jaxloops.mlp_loss, optimizer), params, optimizer.init(params)


def test_scan_flops_per_step_equal_the_steps_own_cost_analysis(key):
    train_step, params, opt_state = _step(key)
    # Only counted and timed: NumPy values put on the device, no sampler or slice compiled.
    x, y = normal((11, 13, 5)), np.random.default_rng(0).integers(0, 3, (11, 13)).astype(np.int32)
    batches = jaxloops.Batch(jax.device_put(x), jax.device_put(y))
    row = scan_throughput(train_step, params, opt_state, batches, repeats=1)
    per_step = measure.compiled_flops(train_step, params, opt_state, jaxloops.Batch(x[0], y[0]))
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
    assert len(results) == 6
    reference = results["scan, data on device"]
    for name, got in results.items():
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(reference)):
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6, err_msg=name)


def test_predicted_step_seconds_follow_the_overlap_model():
    p = measure.predicted_step_seconds(host=3.0, device=5.0, k=4)
    assert p["fetch every step"] == 8.0
    assert p["never fetch"] == 5.0
    assert p["fetch every 4 steps"] == 5.0 + 3.0 / 4
    # No free core: each runs at half speed beside the other, so overlapping gains nothing.
    none = measure.predicted_step_seconds(
        host=4.0, device=4.0, k=4, host_share=0.5, device_share=0.5
    )
    assert set(none.values()) == {8.0}
    # The host slowed to half beside the device: 6 s side by side, then 2 s of host work alone.
    slow = measure.predicted_step_seconds(host=5.0, device=3.0, k=2, host_share=0.5)
    assert slow["never fetch"] == 3.0 / 1.0 + (5.0 - 0.5 * 3.0) and slow["fetch every step"] == 8.0
    with pytest.raises(ValueError, match="shares in \\(0, 1\\]"):
        measure.predicted_step_seconds(host=3.0, device=5.0, k=4, host_share=0.0)


def test_a_fetch_adds_its_round_trip_and_a_dispatch_adds_to_the_host_part():
    # A fetch every step: h + d_f, whatever d is; never fetching: the slower of h + c and d.
    p = measure.predicted_step_seconds(host=3.0, device=2.0, k=4, fetched=5.0, dispatch=1.0)
    assert p["fetch every step"] == 3.0 + 5.0
    assert p["never fetch"] == 3.0 + 1.0  # the host, with its dispatch, is the slower part
    assert p["fetch every 4 steps"] == 4.0 + (8.0 - 4.0) / 4
    device_bound = measure.predicted_step_seconds(
        host=3.0, device=7.0, k=4, fetched=9.0, dispatch=1.0
    )
    assert device_bound["never fetch"] == 7.0 and device_bound["fetch every step"] == 12.0
    # No free core: the dispatch, host work too, queues behind the device's work.
    none = measure.predicted_step_seconds(
        host=3.0, device=2.0, k=4, host_share=0.5, device_share=0.5, fetched=5.0, dispatch=1.0
    )
    assert none["never fetch"] == 3.0 + 1.0 + 2.0
    with pytest.raises(ValueError, match="dispatch >= 0 and fetched > 0"):
        measure.predicted_step_seconds(host=3.0, device=2.0, k=4, dispatch=-1.0)


class _ReadyAt:
    """Stands in for an array that a device finishes at a known time."""

    def __init__(self, seconds):
        self.at = time.perf_counter() + seconds

    def is_ready(self):
        return time.perf_counter() >= self.at

    def block_until_ready(self):
        time.sleep(max(0.0, self.at - time.perf_counter()))
        return self


def test_the_loop_beside_the_device_sees_when_the_work_is_ready():
    long, short = measure.spin_iterations(0.1), measure.spin_iterations(0.005)
    spun, ready = measure.throughput._spin_beside(_ReadyAt(0.02), long)
    # Seen at the first check after it was ready. The stand-in's clock starts when it is
    # made, a few microseconds before the loop's, so "ready" may read just under 0.02 s.
    assert 0.02 - 1e-3 <= ready < spun, (spun, ready)
    spun, ready = measure.throughput._spin_beside(_ReadyAt(0.5), short)
    assert ready == spun < 0.5  # not ready when the loop ended: the loop's time, at most


# Device work for the core-share tests: one program compiled for the module, where the same
# work done eagerly compiles one per operation and shape.
_device_work = jax.jit(lambda: {"a": jnp.ones(3) + 1, "b": jnp.zeros(2)})


def test_core_shares_are_shares():
    host, device = measure.core_shares(_device_work, tries=3)
    assert 0.0 <= host <= 1.0 and 0.0 <= device <= 1.0
    with pytest.raises(ValueError, match="tries must be >= 1, got 0"):
        measure.core_shares(lambda: jnp.ones(3), tries=0)


def test_offered_cores_sums_each_copys_speed_relative_to_alone_at_most_one():
    assert measure.offered_cores(1.0, [1.0, 1.0]) == 2.0  # two free cores
    assert measure.offered_cores(1.0, [1.5, 1.5]) == pytest.approx(4 / 3)  # three jobs, two cores
    assert measure.offered_cores(1.0, [0.9, 2.0]) == 1.5  # faster than alone counts as 1
    # The chapter's threshold for "two free cores" (1.8) rejects one busy core's figure.
    assert measure.offered_cores(1.0, [1.5, 1.5]) < 1.8 <= measure.offered_cores(1.0, [1.05, 1.05])
    for alone, beside in ((0.0, [1.0]), (1.0, []), (1.0, [1.0, 0.0])):
        with pytest.raises(ValueError, match="times must be positive"):
            measure.offered_cores(alone, beside)


def test_free_cores_is_between_zero_and_the_core_count():
    assert 0.0 < measure.free_cores(seconds=0.01, tries=1) <= os.cpu_count()
    with pytest.raises(ValueError, match="seconds must be > 0 and tries >= 1, got 0.1, 0"):
        measure.free_cores(seconds=0.1, tries=0)


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
    assert out["fit"] > 0 and out["bare epoch"] > 0 and out["python loop"] > 0
    assert out["bare_over_fit"] == pytest.approx(out["bare epoch"] / out["fit"])  # one round
    assert out["python_over_fit"] == pytest.approx(out["python loop"] / out["fit"])
    assert 0 < out["dispatch"] < out["python loop"]  # one step's call, of the loop's many
    assert not params["dense_0"]["w"].is_deleted()  # copies were donated, not the caller's


def test_interleaved_with_core_shares_times_every_run_each_round():
    runs = {"a": lambda: jnp.ones(3), "b": lambda: jnp.zeros(3)}
    samples, shares = measure.interleaved_with_core_shares(runs, _device_work, rounds=3)
    assert [len(v) for v in samples.values()] == [3, 3] and all(0.0 <= x <= 1.0 for x in shares)


def test_turns_verdict_rejects_overlap_by_its_prediction_and_a_slow_hand_off_with_two_cores():
    h = d = 1e-3
    overlapped = 1.38e-3  # 0.69 x (h + d), as shares below 1 predict: the floor is 0.845
    assert measure.turns_verdict(2.1e-3, h, d, 1.97, 0.4, overlapped) == ([], mock.ANY)
    # Known-wrong: a step that overlapped as predicted fails on any machine, and so does one
    # at 0.6 x (h + d), which a fixed floor of 1 - band = 0.6 let pass.
    for cores in (1.97, 1.05):
        for every in (overlapped, 1.2e-3):
            failed, _ = measure.turns_verdict(every, h, d, cores, 0.4, overlapped)
            assert len(failed) == 1 and "nearer the overlapped 0.69 than 1" in failed[0]
    # Where overlap would gain under a fifth, the two are not told apart, and it is said.
    failed, sentence = measure.turns_verdict(1.7e-3, h, d, 1.05, 0.4, 1.9e-3)
    assert failed == [] and sentence.startswith("on neither side here; it cannot tell")
    # A hand-off 1.5x h + d fails with two cores free, and is only reported with one.
    failed, sentence = measure.turns_verdict(3e-3, h, d, 1.97, 0.4, overlapped)
    assert failed == ["a step took 1.50x h + d_f > 1.4, 1.97 cores free"]
    failed, sentence = measure.turns_verdict(3e-3, h, d, 1.2, 0.4, overlapped)
    assert failed == [] and "found 1.20" in sentence
    with pytest.raises(ValueError, match="0 < band < 1"):
        measure.turns_verdict(3e-3, h, d, 2.0, 1.5, overlapped)
