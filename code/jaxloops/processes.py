"""Starting the book's worker processes (`jaxloops.workers`): the command line that runs
one, the environment that pins it to the CPU, and the sizes handed to it as JSON.

A parent starts a worker with `command(name, ...)`. The checkpoint and sharding workers run
on the CPU platform with the devices the parent asks for (`cpu_env`), whatever accelerator
the parent has, so they neither take its GPU nor see one device where the page expects
eight. Every worker is given its sizes as JSON (`sizes_json`) by the parent: a worker never
asks `experiment_sizes()` for its own backend's sizes, which may not be the chapter's. This
module names the workers without importing them: a concept module that starts one imports
this, never `jaxloops.workers`.
"""

import dataclasses
import json
import os
import sys
import types
import typing

from jaxloops import sizes as sizes_module

NAMES = ("cache_probe", "checkpoint", "sharding", "step_speed", "streaming", "torch_twin")


_DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


def command(name: str, *args) -> list[str]:
    """The command line that runs worker `name` in a new Python process."""
    if name not in NAMES:
        raise ValueError(f"unknown worker {name!r}; expected one of {NAMES}")
    return [sys.executable, "-m", f"jaxloops.workers.{name}", *map(str, args)]


def cpu_env(devices: int, env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment (default: this process's) of a worker pinned to `devices` CPU devices.

    JAX_PLATFORMS=cpu keeps it off any GPU; XLA's host-device-count flag gives the CPU
    `devices` devices. With one device the flag is left out, as in a process that never set
    it: XLA's flags are part of the persistent cache's key, so a worker and the parent's CPU
    then share compiled programs.
    """
    if devices < 1:
        raise ValueError(f"a worker needs at least 1 CPU device, got {devices}")
    env = dict(os.environ if env is None else env)
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith(_DEVICE_COUNT_FLAG)]
    if devices > 1:
        flags.append(f"{_DEVICE_COUNT_FLAG}={devices}")
    env["XLA_FLAGS"] = " ".join(flags)
    env["JAX_PLATFORMS"] = "cpu"
    env.pop("JAX_NUM_CPU_DEVICES", None)  # would override the flag
    return env


# Platforms whose devices a second process can open while this one holds them. A TPU chip is
# held by one process at a time: a second one fails at start-up ("The TPU is already in use").
_SHAREABLE = ("cpu", "gpu")


def device_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment (default: this process's) of a worker that compiles for this process's
    backend: that backend where a second process can open it (a GPU without preallocating its
    memory, so both processes fit), else the CPU with one device (`cpu_env(1)`)."""
    import jax

    env = dict(os.environ if env is None else env)
    if jax.default_backend() not in _SHAREABLE:
        return cpu_env(1, env)
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    return env


def sizes_json(**parts) -> str:
    """Parts of `experiment_sizes()` as one JSON object: `sizes_json(loop=sizes.loop)`."""
    kinds = {field.name: field.type for field in dataclasses.fields(sizes_module.Sizes)}
    for name, part in parts.items():
        if not isinstance(part, kinds.get(name, ())) or name == "backend":
            raise ValueError(f"{name}={part!r} is not a part of the experiment sizes")
    return json.dumps({name: dataclasses.asdict(part) for name, part in parts.items()})


def sizes_from_json(text: str) -> types.SimpleNamespace:
    """The parts written by `sizes_json`, as their dataclasses: `parts.loop.hidden`, ..."""
    kinds = {field.name: field.type for field in dataclasses.fields(sizes_module.Sizes)}
    parts = {}
    for part, values in json.loads(text).items():
        kind = kinds.get(part)
        if not dataclasses.is_dataclass(kind):
            raise ValueError(f"unknown sizes part {part!r} in {text[:80]!r}")
        fields = {field.name: field.type for field in dataclasses.fields(kind)}
        for name, value in values.items():  # JSON has lists where the sizes have tuples
            if typing.get_origin(fields.get(name)) is tuple:
                values[name] = tuple(value)
        parts[part] = kind(**values)
    return types.SimpleNamespace(**parts)


def check_cpu_devices(expected: int) -> None:
    """Raises RuntimeError unless this process runs on the CPU with `expected` local devices
    (a worker started without `cpu_env`)."""
    import jax

    platform, count = jax.default_backend(), jax.local_device_count()
    if platform != "cpu" or count != expected:
        raise RuntimeError(
            f"this worker runs on {count} {platform} device(s), not {expected} CPU devices: "
            f"start it with env=jaxloops.workers.cpu_env({expected})"
        )
