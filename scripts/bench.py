"""`make bench`: the goals the book's issues set (`jaxloops.pages.goals`), measured on this
machine, recorded in results/bench/<machine>.json, and an exit status of 1 when a goal that
applies here is missed. Goals are not tests and not the pages' claims: a page states each
goal as set and says whether its build met it; this script is what checks them.

  python scripts/bench.py [--rounds 7] [--out results/bench] [--rates [--breakdown] [--control]]

The goal against PyTorch eager (issue 43) needs torch: `make bench` installs
requirements-bench.txt first; run without it, that goal is "not measured".

--rates also prints the transformer train step's tokens/s and fraction of the build's
matmul ceiling at chapter 11's size and at the goal's size. Each size then also runs in a
fresh process with each of `step_speed.ALLOCATORS` (glibc's defaults, huge pages, memory
kept: `step_speed.rates_in_fresh_process`), where the machine can contrast them. --control
also times the step with `textbook_attention` (chapter 11's control) and, with
--breakdown, gives each group's traced time in it: the before/after table of issue 26.
"""

import argparse
import importlib.util
import os
import pathlib
import platform
import sys
import tempfile

import jax

from jaxloops import experiment_sizes, measure
from jaxloops.attention import textbook_attention
from jaxloops.measure import describe_backend, step_speed, torch_twin
from jaxloops.measure.roofline import ROOFLINE_ENV
from jaxloops.measure.throughput import validation_hook_speed
from jaxloops.pages import goals


def chapter_size() -> tuple[int, ...]:
    lm = experiment_sizes().lm
    return (lm.num_layers, lm.model_dim, lm.num_heads, lm.num_kv_heads, lm.hidden_dim,
            lm.max_len, lm.batch_size)  # fmt: skip


def cpu_model() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else what `platform` says."""
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def measure_goals(rounds: int) -> dict[str, float]:
    """Every goal's figure, measured as its chapter measures it."""
    sizes = experiment_sizes()
    measured = {"validation_hook": validation_hook_speed(sizes.loop)}
    print(f"chapter 7, fit with a validation hook / without: {measured['validation_hook']:.1%}")
    lengths = [T for T in sizes.attention.causal_lengths if T >= 1024]
    rows = measure.causal_sweep(
        jax.random.key(0), lengths, ("blockwise",), dtype="float32", batch=1,
        heads=sizes.attention.heads, head_dim=sizes.attention.head_dim, block_size=None,
        parallel_blocks=None, repeats=sizes.attention.repeats,
        materialise_max_length=sizes.attention.materialise_max_length,
    )  # fmt: skip
    speedups = {r["T"]: r["speedup"] for r in rows if r["speedup"] is not None}
    measured["causal_over_full"] = min(speedups.values())
    print("chapter 9, causal blockwise over full with defaults: "
          + ", ".join(f"{x:.2f} at T = {T}" for T, x in speedups.items()))  # fmt: skip
    why_not = step_speed.huge_pages_contrast() if jax.default_backend() == "cpu" else "not a CPU"
    if why_not is None:
        step = step_speed.rates_in_fresh_process(sizes.lm.goal, rounds, "memory kept")
        where = "a fresh process with memory kept"
    else:
        programs = step_speed.step_programs(sizes.lm.goal, jax.random.key(0))
        step = step_speed.step_rates(programs, rounds)
        where = f"this process ({why_not})"
    measured["step_of_ceiling"] = step["of_ceiling"]
    measured["gradient_over_forward"] = step["gradient_over_forward"]
    print(f"chapter 11, the step at {sizes.lm.goal} in {where}: {step['of_ceiling']:.1%} of "
          f"the {step['ceiling'] / 1e9:.1f} GFLOP/s ceiling, gradient / forward "
          f"{step['gradient_over_forward']:.2f}")  # fmt: skip
    measured.update(step_over_pytorch(sizes.lm.goal, rounds))
    return measured


def step_over_pytorch(sizes: tuple[int, ...], rounds: int) -> dict[str, float]:
    """Issue 43's goal: the step at `sizes` against its PyTorch eager twin, in a plain
    process (`torch_twin.rates_in_fresh_process`); {} where it cannot be measured here."""
    if jax.default_backend() != "cpu":
        why_not = f"JAX runs on a {jax.default_backend()} here; the goal is set for its CPU"
    elif importlib.util.find_spec("torch") is None:
        why_not = "torch is not installed (requirements-bench.txt; `make bench` installs it)"
    else:
        why_not = None
    if why_not is not None:
        print(f"chapter 11, the step against PyTorch eager: not measured ({why_not})")
        return {}
    r = torch_twin.rates_in_fresh_process(sizes, rounds)
    needed = f"; a claim needs {r['wins_needed']}" if r["wins_needed"] else ""
    print(f"chapter 11, the step at {sizes} in a plain process: JAX {r['jax_tokens_per_s']:,.0f} "
          f"tokens/s, PyTorch {r['torch_version']} eager ({r['torch_threads']} threads) "
          f"{r['torch_tokens_per_s']:,.0f} tokens/s (medians); JAX / PyTorch "
          f"{r['ratio']:.2f} (median of {r['rounds']} paired rounds; JAX faster in "
          f"{r['jax_wins']}{needed})")  # fmt: skip
    print(f"  not a goal, the gap's attention share: the same JAX step with blockwise_attention "
          f"{r['blockwise_tokens_per_s']:,.0f} tokens/s, over PyTorch {r['blockwise_ratio']:.2f} "
          "(same rounds)")  # fmt: skip
    print(f"  not a goal, the gap's per-call share: the same JAX step {r['loop_steps']} to a call "
          f"(chapter 6's device loop) {r['loop_tokens_per_s']:,.0f} tokens/s, over PyTorch "
          f"{r['loop_ratio']:.2f} (same rounds)")  # fmt: skip
    if step_speed.huge_pages_contrast() is None:  # glibc's tunables work here
        kept = torch_twin.rates_in_fresh_process(sizes, rounds, allocator="memory kept")
        print(f"  not a goal, the gap's allocator share: both in one process with memory kept, "
              f"JAX {kept['jax_tokens_per_s']:,.0f} and PyTorch {kept['torch_tokens_per_s']:,.0f} "
              f"tokens/s, JAX / PyTorch {kept['ratio']:.2f} (blockwise "
              f"{kept['blockwise_ratio']:.2f}, looped {kept['loop_ratio']:.2f})")  # fmt: skip
    return {"step_over_pytorch": r["ratio"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", default=str(goals.BENCH_DIR), help="where to record")
    parser.add_argument("--rates", action="store_true", help="also the step's rates table")
    parser.add_argument("--breakdown", action="store_true", help="with --rates: per group")
    parser.add_argument("--control", action="store_true", help="with --rates: textbook attention")
    args = parser.parse_args()
    # One roofline for this process and its workers, as in a build of the book.
    os.environ.setdefault(ROOFLINE_ENV, os.path.join(tempfile.mkdtemp(), "roofline.json"))
    print(f"{describe_backend()}, JAX {jax.__version__}, float32")
    backend = jax.default_backend()
    cores_before = measure.free_cores()
    measured = measure_goals(args.rounds)
    cores = min(cores_before, measure.free_cores())
    facts = {**measure.machine_facts(), "cpu_model": cpu_model(),
             "cpu_count": str(os.cpu_count()), "cores_free": f"{cores:.2f}"}  # fmt: skip
    record = goals.bench_record(measured, backend, facts)
    key = goals.machine_key(backend, facts["device_kind"], facts["cpu_model"], os.cpu_count())
    path = goals.write_record(record, key, args.out)
    for g in goals.GOALS:
        print(f"  {g.key:24s} goal {g.stated:8s} {record['goals'][g.key]['verdict']}")
    print(f"recorded in {path} ({cores:.2f} of {os.cpu_count()} cores free)")
    if args.rates:
        print_rates(args)
    missed = goals.missed(record)
    if missed:
        print(f"missed on a machine they apply to: {', '.join(missed)}", file=sys.stderr)
        sys.exit(1)


def print_rates(args) -> None:
    """The step's rates at chapter 11's size and the goal's size (the former `make bench`)."""
    header = f"{'size (L, D, N, K, F, T, B)':32s} {'tokens/s':>9s} {'GFLOP/s':>8s}"
    print(header + f" {'ceiling':>8s} {'of ceiling':>10s} {'grad/fwd':>8s}")
    for sizes in (chapter_size(), experiment_sizes().lm.goal):
        programs = step_speed.step_programs(sizes, jax.random.key(0))
        row = step_speed.step_rates(programs, args.rounds)
        print(f"{str(sizes):32s} {row['tokens_per_s']:9,.0f} {row['flops_per_s'] / 1e9:8.1f} "
              f"{row['ceiling'] / 1e9:8.1f} {row['of_ceiling']:10.1%} "
              f"{row['gradient_over_forward']:8.2f}")  # fmt: skip
        if step_speed.huge_pages_contrast() is None and jax.default_backend() == "cpu":
            for kind in step_speed.ALLOCATORS:
                r = step_speed.rates_in_fresh_process(sizes, args.rounds, kind)
                print(f"    fresh process, {kind:11s}: {r['tokens_per_s']:9,.0f} tokens/s "
                      f"{r['flops_per_s'] / 1e9:6.1f} GFLOP/s {r['of_ceiling']:6.1%} of "
                      f"{r['ceiling'] / 1e9:.1f}, grad/fwd {r['gradient_over_forward']:.2f}, "
                      f"{r['faults']:,.0f} page faults per step")  # fmt: skip
        else:
            print(f"    no page-size contrast: {step_speed.huge_pages_contrast() or 'not a CPU'}")
        control = None
        if args.control:
            control = step_speed.step_programs(sizes, jax.random.key(0), attend=textbook_attention)
            seconds = step_speed.step_seconds({"ours": programs, "control": control}, args.rounds)
            print(f"    step {1e3 * seconds['ours']:.1f} ms, with textbook_attention "
                  f"{1e3 * seconds['control']:.1f} ms: "
                  f"{seconds['control'] / seconds['ours']:.2f}x")  # fmt: skip
        if args.breakdown:
            before = step_speed.step_breakdown(control) if control else {}
            for group, g in step_speed.step_breakdown(programs).items():
                line = f"    {group:28s} {1e3 * g['seconds']:8.1f} ms traced, "
                line += f"{1e3 * g['predicted']:7.1f} ms at the roofline"
                if group in before:
                    line += f", {1e3 * before[group]['seconds']:8.1f} ms in the control"
                print(line)


if __name__ == "__main__":
    main()
