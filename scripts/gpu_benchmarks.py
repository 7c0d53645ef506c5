"""GPU benchmarks for the book's "Measured on a GPU" appendix; writes results.json + plots.

Usage: python scripts/gpu_benchmarks.py --out DIR [--build-times FILE] [--tiny]

--tiny runs every benchmark at toy sizes on any backend: a check of the pipeline, never a
result to publish (the file then says tiny: true and the book refuses to render it).
"""

import argparse
import json
import pathlib
import sys
import time

import jax
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import jaxloops  # noqa: E402
from jaxloops import measure  # noqa: E402
from jaxloops.measure import gpu_report, machine, random_batches, scan_throughput, sweeps  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True, type=pathlib.Path)
    parser.add_argument("--build-times", type=pathlib.Path, help="JSON of test/book seconds")
    parser.add_argument("--tiny", action="store_true", help="toy sizes: a pipeline check only")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.tiny and jax.default_backend() != "gpu":
        print(
            f"no GPU: JAX's backend is {jax.default_backend()!r}; use --tiny for a pipeline check"
        )
        return 2
    sizes = jaxloops.experiment_sizes()
    start = time.perf_counter()
    key = jax.random.key(0)

    matmul_size = 256 if args.tiny else sizes.measure.matmul_size
    matmul = {
        dtype: measure.matmul_throughput(
            key, matmul_size, dtype=dtype, repeats=sizes.measure.repeats
        )
        for dtype in ("float32", "bfloat16")
    }
    print("matmul FLOP/s:", {k: f"{v:.3g}" for k, v in matmul.items()}, flush=True)

    config = {
        "batch": 1 if args.tiny else 4,
        "heads": sizes.attention.heads,
        "head_dim": 32 if args.tiny else 128,
        "block_size": sizes.attention.block_size,
    }
    lengths = (64, 128) if args.tiny else (1024, 2048, 4096, 8192, 16384)
    # Naive and XLA materialise (B, N, T, S) scores: at L = 16384 that is 34 GB in f32.
    materialise = max(lengths) if args.tiny else sizes.attention.materialise_max_length
    requests = [
        ("naive", "bfloat16"),
        ("xla", "bfloat16"),
        ("cudnn", "bfloat16"),
        ("cudnn", "float16"),
        ("blockwise", "bfloat16"),
        ("xla", "float32"),
    ]
    attention = sweeps.attention_sweep(
        jax.random.key(0),
        lengths,
        requests,
        batch=config["batch"],
        heads=config["heads"],
        head_dim=config["head_dim"],
        block_size=config["block_size"],
        repeats=sizes.attention.repeats,
        materialise_max_length=materialise,
    )
    print(
        sweeps.markdown_table(
            attention,
            {
                "implementation": "impl",
                "dtype": "dtype",
                "T": "T = S",
                "seconds": "s",
                "error": "error",
            },
        ),
        flush=True,
    )
    causal = sweeps.causal_sweep(
        jax.random.key(0),
        lengths,
        ("cudnn", "xla"),
        dtype="bfloat16",
        batch=config["batch"],
        heads=config["heads"],
        head_dim=config["head_dim"],
        block_size=config["block_size"],
        repeats=sizes.attention.repeats,
        materialise_max_length=materialise,
    )

    params = jaxloops.init_mlp(key, (64, *sizes.loop.hidden, 10))
    optimizer = jaxloops.make_optimizer(sizes.loop.learning_rate, sizes.loop.weight_decay)
    train_step = jaxloops.make_train_step(jaxloops.mlp_loss, optimizer)
    mlp = [
        scan_throughput(
            train_step,
            params,
            optimizer.init(params),
            random_batches(key, sizes.loop.throughput_steps, batch_size, 64, 10),
            sizes.measure.repeats,
        )
        for batch_size in ((16, 32) if args.tiny else sizes.loop.throughput_batch_sizes)
    ]

    build = json.loads(args.build_times.read_text()) if args.build_times else {}
    build["benchmarks_seconds"] = time.perf_counter() - start
    facts = machine.machine_facts()
    facts["tiny"] = args.tiny
    results = {
        "facts": facts,
        "matmul": matmul,
        "attention_config": config,
        "attention": attention,
        "causal": causal,
        "mlp": mlp,
        "build": build,
    }
    gpu_report.check_results(results, allow_tiny=args.tiny)
    (args.out / "results.json").write_text(json.dumps(results, indent=1, default=float))

    fig, ax = plt.subplots(figsize=(7, 4.5))
    gpu_report.plot_attention(results, ax)
    fig.tight_layout()
    fig.savefig(args.out / "attention_latency.png", dpi=120)
    for row in gpu_report.goals(results):
        print(f"{row['goal']}: {row['measured']} (met: {row['met']})")
    print("wrote", args.out / "results.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
