"""The processes the book starts, each a module run as `python -m jaxloops.workers.<name>`.

  cache_probe  chapter 1: compiles the training program in a fresh process (persistent cache)
  checkpoint   chapter 13: trains, is stopped or killed and resumes; saves from 8 devices and
               restores onto 4
  sharding     chapter 12: one process of a multi-process data-parallel run
  step_speed   chapter 11: the transformer's train step, with or without glibc's huge pages
  streaming    chapter 15: a run streamed by Grain, killed mid-epoch and resumed (needs grain)
  torch_twin   `make bench`: the step of chapter 11 against its PyTorch twin (needs torch)

A parent starts one through `jaxloops.processes` (`command(name, ...)`, `cpu_env`,
`sizes_json`), whose names this package re-exports for the chapters: `workers.cpu_env(8)`.
"""

import importlib

from jaxloops.processes import (
    NAMES,
    check_cpu_devices,
    command,
    cpu_env,
    sizes_from_json,
    sizes_json,
)


def __getattr__(name: str):
    """The workers themselves, imported on first use (`workers.checkpoint.experiment`): not
    at import, so `python -m jaxloops.workers.<name>` runs a module not imported before."""
    if name in NAMES:
        return importlib.import_module(f"jaxloops.workers.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = (
    "check_cpu_devices",
    "command",
    "cpu_env",
    "sizes_from_json",
    "sizes_json",
)
