"""Chapter 12: data parallel, FSDP and two processes on 8 simulated CPU devices.

pytest's process has already started JAX, with one default device (or a GPU), so the
8-device checks run in one process of their own (tests/sharding_probe.py), pinned to the CPU
with 8 devices, that reports what it measured as JSON; each test asserts one property of it.
"""

import pathlib

import jax
import numpy as np
import pytest

import jaxloops
from conftest import once_per_session, printed_report
from jaxloops import fsdp, sharding, tensor_parallel, workers
from jaxloops.measure import comms

PROBE = pathlib.Path(__file__).with_name("sharding_probe.py")


def run_probe(out) -> dict:
    return printed_report([str(PROBE), str(out)], workers.cpu_env(8), timeout=600)


@pytest.fixture(scope="module")
def report(tmp_path_factory, worker_id):
    """The probe's report, measured once per session (not once per xdist worker)."""
    return once_per_session(tmp_path_factory, worker_id, "sharding-probe", run_probe)


def test_sharded_steps_equal_the_single_device_step_within_rounding(report):
    # The tolerances come from float32 rounding (jaxloops.equivalence): the gradient's batch
    # sum in another order, mapped through the slope of Adam's first step.
    assert report["grad_ratio"] <= 1, report["grad_ratio"]
    for name in ("dp", "fsdp", "shard_map"):
        assert report[name]["param_ratio"] <= 1, (name, report[name]["param_ratio"])
        assert report[name]["loss_diff"] <= 1e-5, (name, report[name]["loss_diff"])


@pytest.mark.parametrize("mutant", ["negated", "zeroed", "shifted"])
def test_the_tolerance_rejects_a_wrong_sharded_step(report, mutant):
    """A sign-flipped or zeroed gradient, or the batch one row late, is far outside it."""
    assert report[mutant]["param_ratio"] > 100, report[mutant]["param_ratio"]


def test_fsdp_holds_an_eighth_of_the_state_per_device(report):
    assert report["dp"]["state_bytes"] >= 7 * report["fsdp"]["state_bytes"]
    # The compiled program's arguments are that state plus each device's rows of the batch.
    dp, fsdp = (report[k]["argument_bytes"] - report[k]["batch_bytes"] for k in ("dp", "fsdp"))
    assert dp >= 7 * fsdp


def test_collectives_of_each_strategy(report):
    dp, fsdp, twin = (report[k]["collectives"] for k in ("dp", "fsdp", "shard_map"))
    assert "all-reduce" in dp and "all-gather" not in dp
    # The all-reduce carries every gradient value once (plus the loss and accuracy).
    assert report["param_bytes"] <= dp["all-reduce"][1] <= report["param_bytes"] + 64
    assert "all-gather" in fsdp
    assert "all-reduce" in fsdp or "reduce-scatter" in fsdp
    assert twin["all-reduce"][1] == dp["all-reduce"][1]


def skip_without_processes(report):
    """The two-process run needs TCP (`sharding.no_tcp_reason`): a machine that allows none
    cannot run it, and says why."""
    if report["processes_skipped"]:
        pytest.skip(report["processes_skipped"])


def test_a_machine_without_tcp_is_named_as_such(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError(97, "Address family not supported by protocol")

    monkeypatch.setattr(sharding.socket, "socket", refuse)
    assert "Address family not supported" in sharding.no_tcp_reason()


def test_two_processes_train_the_same_parameters_as_one(report):
    skip_without_processes(report)
    # Not bit for bit: gloo sums the devices' partial gradients in its own order.
    assert report["process_diff"] <= 1e-5, report["process_diff"]


def test_the_two_processes_checkpoint_restores_here_into_either_strategy(report):
    """Saved together by two processes (data parallel), restored onto this process's 8
    devices as data parallel and as FSDP: parameters and optimizer state identical."""
    skip_without_processes(report)
    dp, fsdp_ = report["restored"]["dp"], report["restored"]["fsdp"]
    assert dp["differing"] == [] and fsdp_["differing"] == []
    assert dp["arrays"] == fsdp_["arrays"] > 6  # the 6 parameters and Adam's state
    assert dp["state_bytes"] >= 7 * fsdp_["state_bytes"]  # FSDP's placement, split 8 ways


def test_bad_inputs_name_the_sizes(report):
    errors = report["errors"]
    assert "9" in errors["mesh"] and "8 are available" in errors["mesh"]
    assert "12" in errors["batch"] and "8 devices" in errors["batch"]
    assert "12" in errors["shard_map_batch"]
    assert "size 10" in errors["spec"] and "8 devices" in errors["spec"]


def test_fsdp_spec_splits_the_first_divisible_dimension():
    assert sharding.fsdp_spec((3, 16), 8) == jax.P(None, "data")
    assert sharding.fsdp_spec((24, 16), 8) == jax.P("data")
    assert sharding.fsdp_spec((10,), 8) == jax.P()


def test_mesh_larger_than_the_devices_is_refused():
    devices = jax.devices("cpu")
    with pytest.raises(ValueError, match=f"{len(devices) + 1} devices"):
        jaxloops.data_mesh(len(devices) + 1, devices)


def test_every_strategy_gradient_is_within_the_bound_and_wrong_ones_are_not(report):
    """Gradients before the optimizer, against the float32 summation bound: every strategy
    passes it, a sign-flipped and a zeroed gradient both fail it."""
    grads = report["grad"]
    for name in ("dp", "shard_map", "no_pmean"):
        assert grads[name] <= 1, (name, grads[name])
    for wrong in ("negated", "zeroed"):
        assert grads[wrong] > 100, (wrong, grads[wrong])


def test_the_all_reduce_comes_from_autodiff_not_from_pmean(report):
    dp = report["dp"]["collectives"]
    assert report["no_pmean_collectives"]["all-reduce"][0] == 1
    assert report["no_pmean_collectives"]["all-reduce"][1] == report["param_bytes"]
    assert dp["all-reduce"][1] == report["param_bytes"] + 8  # the step adds its two metrics


def test_fsdp_per_layer_and_tensor_parallel_equal_one_device(report):
    for name in ("per_layer", "twin", "tp", "tp_fsdp"):
        assert report["stack"][name]["ratio"] <= 1, (name, report["stack"][name]["ratio"])


def test_fsdp_per_layer_collectives_and_bytes_follow_the_formula(report):
    stack, n = report["stack"], 8
    L, P, P_L = stack["L"], stack["P"], stack["P_L"]
    twin, per_layer = stack["twin"]["steps"], stack["per_layer"]["steps"]
    # Forward: every weight gathered once; backward: the layers gathered again, then reduced.
    assert twin["forward"] == {"all-gather": [2 * L + 2, P]}
    assert twin["backward"]["all-gather"] == [2 * L, P_L]
    assert twin["backward"]["reduce-scatter"] == [2 * L + 2, P // n]
    assert "reduce-scatter" not in per_layer["backward"]  # the partitioner all-reduces
    assert per_layer["backward"]["all-reduce"][1] == P
    for name in ("per_layer", "twin"):
        assert stack[name]["state_bytes"] * n == P, (name, stack[name]["state_bytes"])
    # FSDP + TP: the layers split over all n devices, the outer weights over "data" (4).
    assert stack["tp_fsdp"]["state_bytes"] == P_L // n + (P - P_L) // 4


def test_tensor_parallel_all_reduces_one_activation_per_layer_and_pass(report):
    L, activation = report["stack"]["L"], report["stack"]["activation"]  # (B / d, D) float32
    for name in ("tp", "tp_fsdp"):
        found = report["stack"][name]["activations"]
        for phase in ("forward", "backward"):
            assert found[phase]["all-reduce"] == [L, L * activation], (name, found)


def test_critical_batch_is_c_over_w_for_data_parallel_and_fsdp():
    c, w = 6e12, 1e9
    assert comms.critical_batch(c, w, forward=0, backward=2) == pytest.approx(c / w)  # dp
    assert comms.critical_batch(c, w, forward=1, backward=2) == pytest.approx(c / w)  # fsdp
    assert comms.critical_batch(c, w, forward=1, backward=3) == pytest.approx(1.5 * c / w)
    with pytest.raises(ValueError, match="-1"):
        comms.critical_batch(c, w, forward=-1, backward=2)


def test_the_roofline_crosses_at_the_critical_batch():
    x = np.geomspace(10, 1e5, 500)
    compute, comm = comms.phase_times(x, 6e12, 1e9, flops=4, passes=2)
    assert comms.crossover(x, compute, comm) == pytest.approx(6000, rel=1e-3)
    assert comms.crossover(x, compute, comm + 1.0) == float("inf")


def test_tensor_parallel_hides_its_all_reduces_above_the_critical_width():
    c, w = 6e12, 1e9
    assert comms.critical_width(c, w, 2, forward=1, backward=1) == pytest.approx(c / w)
    assert comms.critical_width(c, w, 8, forward=1, backward=1) == pytest.approx(7 * c / w)
    assert comms.critical_width(c, w, 1, forward=1, backward=1) == 0  # one device sends nothing
    assert comms.critical_width(c, w, 2, forward=1, backward=4) == pytest.approx(2 * c / w)
    widths = np.geomspace(100, 1e6, 800)
    for flops, reductions, want in ((4, 1, c / w), (8, 1, c / w / 2), (4, 2, 2 * c / w)):
        compute, comm = comms.width_times(widths, c, w, 2, flops=flops, reductions=reductions)
        assert comms.crossover(widths, compute, comm) == pytest.approx(want, rel=1e-3)
    with pytest.raises(ValueError, match="model >= 1"):
        comms.critical_width(c, w, 0, forward=1, backward=1)


def test_ring_bytes_follow_the_ring_formulas():
    counted = {"all-gather": (1, 800), "all-reduce": (2, 100), "reduce-scatter": (1, 10)}
    assert comms.ring_bytes(counted, 8) == pytest.approx(7 / 8 * 800 + 2 * 7 / 8 * 100 + 7 * 10)
    with pytest.raises(ValueError, match="all-to-all"):
        comms.ring_bytes({"all-to-all": (1, 8)}, 8)


HLO = """\
%body.1 (p: f32[4]) -> f32[4] {
  %ag = f32[8,4]{1,0} all-gather(%x), channel_id=1, metadata={op_name="jit(f)/transpose(jvp())/b"}
  %rs = f32[2]{0} reduce-scatter(%y), channel_id=2, metadata={op_name="jit(f)/shard_map/rs"}
}

ENTRY %main () -> f32[4] {
  %w = (f32[4]) while(%t), condition=%cond.1, body=%body.1
  %ar = f32[16]{0} all-reduce(%z), channel_id=3, metadata={op_name="jit(f)/jvp()/dot_general"}
}
"""


def test_collectives_per_step_count_loop_trips_and_phases():
    steps = comms.per_step(HLO, trips=3)
    assert steps == {
        "forward": {"all-reduce": (1, 64)},  # named jvp(...): forward (tensor parallel's)
        "backward": {"all-gather": (3, 3 * 128), "reduce-scatter": (3, 3 * 8)},
    }
    assert comms.per_step(HLO, trips=3, only_bytes=8)["backward"] == {"reduce-scatter": (3, 24)}
    with pytest.raises(ValueError, match="trips must be >= 1, got 0"):
        comms.per_step(HLO, trips=0)


def test_a_mesh_shape_that_is_not_the_device_count_is_refused():
    devices = jax.devices("cpu")
    with pytest.raises(ValueError, match=rf"\(4, 3\) has 12 places for {len(devices)} devices"):
        tensor_parallel.grid_mesh((4, 3), devices)


def test_a_model_axis_that_does_not_divide_the_hidden_width_is_refused():
    params = jax.eval_shape(
        lambda: fsdp.init_stack(
            jax.random.key(0), features=64, width=8, hidden=15, layers=3, classes=10
        )  # fmt: skip
    )
    mesh = jax.sharding.AbstractMesh((4, 2), ("data", "model"))
    with pytest.raises(ValueError, match="2 devices does not divide the hidden width 15"):
        tensor_parallel.tp_specs(params, mesh, fsdp=False)


def test_held_blocks_gives_m_column_blocks_of_d_devices_and_with_fsdp_n_blocks_of_one(report):
    """w1 (D = 40, F = 24) on the 4 x 2 (data x model) grid: tensor parallel splits its columns
    over "model" (each half held by the 4 devices of a column); FSDP splits each half's rows
    over "data" too, one device a block."""
    tp, both = report["held"]["tp"], report["held"]["tp_fsdp"]
    assert [block for block, _ in tp] == [[0, 40, 0, 12], [0, 40, 12, 24]]
    assert sorted(len(ids) for _, ids in tp) == [4, 4]
    assert len(both) == 8 and all(len(ids) == 1 for _, ids in both)
    assert sorted(i for _, ids in both for i in ids) == list(range(8))
    assert sorted(block[0] for block, _ in both) == [0, 0, 10, 10, 20, 20, 30, 30]


def test_async_collectives_finds_start_done_pairs_and_not_synchronous_collectives():
    overlapped = (
        "%ars = f32[8]{0} all-reduce-start(f32[8]{0} %g), replica_groups={}\n"
        "%ard = f32[8]{0} all-reduce-done(f32[8]{0} %ars)\n"
        "%ags = (f32[2]{0}, f32[8]{0}) all-gather-start(f32[2]{0} %p), dimensions={0}\n"
    )
    assert comms.async_collectives(overlapped) == ["all-gather", "all-reduce"]
    assert comms.async_collectives("%ar = f32[8]{0} all-reduce(f32[8]{0} %g)\n") == []


def test_passes_read_from_the_compiled_programs_give_c_over_w_for_dp_and_the_fsdp_twin(report):
    """Chapter 12's critical batch: data parallel's all-reduce is two backward passes and no
    forward one; FSDP per layer's twin gathers once forward and a little under twice backward
    (the outer weights are kept from the forward pass); both give C / W."""
    dp, twin = report["dp"]["passes"], report["stack"]["twin"]["passes"]
    per_layer = report["stack"]["per_layer"]["passes"]  # its all-reduce where a reduce-scatter goes
    # The all-reduce also carries the step's two 4-byte metrics: 0.2 % of this small MLP.
    assert dp["forward"] == 0 and abs(dp["backward"] - 2) < 0.005, dp
    assert twin["forward"] == 1 and 1.5 < twin["backward"] < 2, twin
    assert per_layer["forward"] == 1 and 2.5 < per_layer["backward"] < 3, per_layer
    flops, link = 1e15, 4e11
    for passes in (dp, twin):
        assert comms.critical_batch(flops, link, **passes) == pytest.approx(flops / link, rel=1e-3)
    assert comms.critical_batch(flops, link, **per_layer) > 1.2 * flops / link
