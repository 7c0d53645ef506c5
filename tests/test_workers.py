"""The worker processes: started on the CPU with the parent's sizes, importable and callable."""

import ast
import json
import os
import pathlib
import re
import subprocess
import sys

import jax
import pytest

import jaxloops
from jaxloops import processes, workers
from jaxloops.workers import cache_probe
from jaxloops.workers import sharding as sharding_worker

ROOT = pathlib.Path(__file__).resolve().parents[1]
SIMULATION = ROOT / "tests" / "one_default_device"


def test_cpu_env_pins_the_platform_and_the_device_count():
    base = {"XLA_FLAGS": "--xla_backend_optimization_level=0 "
            "--xla_force_host_platform_device_count=3", "JAX_NUM_CPU_DEVICES": "5"}  # fmt: skip
    env = workers.cpu_env(8, base)
    assert env["JAX_PLATFORMS"] == "cpu" and "JAX_NUM_CPU_DEVICES" not in env
    assert env["XLA_FLAGS"].split() == [
        "--xla_backend_optimization_level=0",
        "--xla_force_host_platform_device_count=8",
    ]
    # One device: no flag at all, so the worker's programs share the parent's cache keys.
    assert workers.cpu_env(1, base)["XLA_FLAGS"] == "--xla_backend_optimization_level=0"
    assert base["XLA_FLAGS"].endswith("=3")  # the parent's environment is left alone
    with pytest.raises(ValueError, match="got 0"):
        workers.cpu_env(0)


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_sizes_travel_as_json_unchanged(backend):
    sizes = jaxloops.experiment_sizes(backend)
    text = workers.sizes_json(loop=sizes.loop, lm=sizes.lm, sharding=sizes.sharding)
    back = workers.sizes_from_json(text)
    assert (back.loop, back.lm, back.sharding) == (sizes.loop, sizes.lm, sizes.sharding)
    assert isinstance(back.loop.hidden, tuple)


def test_bad_sizes_and_names_are_refused():
    sizes = jaxloops.experiment_sizes("cpu")
    with pytest.raises(ValueError, match="loop="):
        workers.sizes_json(loop=sizes.lm)  # a part under another part's name
    with pytest.raises(ValueError, match="'colour'"):
        workers.sizes_from_json(json.dumps({"colour": {}}))
    with pytest.raises(ValueError, match="'resnet'"):
        workers.command("resnet")
    assert workers.command("sharding", "--x", 3)[1:] == [
        "-m",
        "jaxloops.workers.sharding",
        "--x",
        "3",
    ]


def test_a_device_worker_shares_a_gpu_and_leaves_a_tpu_to_this_process(monkeypatch):
    base = {"XLA_FLAGS": "", "JAX_PLATFORMS": ""}
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert processes.device_env(base) == {**base, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")  # a chip held by one process
    assert processes.device_env(base)["JAX_PLATFORMS"] == "cpu"


def test_a_worker_started_without_cpu_env_says_so():
    with pytest.raises(RuntimeError, match=r"cpu_env\(7\)"):
        workers.check_cpu_devices(7)


def test_process_rows_split_evenly_or_refuse():
    assert [sharding_worker.process_rows(12, p, 3) for p in range(3)] == [
        slice(0, 4), slice(4, 8), slice(8, 12)
    ]  # fmt: skip
    with pytest.raises(ValueError, match="13 examples"):
        sharding_worker.process_rows(13, 0, 2)


def test_the_cache_probe_compiles_at_the_sizes_it_is_given():
    loop = jaxloops.experiment_sizes("cpu").loop
    small = type(loop)(**{**loop.__dict__, "hidden": (5, 3)})
    assert cache_probe.compile_seconds(small, epochs=1) > 0


def devices_seen(env) -> list[int]:
    """[default devices, CPU devices] of a new Python process started with `env`, on the CPU
    platform whatever else this machine has: the simulation is of a one-device machine on a
    CPU, and a TPU chip that this process holds cannot be opened by a second one. The child
    pins itself in code, not through JAX_PLATFORMS, which is how a worker escapes the
    simulation."""
    code = (
        "import jax; jax.config.update('jax_platforms', 'cpu'); "
        "print(jax.device_count(), jax.device_count('cpu'))"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return [int(n) for n in done.stdout.split()]


def test_one_default_device_simulation_and_cpu_pinned_workers():
    """The simulation of a one-GPU machine sees 1 default device and 8 CPU ones; a worker
    started with cpu_env(8) sees 8 on its default backend, the CPU, either way."""
    simulated = dict(os.environ, JAXLOOPS_ONE_DEFAULT_DEVICE="1")
    simulated["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(SIMULATION), os.environ.get("PYTHONPATH")])
    )
    flag = "--xla_force_host_platform_device_count=8"
    assert devices_seen({**simulated, "XLA_FLAGS": flag}) == [1, 8]
    assert devices_seen(workers.cpu_env(8, simulated)) == [8, 8]


def unnamed_device_calls(source: str) -> list[str]:
    """Calls in `source` that take the default backend's devices: `jax.devices()`,
    `jax.device_count()`, `jax.local_devices()` without a backend, `make_mesh` without
    `devices=`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        name, keywords = node.func.attr, {k.arg for k in node.keywords}
        if name in ("devices", "device_count", "local_devices") and not node.args:
            if not keywords & {"backend"}:
                found.append(ast.unparse(node))
        if name == "make_mesh" and "devices" not in keywords:
            found.append(ast.unparse(node))
    return found


def code_cells(markdown: str) -> str:
    """The Python of a chapter's code cells, without their `:tags:` lines."""
    cells = re.findall(r"```\{code-cell\} python\n(.*?)```", markdown, re.S)
    return "\n".join(re.sub(r"^:\w+:.*$", "", cell, flags=re.M) for cell in cells)


def test_no_mesh_is_built_from_the_default_backends_devices():
    """A mesh of `jax.devices()` has one device on a one-GPU machine: the package, the mesh
    chapters and the sharding probe name their devices (jax.devices("cpu")) throughout."""
    assert unnamed_device_calls("jax.devices(); jax.make_mesh((8,), ('d',))") == [
        "jax.devices()", "jax.make_mesh((8,), ('d',))"
    ]  # fmt: skip
    assert unnamed_device_calls("jax.devices('cpu'); jax.device_count(backend='cpu')") == []
    sources = {
        path: path.read_text()
        for path in [
            *(ROOT / "code" / "jaxloops").rglob("*.py"),
            ROOT / "tests" / "sharding_probe.py",
        ]
        if path.name != "machine.py"  # reports the default backend's devices, builds nothing
    }
    for chapter in ("12_sharding.md", "13_checkpoints.md"):
        sources[ROOT / "book" / chapter] = code_cells((ROOT / "book" / chapter).read_text())
    found = {
        str(p.relative_to(ROOT)): calls
        for p, s in sources.items()
        if (calls := unnamed_device_calls(s))
    }
    assert found == {}
    with pytest.raises(TypeError):
        jaxloops.data_mesh(1)  # the devices are always named
    assert jaxloops.data_mesh(1, jax.devices("cpu")).devices.size == 1
