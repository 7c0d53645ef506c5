"""Explicit sharding (chapter 12): FSDP's gather with `reduced`, the gradient types it gives,
and the bytes a device holds. These need 8 devices, so they run in a process of their own."""

import jax
import numpy as np
import pytest

from conftest import printed_report
from jaxloops import explicit, workers
from jaxloops.measure import held

PROBE = r"""
import json, jax, numpy as np
import jaxloops
from jaxloops import explicit, sharding
from jaxloops.measure import held
devices = jax.devices("cpu")
mesh = jax.make_mesh((8,), ("data",), devices=devices)
x = np.arange(5 * 24, dtype=np.float32).reshape(24, 5) / 100
params = {"w": np.linspace(-1, 1, 40, dtype=np.float32).reshape(8, 5)}
def loss(p, b):
    return (jax.numpy.tanh(b.x @ p["w"].T) ** 2).mean(), {}
batch = jaxloops.Batch(x, np.zeros((24,), np.int32))
specs = {"w": jax.P("data")}
p = sharding.place(mesh, specs, params)
b = sharding.place(mesh, jaxloops.Batch(jax.P("data"), jax.P("data")), batch)
out = {"types": {}, "grads": {}}
for reduced in (True, False):
    fn = explicit.gathered(loss, mesh, reduced=reduced)
    out["types"][str(reduced)] = explicit.gradient_types(fn, p, b)
    g = jax.jit(jax.grad(lambda p, b: fn(p, b)[0]))(p, b)
    out["grads"][str(reduced)] = np.asarray(g["w"]).tolist()
    out["grad_type"] = str(jax.typeof(g["w"]))
whole = jax.grad(lambda p: loss(p, batch)[0])(params)
out["whole"] = np.asarray(whole["w"]).tolist()
split = sharding.place(mesh, {"a": jax.P("data"), "c": jax.P()},
                       {"a": np.zeros((16, 3), np.float32), "c": np.zeros((5,), np.float32)})
out["bytes"] = held.device_bytes(split)
out["bytes_last"] = held.device_bytes(split, devices[7])
out["bytes_split_only"] = held.device_bytes(split["a"])
print("REPORT" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def report():
    return printed_report(["-c", PROBE], workers.cpu_env(8), timeout=300)


def test_reduced_gather_leaves_the_gradient_unreduced(report):
    assert report["types"]["True"] == ["float32[8,5]{U:data}"]
    assert report["types"]["False"] == ["float32[8,5]"]  # summed on every device: no mark


def test_both_gathers_give_the_single_device_gradient_in_its_shards(report):
    whole = np.array(report["whole"])
    for reduced in ("True", "False"):
        np.testing.assert_allclose(np.array(report["grads"][reduced]), whole, rtol=1e-6, atol=1e-8)
    assert report["grad_type"] == "float32[8@data,5]"
    # A wrong answer fails the same comparison: the gradient without its sum over devices.
    assert not np.allclose(whole / 8, whole, rtol=1e-6, atol=1e-8)


def test_device_bytes_counts_one_devices_shards(report):
    assert report["bytes"] == 16 * 3 * 4 // 8 + 5 * 4  # a shard of the split leaf, the whole copy
    assert report["bytes_last"] == report["bytes"]
    assert report["bytes_split_only"] == 16 * 3 * 4 // 8
    assert report["bytes_split_only"] != 16 * 3 * 4  # not the global size


def test_device_bytes_rejects_an_empty_tree_and_a_device_with_nothing():
    with pytest.raises(ValueError, match="no arrays"):
        held.device_bytes({})
    a = jax.device_put(np.zeros(3, np.float32))
    assert held.device_bytes(a) == 12
    other = object()
    with pytest.raises(ValueError, match="holds no shard"):
        held.device_bytes(a, other)


def test_gradient_types_rejects_a_tree_without_matrices():
    with pytest.raises(ValueError, match="no matrix"):
        explicit.gradient_types(lambda p, b: (p["b"].sum(), {}), {"b": np.zeros(3)}, None)
