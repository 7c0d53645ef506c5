"""GPU benchmarks for the book's "Measured on a GPU" appendix, in stages; writes results.json.

Usage (scripts/gpu_run.sh calls these, each under a time limit):
  python scripts/gpu_benchmarks.py first  --out DIR [--rehearse]   # report, ceilings, cuDNN bf16
  python scripts/gpu_benchmarks.py rest   --out DIR [--rehearse]   # other sweeps, MLP, plot
  python scripts/gpu_benchmarks.py record --out DIR STAGE STATUS SECONDS [--detail TEXT]
  python scripts/gpu_benchmarks.py check  DIR/results.json         # exit 1 on any problem

DIR/results.json is rewritten after every measured point, so a stage killed by its time limit
still leaves everything measured before it. Every failure, at compile or run time, is caught
and kept with its message in the row (and in "failures" where it was not a refusal).

--rehearse runs the same code on any backend at toy sizes: a check of the pipeline that CI
runs on the CPU, never a result to publish (the file says rehearsal: true and the book refuses
to render it). Sizes otherwise come from jaxloops.experiment_sizes().

Precision is stated, not inherited: float32 work runs at HIGHEST (full float32) inside
`jax.default_matmul_precision("highest")`; the TF32 ceiling names the dot algorithm
TF32_TF32_F32 (what DEFAULT runs on Hopper; the rehearsal on a CPU, which refuses it, asks for
HIGH); bfloat16 and float16 run at DEFAULT.
"""

import argparse
import dataclasses
import json
import pathlib
import statistics
import sys
import time

MIN_SAMPLE_SECONDS = 1e-3  # one timed sample: several calls, at least this long
MAX_CALLS_PER_SAMPLE = 4096
ATTENTION_BATCH = 4  # B of the GPU sweep: enough (B, N) pairs to fill the GPU at short T
# (name, label, dtype, precision): the ceiling table.
CEILINGS = (
    ("f32", "float32, precision HIGHEST (full float32)", "float32", "highest"),
    # TF32_TF32_F32 names the algorithm (a CPU refuses it: the rehearsal asks for "high").
    ("tf32", "float32 in TF32 (what DEFAULT runs on Hopper)", "float32", "TF32_TF32_F32"),
    ("bf16", "bfloat16 inputs, float32 accumulation", "bfloat16", "default"),
)
# The rest of the attention sweep, after the cuDNN bf16 points and the goal's points.
REST_REQUESTS = (
    ("naive", "bfloat16"),
    ("xla", "bfloat16"),
    ("cudnn", "float16"),
    ("blockwise", "bfloat16"),
    ("xla", "float32"),
)
MATERIALISING = ("naive", "xla")  # implementations that build the (B, N, T, S) scores


@dataclasses.dataclass(frozen=True)
class Plan:
    """Every size the run uses; written to the results file as it is."""

    lengths: tuple[int, ...]  # T = S of the attention sweep
    goal_length: int  # T = S at which the goals are judged
    materialise_max_length: int  # longest T = S at which naive and XLA run (else compiled only)
    causal_lengths: tuple[int, ...]
    batch: int  # B
    heads: int  # N
    head_dim: int  # H
    block_size: int
    samples: int  # timed samples per point (median reported)
    min_sample_seconds: float
    matmul_size: int
    read_bytes: int
    mlp_hidden: tuple[int, ...]
    mlp_batch_sizes: tuple[int, ...]
    mlp_steps: int


def make_plan(rehearse: bool) -> Plan:
    """The GPU plan from experiment_sizes(); the rehearsal's toy plan runs the same points."""
    import jaxloops

    sizes = jaxloops.experiment_sizes()
    attention = sizes.attention
    if rehearse:
        return Plan(
            lengths=(64, 128),
            goal_length=64,
            materialise_max_length=64,  # 128 takes the compile-only path
            causal_lengths=(64,),
            batch=1,
            heads=2,
            head_dim=64,
            block_size=64,
            samples=3,
            min_sample_seconds=MIN_SAMPLE_SECONDS,
            matmul_size=128,
            read_bytes=2**22,
            mlp_hidden=(32, 32),
            mlp_batch_sizes=(16,),
            mlp_steps=5,
        )
    return Plan(
        lengths=attention.lengths,
        goal_length=attention.materialise_max_length,
        materialise_max_length=attention.materialise_max_length,
        causal_lengths=attention.causal_lengths,
        batch=ATTENTION_BATCH,
        heads=attention.heads,
        head_dim=attention.head_dim,
        block_size=attention.block_size,
        samples=attention.repeats,
        min_sample_seconds=MIN_SAMPLE_SECONDS,
        matmul_size=sizes.measure.matmul_size,
        read_bytes=4 * 2**30,
        mlp_hidden=sizes.loop.hidden,
        mlp_batch_sizes=sizes.loop.throughput_batch_sizes,
        mlp_steps=sizes.loop.throughput_steps,
    )


# --- the results file -------------------------------------------------------------------


def first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines() or [""]
    return f"{type(error).__name__}: {lines[0][:300]}"


def write_json(path: pathlib.Path, data) -> None:
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(data, indent=1, default=float))
    partial.replace(path)  # atomic: a killed stage never leaves half a file


class Run:
    """The results file of one run directory, rewritten after every point."""

    def __init__(self, out: pathlib.Path, rehearse: bool):
        from jaxloops.measure import gpu_report, machine

        self.out = out
        self.path = out / "results.json"
        if self.path.exists():
            self.results = json.loads(self.path.read_text())
            if bool(self.results["facts"].get("rehearsal")) != rehearse:
                raise SystemExit(f"{self.path} is from a run with rehearsal != {rehearse}")
        else:
            import jax

            facts = machine.machine_facts()
            facts["rehearsal"] = rehearse
            facts["jax_default_matmul_precision"] = str(jax.config.jax_default_matmul_precision)
            self.results = {
                "facts": facts,
                "plan": dataclasses.asdict(make_plan(rehearse)),
                "stages": {name: {"status": "pending"} for name in gpu_report.STAGES},
                "implementations": [],
                "ceilings": [],
                "bandwidth": {},
                "attention": [],
                "causal": [],
                "mlp": [],
                "failures": [],
            }
        self.plan = Plan(**{k: tuple(v) if isinstance(v, list) else v
                            for k, v in self.results["plan"].items()})  # fmt: skip

    def save(self) -> None:
        stages = self.out / "stages.json"
        if stages.exists():  # what gpu_run.sh recorded about the stages so far
            self.results["stages"].update(json.loads(stages.read_text()))
        write_json(self.path, self.results)

    def fail(self, where: str, error: BaseException) -> str:
        message = first_line(error)
        self.results["failures"].append({"where": where, "error": message})
        print(f"FAILED {where}: {message}", flush=True)
        return message


# --- timing ----------------------------------------------------------------------------


def _run_calls(fn, args, calls: int) -> float:
    import jax

    start = time.perf_counter()
    out = None
    for _ in range(calls):  # queued back to back: the device, not Python, sets the pace
        out = fn(*args)
    jax.block_until_ready(out)
    return time.perf_counter() - start


def time_per_call(fn, args, *, samples: int, min_sample_seconds: float) -> dict:
    """Median seconds per call of a compiled `fn`, each sample several calls long.

    A fast kernel (tens of microseconds) timed one call at a time measures dispatch and
    synchronisation; here the calls per sample double until a sample lasts at least
    `min_sample_seconds`.
    """
    _run_calls(fn, args, 1)  # warm: compiled already, this loads and runs it once
    calls = 1
    # The shorter of two tries decides, so one slow moment cannot end the doubling early.
    while calls < MAX_CALLS_PER_SAMPLE and (
        min(_run_calls(fn, args, calls) for _ in range(2)) < min_sample_seconds
    ):
        calls *= 2
    # One doubling more: samples then last about twice the floor, so a faster moment later
    # (warmer caches, a quieter machine) still leaves them above it (the rehearsal caught one
    # sample at a third of the floor without this margin).
    calls = min(2 * calls, MAX_CALLS_PER_SAMPLE)
    times = [_run_calls(fn, args, calls) for _ in range(samples)]
    return {
        "seconds": statistics.median(times) / calls,
        "calls_per_sample": calls,
        "shortest_sample_seconds": min(times),
    }


def _cost(compiled) -> tuple[int | None, float | None]:
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    temp = int(memory.temp_size_in_bytes) if memory is not None else None
    return temp, float(cost.get("flops", 0.0)) if cost else None


# --- the points ------------------------------------------------------------------------


def precision_of(dtype: str) -> str:
    return "highest" if dtype == "float32" else "default"


def attention_point(run: Run, name: str, dtype: str, length: int, qkv, is_causal=False) -> dict:
    """One (implementation, dtype, T = S) point: checked run, compiled costs, timing."""
    import jax

    from jaxloops.measure import kernels

    plan = run.plan
    row = {
        "implementation": name,
        "dtype": dtype,
        "precision": precision_of(dtype),
        "T": int(length),
        "is_causal": bool(is_causal),
        "temp_bytes": None,
        "flops": None,
        "seconds": None,
        "calls_per_sample": None,
        "shortest_sample_seconds": None,
        "cudnn_kernel": False,
        "error": "",
    }
    where = f"attention {name} {dtype} T={length}{' causal' if is_causal else ''}"
    fn = kernels.attention_fn(name, is_causal=is_causal, block_size=plan.block_size)
    jitted = jax.jit(fn)
    try:
        with jax.default_matmul_precision(precision_of(dtype)):
            if name in MATERIALISING and length > plan.materialise_max_length:
                row["temp_bytes"], row["flops"] = _cost(jitted.lower(*qkv).compile())
                gib = (row["temp_bytes"] or 0) / 2**30
                row["error"] = f"not run: compiled only, needs {gib:.3g} GiB of scratch"
                return row
            # One checked run: compiles, warms up, and keeps a refusal's text.
            _, record = kernels.run_attention(
                name, *qkv, is_causal=is_causal, block_size=plan.block_size
            )
            if not record["works"]:
                row["error"] = record["error"]
                return row
            row["cudnn_kernel"] = record["cudnn_kernel"]
            row["temp_bytes"], flops = _cost(jitted.lower(*qkv).compile())
            # A loop body (blockwise) and a fused kernel (cuDNN) hide FLOPs from cost analysis.
            row["flops"] = flops if name in MATERIALISING else None
            row.update(
                time_per_call(
                    jitted,
                    qkv,
                    samples=plan.samples,
                    min_sample_seconds=plan.min_sample_seconds,
                )
            )
    except Exception as error:  # noqa: BLE001 - compile or run: out of memory, XLA, ...
        row["error"] = run.fail(where, error)
    return row


def draw_qkv(run: Run, length: int, dtype: str):
    import jax

    from jaxloops.measure import sweeps

    plan = run.plan
    return sweeps.random_qkv(
        jax.random.key(length),
        batch=plan.batch,
        length=length,
        heads=plan.heads,
        head_dim=plan.head_dim,
        dtype=dtype,
    )


def add_attention_point(run: Run, name: str, dtype: str, length: int, qkv) -> None:
    done = {(r["implementation"], r["dtype"], r["T"]) for r in run.results["attention"]}
    if (name, dtype, length) in done:
        return
    row = attention_point(run, name, dtype, length, qkv)
    run.results["attention"].append(row)
    run.save()
    shown = f"{1e3 * row['seconds']:.4g} ms" if row["seconds"] else row["error"]
    print(f"attention {name:9} {dtype:8} T = S = {length:6}: {shown}", flush=True)


def ceiling_point(run: Run, name: str, label: str, dtype: str, precision: str) -> dict:
    import functools

    import jax
    import jax.numpy as jnp
    import numpy as np

    n = run.plan.matmul_size
    if precision == "TF32_TF32_F32" and jax.default_backend() != "gpu":
        precision = "high"
    row = {"name": name, "label": label, "dtype": dtype, "precision": precision, "size": n}
    row.update(flops_per_s=None, seconds=None, error="")
    try:
        rng = np.random.default_rng(0)
        a, b = (jnp.asarray(rng.standard_normal((n, n), np.float32), dtype) for _ in range(2))
        matmul = jax.jit(functools.partial(jnp.matmul, precision=precision))
        row.update(
            time_per_call(
                matmul, (a, b), samples=run.plan.samples, min_sample_seconds=MIN_SAMPLE_SECONDS
            )
        )
        row["flops_per_s"] = 2.0 * n**3 / row["seconds"]
    except Exception as error:  # noqa: BLE001
        row["error"] = run.fail(f"ceiling {name}", error)
    return row


def bandwidth_point(run: Run) -> dict:
    import jax
    import jax.numpy as jnp

    row = {"nbytes": run.plan.read_bytes, "bytes_per_s": None, "error": ""}
    try:
        big = jnp.ones((run.plan.read_bytes // 4,), jnp.float32)
        read = jax.jit(lambda x: jnp.sum(x, dtype=jnp.float32))
        row.update(
            time_per_call(
                read, (big,), samples=run.plan.samples, min_sample_seconds=MIN_SAMPLE_SECONDS
            )
        )
        row["bytes_per_s"] = big.nbytes / row["seconds"]
        del big
    except Exception as error:  # noqa: BLE001
        row["error"] = run.fail("bandwidth", error)
    return row


# --- the stages ------------------------------------------------------------------------


def stage_first(run: Run) -> None:
    """The most valuable figures first: what works, the ceilings, cuDNN bf16, the goals."""
    from jaxloops.measure import kernels

    plan = run.plan
    try:
        run.results["implementations"] = kernels.implementation_report(
            kernels.default_cases(plan.head_dim),
            length=256,
            heads=plan.heads,
            block_size=plan.block_size,
        )
    except Exception as error:  # noqa: BLE001
        run.fail("implementation report", error)
    run.save()
    for row in run.results["implementations"]:
        print(
            f"{row['implementation']:9} {row['dtype']:8} H={row['head_dim']:3}: "
            f"{'works' if row['works'] else row['error']}",
            flush=True,
        )
    done = {row["name"] for row in run.results["ceilings"]}
    for name, label, dtype, precision in CEILINGS:
        if name not in done:
            run.results["ceilings"].append(ceiling_point(run, name, label, dtype, precision))
            run.save()
            print(f"ceiling {label}: {run.results['ceilings'][-1]['flops_per_s']}", flush=True)
    if not run.results["bandwidth"]:
        run.results["bandwidth"] = bandwidth_point(run)
        run.save()
        print(f"read bandwidth: {run.results['bandwidth']['bytes_per_s']} B/s", flush=True)
    for length in plan.lengths:
        qkv = draw_qkv(run, length, "bfloat16")
        add_attention_point(run, "cudnn", "bfloat16", length, qkv)
        if length == plan.goal_length:  # the goals compare cuDNN with naive (and XLA) here
            add_attention_point(run, "naive", "bfloat16", length, qkv)
            add_attention_point(run, "xla", "bfloat16", length, qkv)
        del qkv


def stage_rest(run: Run) -> None:
    """The rest of the sweep, the causal sweep, the MLP's device loop, and the plot."""
    plan = run.plan
    for length in plan.lengths:
        for dtype in sorted({dtype for _, dtype in REST_REQUESTS}):
            qkv = draw_qkv(run, length, dtype)
            for name, wanted in REST_REQUESTS:
                if wanted == dtype:
                    add_attention_point(run, name, dtype, length, qkv)
            del qkv
    done = {(r["implementation"], r["T"]) for r in run.results["causal"]}
    for length in plan.causal_lengths:
        qkv = draw_qkv(run, length, "bfloat16")
        for name in ("cudnn", "xla"):
            if (name, length) in done:
                continue
            full, causal = (
                attention_point(run, name, "bfloat16", length, qkv, is_causal=c)
                for c in (False, True)
            )
            ran = full["seconds"] and causal["seconds"]
            run.results["causal"].append(
                {
                    "implementation": name,
                    "dtype": "bfloat16",
                    "T": length,
                    "full_seconds": full["seconds"],
                    "causal_seconds": causal["seconds"],
                    "speedup": full["seconds"] / causal["seconds"] if ran else None,
                    "error": full["error"] or causal["error"],
                }
            )
            run.save()
            last = run.results["causal"][-1]
            print(f"causal {name} T = S = {length}: speedup {last['speedup']} {last['error']}")
        del qkv
    stage_mlp(run)
    plot(run)


def stage_mlp(run: Run) -> None:
    import jax

    import jaxloops
    from jaxloops import measure

    plan = run.plan
    key = jax.random.key(0)
    done = {row["batch_size"] for row in run.results["mlp"]}
    with jax.default_matmul_precision("highest"):  # float32 means float32, not TF32
        params = jaxloops.init_mlp(key, (64, *plan.mlp_hidden, 10))
        optimizer = jaxloops.make_optimizer(3e-3, 1e-2)
        train_step = jaxloops.make_train_step(jaxloops.mlp_loss, optimizer)
        for batch_size in plan.mlp_batch_sizes:
            if batch_size in done:
                continue
            try:
                row = measure.scan_throughput(
                    train_step,
                    params,
                    optimizer.init(params),
                    measure.random_batches(key, plan.mlp_steps, batch_size, 64, 10),
                    plan.samples,
                )
            except Exception as error:  # noqa: BLE001
                run.fail(f"mlp batch {batch_size}", error)
                continue
            run.results["mlp"].append({**row, "precision": "highest"})
            run.save()
            print(f"mlp batch {batch_size}: {row['steps_per_s']:.4g} steps/s", flush=True)


def plot(run: Run) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from jaxloops.measure import gpu_report

    fig, ax = plt.subplots(figsize=(7, 4.5))
    gpu_report.plot_attention(run.results, ax)
    fig.tight_layout()
    fig.savefig(run.out / "attention_latency.png", dpi=120)
    plt.close(fig)


def record(out: pathlib.Path, stage: str, status: str, seconds: float, detail: str) -> None:
    """Records a stage's outcome in DIR/stages.json and, if it exists, DIR/results.json.

    Works without JAX: gpu_run.sh records a setup that failed to find one.
    """
    path = out / "stages.json"
    stages = json.loads(path.read_text()) if path.exists() else {}
    stages[stage] = {"status": status, "seconds": round(seconds, 1), "detail": detail[-2000:]}
    write_json(path, stages)
    results = out / "results.json"
    if results.exists():
        data = json.loads(results.read_text())
        data["stages"].update(stages)
        write_json(results, data)


def check(path: pathlib.Path) -> int:
    """Prints the run's problems (gpu_report.check_run) and its goals; 1 if any problem."""
    from jaxloops.measure import gpu_report

    results = json.loads(path.read_text())
    for name, stage in results["stages"].items():
        seconds, detail = stage.get("seconds", ""), stage.get("detail", "")
        print(f"stage {name:6} {stage['status']:8} {seconds} {detail}")
    for row in gpu_report.goals(results):
        print(f"goal: {row['goal']}: {row['measured']} (met: {row['met']})")
    problems = gpu_report.check_run(results)
    for problem in problems:
        print("PROBLEM:", problem)
    print(f"{path}: {len(problems)} problem(s)")
    return 1 if problems else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("first", "rest"):
        stage = commands.add_parser(name)
        stage.add_argument("--out", required=True, type=pathlib.Path)
        stage.add_argument("--rehearse", action="store_true", help="toy sizes, any backend")
    rec = commands.add_parser("record")
    rec.add_argument("--out", required=True, type=pathlib.Path)
    rec.add_argument("stage")
    rec.add_argument("status")
    rec.add_argument("seconds", type=float)
    rec.add_argument("--detail", default="")
    chk = commands.add_parser("check")
    chk.add_argument("results", type=pathlib.Path)
    args = parser.parse_args(argv)

    if args.command == "record":
        # No JAX here (a setup that found none is recorded too); `check` validates the names.
        args.out.mkdir(parents=True, exist_ok=True)
        record(args.out, args.stage, args.status, args.seconds, args.detail)
        return 0
    if args.command == "check":
        return check(args.results)

    import jax

    if not args.rehearse and jax.default_backend() != "gpu":
        print(f"no GPU: JAX's backend is {jax.default_backend()!r}; --rehearse checks the code")
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    run = Run(args.out, args.rehearse)
    run.save()
    start = time.perf_counter()
    {"first": stage_first, "rest": stage_rest}[args.command](run)
    run.save()
    print(f"stage {args.command}: {time.perf_counter() - start:.1f} s; wrote {run.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
