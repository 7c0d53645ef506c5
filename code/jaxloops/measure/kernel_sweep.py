"""Chapter 17's TPU run: the Pallas attention kernel against the anchors, side by side.

At B 4, N 8, bfloat16, H 128 and 64, T = S = 1024 to 16384, full and causal, forward and
forward + backward, one configuration at a time, every implementation's calls taken in turn
(`timing.interleaved_samples`) with the ceilings beside them:

  pallas            this book's kernel (`pallas_attention`), heads-major, over block sizes;
  pallas, B T N H   the same at the default blocks, called in the book's layout (transposes);
  blockwise         the book's plain-JAX `blockwise_attention`, its defaults;
  xla               `jax.nn.dot_product_attention` (XLA's attention);
  flash_attention   JAX's Pallas TPU flash attention, over the same block sizes;
  splash            JAX's splash attention, over the same block sizes;
  ceiling: depth H  a matmul H deep (Pallas), its (rows, H) @ (H, cols) products summed in
                    VMEM: the MXU at attention's contraction depth, nothing written to HBM;
  ceiling: square   an (n x n) @ (n x n) bfloat16 matmul (XLA).

Block sizes: (Tb, Sb) in 128 .. 1024, every pair for the forward pass at T = 8192, equal pairs
elsewhere; the libraries' inner compute blocks at most 512. FLOPs: forward 4 B N T^2 H, also
causal; forward + backward 3.5 times that. Rows are written to the JSON file after each
configuration, and a second run skips the configurations present (measured with the same
kernel source); a failure (out of memory, a kernel a backend cannot compile) is a row with an
"error". `python -m jaxloops.measure.kernel_sweep OUT.json --budget SECONDS [--quick]`;
`--quick` runs tiny sizes, the kernels interpreted, on any backend.
"""

import argparse
import functools
import hashlib
import json
import pathlib
import statistics
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import jaxloops
from jaxloops import pallas_attention as pa
from jaxloops.measure.machine import machine_facts
from jaxloops.measure.timing import interleaved_samples

SOURCES = ("pallas_attention.py", "pallas_kernels.py")  # the kernel's source, under jaxloops/
BACKWARD_FACTOR = 3.5  # forward + backward FLOPs over the forward's
LIBRARY_COMPUTE_BLOCK = 512  # the libraries' inner block, at most this (blocks of 1024: 512)
VMEM_RETRY_BYTES = 96 * 2**20  # a kernel refused for VMEM is tried again with this limit


class Config(NamedTuple):
    H: int
    T: int
    is_causal: bool
    mode: str  # "forward" or "forward+backward"

    @property
    def name(self) -> str:
        causal = "causal" if self.is_causal else "full"
        return f"H {self.H}, T {self.T}, {causal}, {self.mode}"


class Plan(NamedTuple):
    batch: int
    heads: int
    dtype: str
    configs: tuple[Config, ...]  # in the order they run: the goals' first
    blocks: tuple[int, ...]
    all_pairs_at: int  # the length at which the forward pass tries every (Tb, Sb)
    rounds: int
    ceiling_rows: int  # rows of the depth-H ceiling's left operand
    ceiling_cols: int  # its right operand's rows, resident in VMEM
    ceiling_tiles: tuple[int, ...]  # its output tiles (one ceiling sample each)
    square: int  # n of the square ceiling
    interpret: object  # the Pallas kernels': None is `pa.default_interpret()`


def plan(quick: bool = False) -> Plan:
    """The sweep: the chip's sizes, or `quick`, tiny ones whose kernels run interpreted."""
    lengths, heads_dims = ((256,), (64,)) if quick else ((8192, 4096, 16384, 2048, 1024), (128, 64))
    configs = [
        Config(H, T, causal, mode)
        for T in lengths
        for mode in ("forward", "forward+backward")
        for causal in (False, True)
        for H in heads_dims
    ]
    if quick:
        return Plan(1, 2, "bfloat16", tuple(configs), (128, 256), 256, 2, 512, 256, (128,), 256,
                    True)  # fmt: skip
    return Plan(4, 8, "bfloat16", tuple(configs), (128, 256, 512, 1024), 8192, 5,
                2**17, 8192, (512, 1024), 8192, None)  # fmt: skip


def source_hashes(root: pathlib.Path | None = None) -> dict[str, str]:
    """SHA-256 of each file of the kernel's source."""
    root = pathlib.Path(pa.__file__).parent if root is None else root
    return {name: hashlib.sha256((root / name).read_bytes()).hexdigest() for name in SOURCES}


def source_digest(hashes: dict[str, str]) -> str:
    """One digest of the kernel's source files: what a row was measured with."""
    return hashlib.sha256(json.dumps(hashes, sort_keys=True).encode()).hexdigest()


def attention_flops(B: int, N: int, T: int, H: int, mode: str) -> float:
    """The issue's count: forward 4 B N T^2 H (causal too), forward + backward 3.5 times it."""
    forward = 4.0 * B * N * T * T * H
    return forward * (BACKWARD_FACTOR if mode == "forward+backward" else 1.0)


def block_pairs(config: Config, p: Plan) -> list[tuple[int, int]]:
    """(Tb, Sb) tried at this configuration: every pair at `all_pairs_at` (forward), else
    equal blocks; none longer than T."""
    sizes = [b for b in p.blocks if b <= config.T]
    if config.T == p.all_pairs_at and config.mode == "forward":
        return [(q, k) for q in sizes for k in sizes]
    return [(b, b) for b in sizes]


class Run(NamedTuple):
    """One implementation at one block size: `make(vmem_limit_bytes)` builds its function of
    (query, key, value), arrays in `layout`."""

    implementation: str
    layout: str  # "BNTH" (heads-major) or "BTNH" (the book's)
    block_q: int | None
    block_k: int | None
    make: object


def _flash(config: Config, Tb: int, Sb: int):
    from jax.experimental.pallas.ops.tpu import flash_attention as flash

    inner_q, inner_k = min(Tb, LIBRARY_COMPUTE_BLOCK), min(Sb, LIBRARY_COMPUTE_BLOCK)
    sizes = flash.BlockSizes(
        block_q=Tb, block_k_major=Sb, block_k=inner_k, block_b=1,
        block_q_major_dkv=Tb, block_k_major_dkv=Sb, block_k_dkv=inner_k, block_q_dkv=inner_q,
        block_k_major_dq=Sb, block_k_dq=inner_k, block_q_dq=Tb,
    )  # fmt: skip
    scale = 1.0 / np.sqrt(config.H)
    return functools.partial(
        flash.flash_attention, causal=config.is_causal, sm_scale=scale, block_sizes=sizes
    )


def _splash(config: Config, Tb: int, Sb: int, heads: int):
    """Splash attention over the batch (`vmap`); it does not scale: its query comes scaled."""
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    shape = (config.T, config.T)
    mask = splash.CausalMask(shape) if config.is_causal else splash.FullMask(shape)
    inner = min(Sb, LIBRARY_COMPUTE_BLOCK)
    sizes = splash.BlockSizes(
        block_q=Tb, block_kv=Sb, block_kv_compute=inner, block_q_dkv=Tb, block_kv_dkv=Sb,
        block_kv_dkv_compute=inner, block_q_dq=Tb, block_kv_dq=Sb,
    )  # fmt: skip
    kernel = splash.make_splash_mha_single_device(
        splash.MultiHeadMask([mask] * heads), block_sizes=sizes
    )
    return jax.vmap(kernel)


def runs(config: Config, p: Plan) -> list[Run]:
    """Every implementation and block size timed at this configuration, the anchors first."""
    causal = config.is_causal
    ours = functools.partial(pa.pallas_attention, is_causal=causal, interpret=p.interpret)
    found = [
        Run("blockwise", "BTNH", None, None,
            lambda _: functools.partial(jaxloops.blockwise_attention, is_causal=causal)),
        Run("xla", "BTNH", None, None,
            lambda _: functools.partial(jax.nn.dot_product_attention, is_causal=causal,
                                        implementation="xla")),
        Run("pallas, B T N H", "BTNH", pa.default_block(config.T), pa.default_block(config.T),
            lambda limit: functools.partial(ours, vmem_limit_bytes=limit)),
    ]  # fmt: skip
    for Tb, Sb in block_pairs(config, p):
        found += [
            Run("pallas", "BNTH", Tb, Sb, lambda limit, Tb=Tb, Sb=Sb: functools.partial(
                ours, block_q=Tb, block_k=Sb, layout="BNTH", vmem_limit_bytes=limit)),
            Run("flash_attention", "BNTH", Tb, Sb,
                lambda _, Tb=Tb, Sb=Sb: _flash(config, Tb, Sb)),
            Run("splash", "BNTH", Tb, Sb,
                lambda _, Tb=Tb, Sb=Sb: _splash(config, Tb, Sb, p.heads)),
        ]  # fmt: skip
    return found


def _depth_kernel(a_ref, b_ref, out_ref, *, tile: int):
    """Adds this step's (tile, H) rows times every (tile, H) block of the resident operand,
    transposed, into the (tile, tile) output, which stays in VMEM for the whole grid."""

    @pl.when(pl.program_id(0) == 0)
    def _start():
        out_ref[...] = jnp.zeros(out_ref.shape, jnp.float32)

    @pl.loop(0, b_ref.shape[0] // tile)
    def _block(r):
        start = pl.multiple_of(r * tile, tile)
        out_ref[...] += pa.mxu_dot(a_ref[...], b_ref[pl.ds(start, tile), :], contract_last=True)


def depth_matmul(a, b, *, tile: int, interpret=None):
    """The ceiling at contraction depth H: sum over blocks of a (rows, H) @ b.T, b (cols, H)
    kept in VMEM, the (tile, tile) float32 sums too: 2 rows cols H FLOPs, every product H deep,
    and nothing written to HBM but the last tile."""
    interpret = pa.default_interpret() if interpret is None else interpret
    rows, H = a.shape
    return pl.pallas_call(
        functools.partial(_depth_kernel, tile=tile),
        grid=(rows // tile,),
        in_specs=[
            pl.BlockSpec((tile, H), lambda i: (i, 0)),
            pl.BlockSpec(b.shape, lambda i: (0, 0)),
        ],
        out_specs=pl.BlockSpec((tile, tile), lambda i: (0, 0)),
        out_shape=jax.ShapeDtypeStruct((tile, tile), jnp.float32),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)),
        interpret=interpret,
    )(a, b)


def _first_line(error: Exception) -> str:
    lines = str(error).strip().splitlines() or [""]
    return f"{type(error).__name__}: {lines[0]}"[:500]


def _inputs(config: Config, p: Plan) -> dict:
    """Standard-normal query, key, value and output gradient in both layouts, and the query
    scaled by 1/sqrt(H) for splash, drawn with NumPy (no sampler to compile per shape)."""
    rng = np.random.default_rng(config.T + config.H)
    shape = (p.batch, p.heads, config.T, config.H)  # heads-major
    q, k, v, d_out = (
        jnp.asarray(rng.standard_normal(shape, np.float32), p.dtype) for _ in range(4)
    )
    heads = (q, k, v, d_out)
    book = tuple(jnp.swapaxes(x, 1, 2) for x in heads)
    scaled = (q * jnp.asarray(1.0 / np.sqrt(config.H), q.dtype), k, v, d_out)
    return {"BNTH": heads, "BTNH": book, "splash": scaled}


def _call(fn, mode: str, q, k, v, d_out):
    """() -> the forward output, or the gradients w.r.t. q, k, v for `d_out` (one program)."""
    if mode == "forward":
        forward = jax.jit(fn)
        return lambda: forward(q, k, v)
    both = jax.jit(lambda q, k, v, d_out: jax.vjp(fn, q, k, v)[1](d_out))
    return lambda: both(q, k, v, d_out)


def _prepare(run: Run, config: Config, inputs: dict) -> tuple[dict, object]:
    """(its row, its call once compiled and run once; None where it failed: the row says why).
    A Pallas kernel refused for VMEM is tried again with VMEM_RETRY_BYTES."""
    row = {"implementation": run.implementation, "layout": run.layout, "block_q": run.block_q,
           "block_k": run.block_k, "vmem_limit_bytes": None, "error": ""}  # fmt: skip
    data = inputs["splash" if run.implementation == "splash" else run.layout]
    for limit in (None, VMEM_RETRY_BYTES):
        try:
            call = _call(run.make(limit), config.mode, *data)
            jax.block_until_ready(call())  # compiled
            began = time.perf_counter()
            jax.block_until_ready(call())  # warm: what one sample will take
            row.update(vmem_limit_bytes=limit, error="", warm_seconds=time.perf_counter() - began)
            return row, call
        # A kernel refused (VMEM, a shape, no TPU), out of memory, a compile failure.
        except Exception as error:  # noqa: BLE001
            row["error"] = _first_line(error)
            retry = run.implementation.startswith("pallas") and "vmem" in str(error).lower()
            if limit is not None or not retry:
                break
    return row, None


def ceiling_calls(config: Config, p: Plan) -> dict:
    """{(name, size): (call, FLOPs)}: the depth-H matmul at two tiles, and the square one."""
    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.standard_normal((p.ceiling_rows, config.H), np.float32), jnp.bfloat16)
    b = jnp.asarray(rng.standard_normal((p.ceiling_cols, config.H), np.float32), jnp.bfloat16)
    depth_flops = 2.0 * p.ceiling_rows * p.ceiling_cols * config.H
    calls = {}
    for tile in p.ceiling_tiles:
        depth = jax.jit(functools.partial(depth_matmul, tile=tile, interpret=p.interpret))
        calls["ceiling: depth H", tile] = (lambda depth=depth: depth(a, b), depth_flops)
    square = jnp.asarray(rng.standard_normal((p.square, p.square), np.float32), jnp.bfloat16)
    matmul = jax.jit(jnp.matmul)
    calls["ceiling: square", p.square] = (lambda: matmul(square, square), 2.0 * p.square**3)
    return calls


def measure_config(config: Config, p: Plan, deadline: float) -> list[dict] | None:
    """Every run of this configuration and the ceilings, timed in turn: one row each (None
    if the deadline passes before all are compiled: the configuration is left to a later run).
    A kernel's rate is its FLOPs over its median sample; a ceiling's, over its best."""
    inputs, calls, rows = _inputs(config, p), {}, []
    for run in runs(config, p):
        if time.monotonic() > deadline:
            return None
        row, call = _prepare(run, config, inputs)
        row["flops"] = attention_flops(p.batch, p.heads, config.T, config.H, config.mode)
        rows.append(row)
        if call is not None:
            calls[len(rows) - 1] = call
    for (name, size), (call, flops) in ceiling_calls(config, p).items():
        row = {"implementation": name, "layout": "", "block_q": size, "block_k": size,
               "vmem_limit_bytes": None, "error": "", "flops": flops}  # fmt: skip
        try:
            jax.block_until_ready(call())
            began = time.perf_counter()
            jax.block_until_ready(call())
            row["warm_seconds"] = time.perf_counter() - began
            calls[len(rows)] = call
        except Exception as error:  # noqa: BLE001 - recorded, as for the kernels
            row["error"] = _first_line(error)
        rows.append(row)
    round_seconds = sum(row.get("warm_seconds", 0.0) for row in rows)
    if time.monotonic() + p.rounds * round_seconds > deadline:
        return None  # the timed rounds would not end in time
    try:
        samples = interleaved_samples(calls, p.rounds, warmup_each=0, compile=False)
    except Exception as error:  # noqa: BLE001 - a run that failed only when timed: say so
        samples = {}
        for index in calls:
            rows[index]["error"] = f"while timed: {_first_line(error)}"
    for index, row in enumerate(rows):
        seconds = samples.get(index)
        row["samples"] = seconds
        row["seconds"] = statistics.median(seconds) if seconds else None
        rate_seconds = (
            min(seconds)
            if seconds and row["implementation"].startswith("ceiling")
            else row["seconds"]
        )
        row["tflops"] = row["flops"] / rate_seconds / 1e12 if rate_seconds else None
    return rows


def _row_facts(config: Config, p: Plan, digest: str) -> dict:
    return {
        "config": config.name, "H": config.H, "T": config.T, "is_causal": config.is_causal,
        "mode": config.mode, "B": p.batch, "N": p.heads, "K": p.heads, "dtype": p.dtype,
        "source_sha256": digest, "date": time.strftime("%Y-%m-%d", time.gmtime()),
    }  # fmt: skip


def load_rows(path: pathlib.Path, digest: str) -> list[dict]:
    """The rows of an earlier run at `path` measured with this kernel source (digest)."""
    if not path.exists():
        return []
    return [row for row in json.loads(path.read_text())["rows"] if row["source_sha256"] == digest]


def write_record(path: pathlib.Path, rows: list[dict], p: Plan) -> None:
    """The record: the machine, the kernel's source hashes, the plan and the rows (atomic)."""
    record = {
        "facts": machine_facts(),
        "sources": source_hashes(),
        "plan": p._asdict(),
        "rows": rows,
    }
    record["plan"]["configs"] = [c._asdict() for c in p.configs]
    record["plan"]["interpret"] = repr(p.interpret)
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(record, indent=1) + "\n")
    partial.replace(path)


def sweep(
    path, budget: float, *, quick: bool = False, max_configs: int | None = None
) -> list[dict]:
    """Runs the plan's configurations not yet in `path`, in order, writing after each, until
    `budget` seconds have passed (or `max_configs` have run): the rows now in `path`."""
    path, p = pathlib.Path(path), plan(quick)
    deadline, digest = time.monotonic() + budget, source_digest(source_hashes())
    rows = load_rows(path, digest)
    done = {row["config"] for row in rows}
    todo = [c for c in p.configs if c.name not in done][:max_configs]
    for config in todo:
        measured = measure_config(config, p, deadline)
        if measured is None:
            print(f"budget spent before {config.name}; {len(done)} configurations recorded")
            break
        rows += [{**_row_facts(config, p, digest), **row} for row in measured]
        done.add(config.name)
        write_record(path, rows, p)
        print(f"{config.name}: {len(measured)} rows ({time.monotonic() - deadline + budget:.0f} s)")
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="the JSON record, read first if it exists (resumed)")
    parser.add_argument("--budget", type=float, default=540.0, help="seconds; stops after it")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, kernels interpreted")
    parser.add_argument("--max-configs", type=int, default=None)
    args = parser.parse_args(argv)
    rows = sweep(args.out, args.budget, quick=args.quick, max_configs=args.max_configs)
    failed = sum(1 for row in rows if row["error"])
    print(f"{args.out}: {len(rows)} rows, {failed} with an error")


if __name__ == "__main__":
    main()
