"""GPU benchmarks for the book's "Measured on a GPU" appendix, in two stages; writes results.json.

Usage (scripts/gpu_run.sh calls these, each stage under a time limit):
  python scripts/gpu_benchmarks.py first --out DIR [--rehearse]   # report, ceilings, cuDNN, MLP, LM
  python scripts/gpu_benchmarks.py rest  --out DIR [--rehearse]   # other sweeps, the plot

A stage is a list of measurements ("tasks": "ceiling f32", "attention cudnn bfloat16 4096",
"mlp 512", ...). This process imports no JAX: it runs them in a child process, which saves
DIR/results.json after each one and names the one in flight. If the child dies (a segfault or
an abort inside cuDNN), only that measurement is lost: it is recorded as a failure with the
signal, and a fresh child goes on with the rest. `--only TASK,...` runs the named tasks alone;
JAXLOOPS_BENCH_CRASH=TASK makes the child abort at that task (the test of the above).

--rehearse runs the same code on any backend at toy sizes: a check of the pipeline, never a
result to publish (the file says rehearsal: true and the book refuses to render it). Sizes
otherwise come from jaxloops.experiment_sizes().

Precision is stated, not inherited: float32 work runs at HIGHEST (full float32); the TF32
ceiling names the dot algorithm TF32_TF32_F32 (what DEFAULT runs on Hopper; a CPU refuses it,
so elsewhere it asks for HIGH); bfloat16 and float16 run at DEFAULT.
"""

import argparse
import dataclasses
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from gpu_points import (  # noqa: E402 - the script's own folder, set just above
    ATTENTION_BATCH,
    CEILINGS,
    REST_REQUESTS,
    attention_point,
    bandwidth_point,
    causal_point,
    ceiling_point,
    lm_point,
    memory_point,
    mlp_point,
    plot,
)  # fmt: skip
from gpu_run_tools import write_json  # noqa: E402

CRASH_AT = "JAXLOOPS_BENCH_CRASH"
MAX_CHILDREN = 100


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
    lm: dict  # chapter 11's LanguageModelSizes, as a dict
    lm_steps: int  # train steps of the LM per timed call
    memory: dict  # chapter 14's MemorySizes, as a dict


def make_plan(rehearse: bool, backend: str | None = None) -> Plan:
    """The plan from experiment_sizes(backend); the rehearsal's toy plan runs the same kinds of
    point at toy sizes."""
    import jaxloops
    from jaxloops.measure import timing as measure_timing

    sizes = jaxloops.experiment_sizes(backend)
    attention = sizes.attention
    if rehearse:
        toy = dict(num_layers=1, model_dim=32, num_heads=2, num_kv_heads=1, hidden_dim=64)
        toy_lm = dataclasses.replace(sizes.lm, **toy, max_len=32, batch_size=4)
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
            min_sample_seconds=measure_timing.MIN_SAMPLE_SECONDS,
            matmul_size=128,
            read_bytes=2**22,
            mlp_hidden=(32, 32),
            mlp_batch_sizes=(16,),
            mlp_steps=5,
            lm=dataclasses.asdict(toy_lm),
            lm_steps=2,
            memory=dataclasses.asdict(
                dataclasses.replace(sizes.memory, layers=1, batch_size=2, seq_len=32)
            ),
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
        min_sample_seconds=measure_timing.MIN_SAMPLE_SECONDS,
        matmul_size=sizes.measure.matmul_size,
        read_bytes=4 * 2**30,
        mlp_hidden=sizes.loop.hidden,
        mlp_batch_sizes=sizes.loop.throughput_batch_sizes,
        mlp_steps=sizes.loop.throughput_steps,
        lm=dataclasses.asdict(sizes.lm),
        lm_steps=10,
        memory=dataclasses.asdict(sizes.memory),
    )


def tasks(plan: Plan, stage: str) -> list[str]:
    """The stage's measurements, most valuable first; each name says what it measures."""
    from jaxloops.measure.sweeps import MATERIALISING

    if stage == "headline":
        names = ["implementations", *(f"ceiling {c[0]}" for c in CEILINGS), "bandwidth"]
        for length in plan.lengths:
            names.append(f"attention cudnn bfloat16 {length}")
            if length == plan.goal_length:  # the goals compare cuDNN with naive and XLA here
                names += [f"attention {n} bfloat16 {length}" for n in MATERIALISING]
        return names + [f"mlp {b}" for b in plan.mlp_batch_sizes] + ["lm", "memory"]
    if stage == "sweeps":
        names = [
            f"attention {name} {dtype} {length}"
            for length in plan.lengths
            for name, dtype in REST_REQUESTS
            if not (dtype == "bfloat16" and name in MATERIALISING and length == plan.goal_length)
        ]
        names += [
            f"causal {n} {length}" for length in plan.causal_lengths for n in ("cudnn", "xla")
        ]
        return names + ["plot"]
    raise ValueError(f"stage is {stage!r}; expected 'headline' or 'sweeps'")


# --- the results file -------------------------------------------------------------------


def first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines() or [""]
    return f"{type(error).__name__}: {lines[0][:300]}"


class Run:
    """The results file of one run directory, rewritten after every task."""

    def __init__(self, out: pathlib.Path, rehearse: bool):
        self.out = out
        self.path = out / "results.json"
        if self.path.exists():
            self.results = json.loads(self.path.read_text())
            if bool(self.results["facts"].get("rehearsal")) != rehearse:
                raise SystemExit(f"{self.path} is from a run with rehearsal != {rehearse}")
        else:
            self.results = new_results(rehearse)
        self.plan = Plan(**{k: tuple(v) if isinstance(v, list) else v
                            for k, v in self.results["plan"].items()})  # fmt: skip

    def save(self) -> None:
        stages = self.out / "stages.json"
        if stages.exists():  # what gpu_run.sh recorded about the stages so far
            self.results["stages"].update(json.loads(stages.read_text()))
        write_json(self.path, self.results)

    def fail(self, where: str, error: BaseException | str) -> str:
        message = error if isinstance(error, str) else first_line(error)
        self.results["failures"].append({"where": where, "error": message})
        print(f"FAILED {where}: {message}", flush=True)
        return message


def new_results(rehearse: bool) -> dict:
    import jax

    from jaxloops.measure import gpu_report, machine

    facts = machine.machine_facts()
    facts["rehearsal"] = rehearse
    facts["jax_default_matmul_precision"] = str(jax.config.jax_default_matmul_precision)
    return {
        "facts": facts,
        "plan": dataclasses.asdict(make_plan(rehearse)),
        "stages": {name: {"status": "pending"} for name in gpu_report.STAGES},
        "implementations": [],
        "ceilings": [],
        "bandwidth": {},
        "attention": [],
        "causal": [],
        "mlp": [],
        "lm": {},
        "memory_steps": [],  # chapter 14's step in float32 and bfloat16 compute
        "failures": [],
        "tasks": {},  # task -> "done" or "crashed: ..."
        "in_flight": None,  # the task a child is measuring now
    }


# --- running the tasks -------------------------------------------------------------------


def measure_task(run: Run, task: str) -> str:
    """Measures one task into the results; returns what to print."""
    from jaxloops import measure
    from jaxloops.measure import kernels

    kind, *args = task.split()
    results = run.results
    if kind == "implementations":
        results["implementations"] = measure.implementation_report(
            kernels.default_cases(run.plan.head_dim), length=256,
            heads=run.plan.heads, block_size=run.plan.block_size,
        )  # fmt: skip
        return ", ".join(f"{r['implementation']} {r['dtype']} H={r['head_dim']}: "
                         f"{'works' if r['works'] else 'refused'}"
                         for r in results["implementations"])  # fmt: skip
    if kind == "ceiling":
        results["ceilings"].append(row := ceiling_point(run, args[0]))
        return f"{row['flops_per_s']:.4g} FLOP/s"
    if kind == "bandwidth":
        results["bandwidth"] = bandwidth_point(run)
        return f"{results['bandwidth']['bytes_per_s']:.4g} B/s"
    if kind == "attention":
        results["attention"].append(row := attention_point(run, args[0], args[1], int(args[2])))
        return f"{1e3 * row['seconds']:.4g} ms" if row["seconds"] else row["error"]
    if kind == "causal":
        results["causal"].append(row := causal_point(run, args[0], int(args[1])))
        return f"speedup {row['speedup']} {row['error']}"
    if kind == "mlp":
        results["mlp"].append(row := mlp_point(run, int(args[0])))
        return f"{row['steps_per_s']:.4g} steps/s"
    if kind == "lm":
        results["lm"] = row = lm_point(run)
        return f"{row['steps_per_s']:.4g} steps/s, MFU {row['mfu_of_measured_f32']}"
    if kind == "memory":
        results["memory_steps"] = rows = memory_point(run)
        return ", ".join(f"{r['compute']} {r['ms per step']:.4g} ms" for r in rows)
    if kind == "plot":
        plot(run)
        return str(run.out / "attention_latency.png")
    raise ValueError(f"unknown task {task!r}")


def worker(out: pathlib.Path, stage: str, rehearse: bool, only: list[str]) -> int:
    """Runs the stage's tasks not yet done, saving after each and naming the one in flight."""
    import jax

    if not rehearse and jax.default_backend() != "gpu":
        print(f"no GPU: JAX's backend is {jax.default_backend()!r}; --rehearse checks the code")
        return 2
    run = Run(out, rehearse)
    for task in tasks(run.plan, stage):
        if task in run.results["tasks"] or (only and task not in only):
            continue
        run.results["in_flight"] = task
        run.save()
        if os.environ.get(CRASH_AT) == task:
            os.abort()  # the test of the parent's recovery: a hard crash, as cuDNN's would be
        start = time.perf_counter()
        try:
            shown = measure_task(run, task)
            run.results["tasks"][task] = "done"
        except Exception as error:  # noqa: BLE001 - kept with its message; the next task runs
            shown = run.fail(task, error)
            run.results["tasks"][task] = f"failed: {shown}"
        run.results["in_flight"] = None
        run.save()
        print(f"{task}: {shown} ({time.perf_counter() - start:.1f} s)", flush=True)
    return 0


def died(returncode: int) -> str:
    if returncode < 0:
        return f"the child process died of {signal.Signals(-returncode).name}"
    return f"the child process exited with status {returncode}"


def run_stage(out: pathlib.Path, stage: str, child_args: list[str]) -> int:
    """Runs the stage's worker until it finishes, each crash losing only its task in flight."""
    path = out / "results.json"
    for _ in range(MAX_CHILDREN):  # a stage has fewer tasks: every crash ends one
        returncode = subprocess.call([sys.executable, __file__, "worker", *child_args])
        if returncode == 0:
            return 0
        results = json.loads(path.read_text()) if path.exists() else {}
        task = results.get("in_flight")
        if task is None:  # died outside a measurement: importing, no GPU, ...
            return returncode
        results["tasks"][task] = f"crashed: {died(returncode)}"
        results["failures"].append({"where": task, "error": died(returncode)})
        results["in_flight"] = None
        write_json(path, results)
        print(f"CRASHED {task}: {died(returncode)}; going on with the rest", flush=True)
    return 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("mode", choices=("headline", "sweeps", "worker"))
    parser.add_argument("stage", nargs="?", help="worker only: the stage it runs")
    parser.add_argument("--out", required=True, type=pathlib.Path)
    parser.add_argument("--rehearse", action="store_true", help="toy sizes, any backend")
    parser.add_argument("--only", default="", help="comma-separated tasks (default: all)")
    args = parser.parse_args(argv)
    only = [t.strip() for t in args.only.split(",") if t.strip()]
    if args.mode == "worker":
        return worker(args.out, args.stage, args.rehearse, only)
    args.out.mkdir(parents=True, exist_ok=True)
    child = [args.mode, "--out", str(args.out), "--only", args.only]
    start = time.perf_counter()
    returncode = run_stage(args.out, args.mode, child + (["--rehearse"] if args.rehearse else []))
    print(f"stage {args.mode}: {time.perf_counter() - start:.1f} s, exit {returncode}")
    return returncode


if __name__ == "__main__":
    sys.exit(main())
