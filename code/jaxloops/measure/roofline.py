"""The roofline of the machine that builds the book: one measurement per build, shared.

A latency prediction is max(FLOPs / ceiling FLOP/s, bytes / bandwidth). Both ceilings are
measured here, several times, and kept with their spread. During `make book` the first
chapter that asks measures and writes them to the file named by $JAXLOOPS_ROOFLINE (the
Makefile deletes it before each build); every later chapter reads the same numbers, so one
build never quotes two ceilings. Without the variable, a process measures once and keeps
the result in memory.
"""

import dataclasses
import functools
import json
import os
import pathlib
import statistics

import jax
import jax.numpy as jnp

from jaxloops.backend import experiment_sizes
from jaxloops.measure.machine import describe_backend
from jaxloops.measure.timing import time_call

ROOFLINE_ENV = "JAXLOOPS_ROOFLINE"


@dataclasses.dataclass(frozen=True)
class Roofline:
    """Measured ceilings of one device: float32 matmul FLOP/s and memory read bytes/s."""

    device: str
    flops_per_s: float  # median of the samples
    flops_samples: tuple[float, ...]
    bytes_per_s: float  # median of the samples
    bytes_samples: tuple[float, ...]
    matmul_size: int
    read_bytes: int

    def predict(self, flops: float, bytes_moved: float) -> float:
        """Seconds the roofline allows: the slower of computing and moving."""
        if flops < 0 or bytes_moved < 0:
            raise ValueError(f"need flops >= 0 and bytes >= 0, got {flops}, {bytes_moved}")
        return max(flops / self.flops_per_s, bytes_moved / self.bytes_per_s)

    def bound(self, flops: float, bytes_moved: float) -> str:
        """ "compute" or "memory": which ceiling the prediction hits."""
        return "compute" if flops / self.flops_per_s >= bytes_moved / self.bytes_per_s else "memory"

    @property
    def ridge(self) -> float:
        """FLOPs per byte above which a program is compute-bound on this machine."""
        return self.flops_per_s / self.bytes_per_s

    def spread(self, which: str) -> float:
        """(max - min) / median of the samples of "flops" or "bytes"."""
        samples = {"flops": self.flops_samples, "bytes": self.bytes_samples}[which]
        return (max(samples) - min(samples)) / statistics.median(samples)


def measure_roofline(
    key: jax.Array, *, matmul_size: int, read_bytes: int, samples: int = 5, repeats: int = 5
) -> Roofline:
    """Measures both ceilings `samples` times, alternating, so a busy moment hits both.

    Args:
      matmul_size: n of the (n x n) @ (n x n) float32 matmul (2 n^3 FLOPs).
      read_bytes: size of the float32 array summed to measure the read bandwidth; larger
        than the caches, so it measures memory.
    """
    if samples < 1 or matmul_size < 1 or read_bytes < 4:
        raise ValueError(
            f"need samples, matmul_size >= 1 and read_bytes >= 4, got "
            f"{samples}, {matmul_size}, {read_bytes}"
        )
    a_key, b_key = jax.random.split(key)
    a = jax.random.normal(a_key, (matmul_size, matmul_size), jnp.float32)
    b = jax.random.normal(b_key, (matmul_size, matmul_size), jnp.float32)
    big = jnp.ones((read_bytes // 4,), jnp.float32)
    # Full float32 precision: on GPUs the default would be TF32 (or bf16 passes on TPU).
    matmul = jax.jit(functools.partial(jnp.matmul, precision=jax.lax.Precision.HIGHEST))
    read = jax.jit(lambda x: jnp.sum(x, dtype=jnp.float32))
    flops, rates = [], []
    for _ in range(samples):
        flops.append(2.0 * matmul_size**3 / time_call(matmul, a, b, warmup=1, repeats=repeats))
        rates.append(big.nbytes / time_call(read, big, warmup=1, repeats=repeats))
    return Roofline(
        describe_backend(),
        statistics.median(flops),
        tuple(flops),
        statistics.median(rates),
        tuple(rates),
        matmul_size,
        int(big.nbytes),
    )


@functools.lru_cache(maxsize=1)
def _in_memory() -> Roofline:
    return _measure_default()


def _measure_default() -> Roofline:
    sizes = experiment_sizes()
    read_bytes = 256 * 2**20 if sizes.backend == "cpu" else 4 * 2**30
    return measure_roofline(
        jax.random.key(0), matmul_size=sizes.measure.matmul_size, read_bytes=read_bytes
    )


def roofline() -> Roofline:
    """This build's roofline: read from $JAXLOOPS_ROOFLINE if a chapter measured it already,
    otherwise measured now (and written there when the variable is set)."""
    path = os.environ.get(ROOFLINE_ENV)
    if not path:
        return _in_memory()
    path = pathlib.Path(path)
    if path.exists():
        fields = json.loads(path.read_text())
        fields = {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}
        return Roofline(**fields)
    measured = _measure_default()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(dataclasses.asdict(measured)))
    partial.replace(path)  # atomic: a reader never sees half a file
    return measured
