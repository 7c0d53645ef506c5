"""Chapter 12: data parallel, FSDP and two processes on 8 simulated CPU devices.

pytest's process has already started JAX, with one default device (or a GPU), so the
8-device checks run in one process of their own (tests/sharding_probe.py), pinned to the CPU
with 8 devices, that reports what it measured as JSON; each test asserts one property of it.
"""

import json
import pathlib
import subprocess
import sys

import jax
import pytest

import jaxloops
from conftest import once_per_session
from jaxloops import sharding, workers

PROBE = pathlib.Path(__file__).with_name("sharding_probe.py")


def run_probe(out) -> dict:
    run = subprocess.run(
        [sys.executable, str(PROBE), str(out)],
        capture_output=True,
        text=True,
        env=workers.cpu_env(8),
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    line = next(line for line in run.stdout.splitlines() if line.startswith("REPORT"))
    return json.loads(line[len("REPORT") :])


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


def test_two_processes_train_the_same_parameters_as_one(report):
    # Not bit for bit: gloo sums the devices' partial gradients in its own order.
    assert report["process_diff"] <= 1e-5, report["process_diff"]


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


def test_critical_batch_follows_the_formula():
    assert sharding.critical_batch(6e12, 1e9, "dp") == pytest.approx(4000)
    assert sharding.critical_batch(6e12, 1e9, "fsdp") == pytest.approx(6000)
    with pytest.raises(ValueError, match="'tp'"):
        sharding.critical_batch(1.0, 1.0, "tp")
