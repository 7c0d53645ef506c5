"""The transformer train step's speed: tokens/s and the fraction of the build's matmul
ceiling, at chapter 11's size and at a larger one (`make bench`). A benchmark, not a test.

  python scripts/bench.py [--rounds 7] [--breakdown] [--control]

--control also times the step with `textbook_attention` (chapter 11's control) and, with
--breakdown, gives each group's traced time in it: the before/after table of issue 26.
Each size also runs in a fresh process with each of `step_speed.ALLOCATORS` (glibc's
defaults, huge pages, memory kept: `step_speed.rates_in_fresh_process`), where the machine
can contrast them.
"""

import argparse
import os
import tempfile

import jax

from jaxloops import experiment_sizes, step_speed
from jaxloops.attention import textbook_attention
from jaxloops.measure import describe_backend
from jaxloops.measure.roofline import ROOFLINE_ENV


def chapter_size() -> tuple[int, ...]:
    lm = experiment_sizes().lm
    return (lm.num_layers, lm.model_dim, lm.num_heads, lm.num_kv_heads, lm.hidden_dim,
            lm.max_len, lm.batch_size)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--breakdown", action="store_true", help="also the per-group table")
    parser.add_argument("--control", action="store_true", help="also the textbook attention")
    args = parser.parse_args()
    # One roofline for this process and its workers, as in a build of the book.
    os.environ.setdefault(ROOFLINE_ENV, os.path.join(tempfile.mkdtemp(), "roofline.json"))
    print(f"{describe_backend()}, JAX {jax.__version__}, float32")
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
