"""Simulates a machine whose default backend has one device (one GPU), on a CPU.

With JAXLOOPS_ONE_DEFAULT_DEVICE=1 and this folder on PYTHONPATH, every Python process that
does not pin itself to the CPU (JAX_PLATFORMS=cpu, as the book's workers do) sees one device
wherever it asks JAX for devices without naming a backend: `jax.devices()`,
`jax.device_count()`, `jax.local_devices()`, `jax.local_device_count()` and `jax.make_mesh`
without `devices=`. Asking for the CPU's devices (`jax.devices("cpu")`) still gets them all,
as on a GPU machine. So a mesh built from the default backend's devices fails here as it
would on one GPU:

  JAXLOOPS_ONE_DEFAULT_DEVICE=1 PYTHONPATH=tests/one_default_device make chapter N=12
  JAXLOOPS_ONE_DEFAULT_DEVICE=1 PYTHONPATH=tests/one_default_device .venv/bin/python -m pytest

What it does not simulate: a second platform. Uncommitted arrays still land on the CPU, so
it cannot show a computation that runs on the GPU where the page meant the CPU.
"""

import os

SIMULATE = os.environ.get("JAXLOOPS_ONE_DEFAULT_DEVICE") == "1"
if SIMULATE and os.environ.get("JAX_PLATFORMS") != "cpu":  # a CPU-pinned worker is not simulated
    import jax
    from jax._src import xla_bridge

    _devices, _local_devices = xla_bridge.devices, xla_bridge.local_devices

    def devices(backend=None):
        return _devices(backend) if backend is not None else _devices()[:1]

    def local_devices(process_index=None, backend=None, host_id=None):
        if backend is not None:
            return _local_devices(process_index, backend, host_id)
        return _local_devices(process_index, backend, host_id)[:1]

    def device_count(backend=None):
        return len(devices(backend))

    def local_device_count(backend=None):
        return len(local_devices(backend=backend))

    for module in (jax, xla_bridge):
        module.devices, module.local_devices = devices, local_devices
        module.device_count, module.local_device_count = device_count, local_device_count
    jax.ONE_DEFAULT_DEVICE_SIMULATED = True
