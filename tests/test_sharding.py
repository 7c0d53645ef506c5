"""Chapter 12: data parallel, FSDP and two processes on 8 simulated CPU devices.

pytest's process has already started JAX with one device, so the 8-device checks run in one
subprocess that reports what it measured as JSON; each test asserts one property of it.
"""

import json
import os
import pathlib
import subprocess
import sys

import jax
import pytest

import jaxloops
from jaxloops import sharding

ROOT = pathlib.Path(__file__).resolve().parents[1]

PROBE = r"""
import json, sys, warnings
warnings.filterwarnings("error", category=DeprecationWarning)
import jax
jax.config.update("jax_num_cpu_devices", 8)
import numpy as np
import jaxloops
from jaxloops import sharding

out_dir = sys.argv[1]
sizes = jaxloops.experiment_sizes("cpu").sharding
mesh = jaxloops.data_mesh(8)
split = jaxloops.load_digits_split(seed=0)
x, y = split.train.x[:40], split.train.y[:40]  # B = 40 = 5 rows per device
batch = jaxloops.Batch(x, y)
params = jax.device_get(jaxloops.init_mlp(jax.random.key(3), (64, 24, 16, 10)))
optimizer = jaxloops.make_optimizer(3e-3, 1e-2)
opt_state = jax.device_get(optimizer.init(params))
step = jaxloops.make_train_step(jaxloops.mlp_loss, optimizer)
flat = lambda t: np.concatenate([np.ravel(a) for a in jax.tree.leaves(t)])
report = {}
one = jax.jit(step)(params, opt_state, batch)
g_one = flat(jax.grad(lambda p, b: jaxloops.mlp_loss(p, b)[0])(params, batch))
rows = jaxloops.Batch(jax.P("data"), jax.P("data"))
for name, kind in [("dp", "dp"), ("fsdp", "fsdp"), ("shard_map", "dp")]:
    p_specs = jaxloops.strategy_specs(params, kind, mesh)
    o_specs = jaxloops.strategy_specs(opt_state, kind, mesh)
    loss = sharding.gathered(jaxloops.mlp_loss, mesh) if kind == "fsdp" else jaxloops.mlp_loss
    if name == "shard_map":
        sharded = jaxloops.shard_map_step(jaxloops.mlp_loss, optimizer, mesh)
    else:
        train_step = jaxloops.make_train_step(loss, optimizer)
        sharded = jaxloops.sharded_step(train_step, mesh, p_specs, o_specs)
    args = (sharding.place(mesh, p_specs, params), sharding.place(mesh, o_specs, opt_state),
            sharding.place(mesh, rows, batch))
    compiled = jax.jit(sharded).lower(*args).compile()
    new = jax.device_get(compiled(*args))
    report[name] = {
        "collectives": sharding.collectives(compiled.as_text()),
        "state_bytes": sharding.device_bytes(args[:2]),
        "argument_bytes": compiled.memory_analysis().argument_size_in_bytes,
        "batch_bytes": sharding.device_bytes(args[2]),
        "param_diff": float(np.max(np.abs(flat(new[0]) - flat(one[0])))),
        "loss_diff": float(abs(new[2]["loss"] - one[2]["loss"])),
    }
g_dp = flat(jax.jit(jax.grad(lambda p, b: jaxloops.mlp_loss(p, b)[0]))(
    sharding.place(mesh, jaxloops.strategy_specs(params, "dp", mesh), params),
    sharding.place(mesh, rows, batch)))
report["grad_diff"] = float(np.max(np.abs(g_dp - g_one)))
report["grad_max"] = float(np.max(np.abs(g_one)))
report["param_bytes"] = int(sum(a.nbytes for a in jax.tree.leaves(params)))

errors = {}
def error_of(fn):
    try:
        fn()
    except ValueError as e:
        return str(e)
    return None
errors["mesh"] = error_of(lambda: jaxloops.data_mesh(9))
odd = jaxloops.Batch(x[:12], y[:12])
errors["batch"] = error_of(lambda: jax.jit(jaxloops.sharded_step(step, mesh, *(
    jaxloops.strategy_specs(t, "dp", mesh) for t in (params, opt_state))))(params, opt_state, odd))
errors["shard_map_batch"] = error_of(
    lambda: jaxloops.shard_map_step(jaxloops.mlp_loss, optimizer, mesh)(params, opt_state, odd))
errors["spec"] = error_of(lambda: sharding.place(mesh, jax.P("data"), np.zeros((10, 3))))
report["errors"] = errors

tiny = dict(sizes.__dict__, epochs=1)
tiny = type(sizes)(**tiny)
n = tiny.examples
trained, _, _ = jaxloops.fit_data_parallel(
    jax.random.key(0), mesh, jaxloops.Batch(split.train.x[:n], split.train.y[:n]), n, tiny)
one_process = {jax.tree_util.keystr(p): np.asarray(l)
               for p, l in jax.tree_util.tree_leaves_with_path(jax.device_get(trained))}
two = sharding.run_processes(out_dir, num_processes=2, devices_per_process=4, epochs=1)
report["process_diff"] = max(float(np.max(np.abs(one_process[k] - two[k]))) for k in one_process)
print("REPORT" + json.dumps(report))
"""


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("sharding")
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT / "code"), os.environ.get("PYTHONPATH", "")]),
    )
    run = subprocess.run(
        [sys.executable, "-c", PROBE, str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    line = next(line for line in run.stdout.splitlines() if line.startswith("REPORT"))
    return json.loads(line[len("REPORT") :])


def test_sharded_steps_equal_the_single_device_step(report):
    # Gradients differ only by the order of the sums: a few float32 ulps of the largest.
    assert report["grad_diff"] <= 1e-5 * report["grad_max"]
    # Adam's first step moves a parameter by lr * g / (|g| + eps): a gradient difference dg
    # moves it by at most lr * dg / eps (plus rounding of the parameter itself).
    tolerance = 3e-3 * report["grad_diff"] / 1e-8 + 1e-6
    for name in ("dp", "fsdp", "shard_map"):
        assert report[name]["param_diff"] <= tolerance, (name, report[name]["param_diff"])
        assert report[name]["loss_diff"] <= 1e-5, (name, report[name]["loss_diff"])


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
    assert report["process_diff"] <= 1e-5


def test_bad_inputs_name_the_sizes(report):
    errors = report["errors"]
    assert "9" in errors["mesh"] and "8 are available" in errors["mesh"]
    assert "12" in errors["batch"] and "8 devices" in errors["batch"]
    assert "12" in errors["shard_map_batch"]
    assert "size 10" in errors["spec"] and "8 devices" in errors["spec"]


def test_collectives_parse_tuple_and_single_results():
    hlo = (
        "%a = (f32[3,5]{1,0}, f32[]) all-reduce(%x, %y), channel_id=1\n"
        "%b = bf16[7]{0} all-gather(%z), dimensions={0}\n"
        "%c = f32[11]{0} add(%p, %q)\n"
    )
    assert sharding.collectives(hlo) == {"all-reduce": (1, 64), "all-gather": (1, 14)}


def test_fsdp_spec_splits_the_first_divisible_dimension():
    assert sharding.fsdp_spec((3, 16), 8) == jax.P(None, "data")
    assert sharding.fsdp_spec((24, 16), 8) == jax.P("data")
    assert sharding.fsdp_spec((10,), 8) == jax.P()


def test_mesh_larger_than_the_devices_is_refused():
    with pytest.raises(ValueError, match=f"{jax.device_count() + 1} devices"):
        jaxloops.data_mesh(jax.device_count() + 1)


def test_critical_batch_follows_the_formula():
    assert sharding.critical_batch(6e12, 1e9, "dp") == pytest.approx(4000)
    assert sharding.critical_batch(6e12, 1e9, "fsdp") == pytest.approx(6000)
    with pytest.raises(ValueError, match="'tp'"):
        sharding.critical_batch(1.0, 1.0, "tp")
