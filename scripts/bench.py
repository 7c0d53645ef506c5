"""The transformer train step's speed: tokens/s and the fraction of the build's matmul
ceiling, at chapter 11's size and at a larger one (`make bench`). A benchmark, not a test.

  python scripts/bench.py [--rounds 7] [--breakdown]
"""

import argparse

import jax

from jaxloops import experiment_sizes, step_speed
from jaxloops.measure import describe_backend

LARGER = (4, 256, 8, 2, 1024, 256, 16)  # L, D, N, K, F, T, B: issue 26's size


def chapter_size() -> tuple[int, ...]:
    lm = experiment_sizes().lm
    return (lm.num_layers, lm.model_dim, lm.num_heads, lm.num_kv_heads, lm.hidden_dim,
            lm.max_len, lm.batch_size)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--breakdown", action="store_true", help="also the per-group table")
    args = parser.parse_args()
    print(f"{describe_backend()}, JAX {jax.__version__}, float32")
    header = f"{'size (L, D, N, K, F, T, B)':32s} {'tokens/s':>9s} {'GFLOP/s':>8s}"
    print(header + f" {'ceiling':>8s} {'of ceiling':>10s} {'grad/fwd':>8s}")
    for sizes in (chapter_size(), LARGER):
        programs = step_speed.step_programs(sizes, jax.random.key(0))
        row = step_speed.step_rates(programs, args.rounds)
        print(f"{str(sizes):32s} {row['tokens_per_s']:9,.0f} {row['flops_per_s'] / 1e9:8.1f} "
              f"{row['ceiling'] / 1e9:8.1f} {row['of_ceiling']:10.1%} "
              f"{row['gradient_over_forward']:8.2f}")  # fmt: skip
        if args.breakdown:
            for group, g in step_speed.step_breakdown(programs).items():
                print(f"    {group:28s} {1e3 * g['seconds']:8.1f} ms traced, "
                      f"{1e3 * g['predicted']:7.1f} ms at the roofline")  # fmt: skip


if __name__ == "__main__":
    main()
