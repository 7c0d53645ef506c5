"""The roofline of the machine that builds the book: a ceiling no program beats, one per build.

A latency prediction is max(FLOPs / ceiling FLOP/s, bytes / bandwidth). Each ceiling is the
best of its samples (the timing rule, `jaxloops.measure.timing`): one call each of a large
float32 matmul and of a large read, taken in turn, so that a busy moment of a shared machine
hits both, and the fastest call is the least disturbed. A chapter that compares a program
with a ceiling samples the ceiling again, interleaved with that program
(`samples_beside_ceiling`), and raises the build's roofline with those samples: a rate
above the ceiling means the ceiling was measured at a bad moment, and the build measures
again rather than publish a fraction above 1 (more than CEILING_MARGIN above it fails the
page's check).

During `make book` the first chapter that asks measures and writes the roofline to the file
named by $JAXLOOPS_ROOFLINE (the Makefile deletes it before each build); every later chapter
reads the same numbers, raised ones included, so one build never quotes two ceilings. Without
the variable, a process keeps it in memory.
"""

import dataclasses
import json
import os
import pathlib
import statistics

import jax
import jax.numpy as jnp

from jaxloops.measure.machine import describe_backend
from jaxloops.measure.timing import interleaved_samples
from jaxloops.sizes import experiment_sizes

ROOFLINE_ENV = "JAXLOOPS_ROOFLINE"
# A measured rate may exceed its ceiling by this much and still be published as at most 1:
# two calls of the same program differ by about this on a quiet machine.
CEILING_MARGIN = 0.03
MATMUL, READ = "ceiling: float32 matmul", "ceiling: memory read"


@dataclasses.dataclass(frozen=True)
class Roofline:
    """Measured ceilings of one device: float32 matmul FLOP/s and memory read bytes/s, each
    the best of its samples."""

    device: str
    flops_per_s: float  # best of flops_samples
    flops_samples: tuple[float, ...]
    bytes_per_s: float  # best of bytes_samples
    bytes_samples: tuple[float, ...]
    matmul_size: int
    read_bytes: int
    precision: str = "default"  # the matmul's: JAX's default matmul precision when measured

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
        if which not in ("flops", "bytes"):
            raise ValueError(f'which must be "flops" or "bytes", got {which!r}')
        samples = self.flops_samples if which == "flops" else self.bytes_samples
        return (max(samples) - min(samples)) / statistics.median(samples)

    def raised(self, flops_samples=(), bytes_samples=()) -> "Roofline":
        """This roofline with more samples; each ceiling is the best of old and new."""
        flops = self.flops_samples + tuple(float(f) for f in flops_samples)
        rates = self.bytes_samples + tuple(float(b) for b in bytes_samples)
        return dataclasses.replace(
            self, flops_per_s=max(flops), flops_samples=flops, bytes_per_s=max(rates),
            bytes_samples=rates,
        )  # fmt: skip


# The ceilings' programs, jitted once: each `ceiling_runs` call (one per chapter that samples
# the ceiling beside its work, one per length of chapter 10's decode sweep) reuses them.
# At the matmul precision the build's programs run at (JAX's default, which `make book` sets
# to "highest"): a ceiling measured at another precision is not theirs. A TPU's default float32
# matmul is one bfloat16 pass, about five times its "highest" rate (a GPU's default, TF32).
ceiling_matmul = jax.jit(jnp.matmul)  # public: chapter 11 times it in bfloat16 beside float32
_read = jax.jit(lambda x: jnp.sum(x, dtype=jnp.float32))


def ceiling_runs(key: jax.Array, *, matmul_size: int, read_bytes: int | None = None) -> dict:
    """The calls that sample the ceilings, `() -> result`, to interleave with other work:
    {MATMUL: an (n x n) @ (n x n) float32 matmul (2 n^3 FLOPs), READ: a sum over a float32
    array of `read_bytes`, larger than the caches, so it measures memory (only if given)}."""
    if matmul_size < 1 or (read_bytes is not None and read_bytes < 4):
        raise ValueError(f"need matmul_size >= 1, read_bytes >= 4; got {matmul_size}, {read_bytes}")
    a_key, b_key = jax.random.split(key)
    a = jax.random.normal(a_key, (matmul_size, matmul_size), jnp.float32)
    b = jax.random.normal(b_key, (matmul_size, matmul_size), jnp.float32)
    runs = {MATMUL: lambda: ceiling_matmul(a, b)}
    if read_bytes is not None:
        big = jnp.ones((read_bytes // 4,), jnp.float32)
        runs[READ] = lambda: _read(big)
    return runs


def ceiling_rates(samples: dict[str, list[float]], matmul_size: int, read_bytes: int = 0):
    """{"flops": FLOP/s of each MATMUL sample, "bytes": bytes/s of each READ sample}, from
    the seconds `interleaved_samples` timed (either may be missing)."""
    return {
        "flops": [2.0 * matmul_size**3 / s for s in samples.get(MATMUL, ())],
        "bytes": [4 * (read_bytes // 4) / s for s in samples.get(READ, ())],
    }


def measure_roofline(key: jax.Array, *, matmul_size: int, read_bytes: int, samples: int = 25):
    """Both ceilings, each the best of `samples` calls, the two taken in turn (each timed
    call after an untimed one of the same kind)."""
    if samples < 1:
        raise ValueError(f"need samples >= 1, got {samples}")
    runs = ceiling_runs(key, matmul_size=matmul_size, read_bytes=read_bytes)
    rates = ceiling_rates(interleaved_samples(runs, samples), matmul_size, read_bytes)
    return Roofline(
        describe_backend(),
        max(rates["flops"]),
        tuple(rates["flops"]),
        max(rates["bytes"]),
        tuple(rates["bytes"]),
        matmul_size,
        4 * (read_bytes // 4),
        str(jax.config.jax_default_matmul_precision or "default"),
    )


def last_level_cache_bytes() -> int | None:
    """Bytes of the processor's largest cache (Linux sysfs), or None where it is not known.

    The read ceiling streams an array larger than this; data that fits in it is read faster,
    so a memory-bound prediction is a floor only for working sets well above it."""
    sizes = []
    for path in pathlib.Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = path.read_text().strip().upper()
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes) if sizes else None


_IN_MEMORY: dict[str, Roofline] = {}


def _measure_default() -> Roofline:
    sizes = experiment_sizes()
    read_bytes = 256 * 2**20 if sizes.backend == "cpu" else 4 * 2**30
    return measure_roofline(
        jax.random.key(0), matmul_size=sizes.measure.matmul_size, read_bytes=read_bytes
    )


def store_roofline(roof: Roofline) -> Roofline:
    """Makes `roof` this build's roofline: stored at $JAXLOOPS_ROOFLINE for every later
    chapter, or kept in this process where that is unset (the tests store one measured at a
    test's size, tests/conftest.py)."""
    path = os.environ.get(ROOFLINE_ENV)
    if not path:
        _IN_MEMORY["roofline"] = roof
        return roof
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(dataclasses.asdict(roof)))
    partial.replace(path)  # atomic: a reader never sees half a file
    return roof


def roofline() -> Roofline:
    """This build's roofline: read from $JAXLOOPS_ROOFLINE if a chapter measured it already
    (raised samples included), otherwise measured now and stored."""
    path = os.environ.get(ROOFLINE_ENV)
    if path and pathlib.Path(path).exists():
        fields = json.loads(pathlib.Path(path).read_text())
        fields = {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}
        return Roofline(**fields)
    if not path and "roofline" in _IN_MEMORY:
        return _IN_MEMORY["roofline"]
    return store_roofline(_measure_default())


def raise_roofline(flops_samples=(), bytes_samples=()) -> Roofline:
    """Adds ceiling samples taken beside some work to this build's roofline, stores it for
    every later chapter, and returns it."""
    return store_roofline(roofline().raised(flops_samples, bytes_samples))


def samples_beside_ceiling(
    runs: dict, rounds: int, *, read: bool = False, matmuls: dict | None = None
) -> tuple[dict[str, list[float]], Roofline]:
    """`interleaved_samples` of `runs` ({name: () -> result}) taken in turn with the
    roofline's matmul (and, with `read`, its read), whose samples raise this build's
    ceilings (`raise_roofline`). `matmuls` ({name: (() -> result, FLOPs of a call)}) adds
    other matmuls to the compute ceiling's samples: the work's own kind of matmul.

    Returns:
      (the seconds of each of `runs`, the roofline now: its ceilings were sampled beside them).
    """
    matmuls = matmuls or {}
    if {MATMUL, READ} & (set(runs) | set(matmuls)) or set(runs) & set(matmuls):
        names = f"{sorted(runs)}, {sorted(matmuls)}"
        raise ValueError(f"{MATMUL!r} and {READ!r} name the ceilings' own samples, and a run "
                         f"and a matmul share no name: {names}")  # fmt: skip
    roof = roofline()
    read_bytes = roof.read_bytes if read else None
    ceilings = ceiling_runs(jax.random.key(1), matmul_size=roof.matmul_size, read_bytes=read_bytes)
    ceilings |= {name: run for name, (run, _) in matmuls.items()}
    samples = interleaved_samples({**runs, **ceilings}, rounds)
    own = {name: samples.pop(name) for name in ceilings}
    rates = ceiling_rates(own, roof.matmul_size, roof.read_bytes)
    rates["flops"] += [f / s for name, (_, f) in matmuls.items() for s in own[name]]
    return samples, raise_roofline(flops_samples=rates["flops"], bytes_samples=rates["bytes"])
