"""The measurements of a GPU run, one function per point: each returns its row of results.json.

`run` is scripts/gpu_benchmarks.py's Run: its plan (sizes), results so far, output folder, and
`fail` (keeps an error with its message). Every point is measured by the chapters' code and
timing rule (`jaxloops.measure`): attention by `attention_sweep` and `causal_sweep`, with
samples several calls long (a kernel of microseconds); a ceiling is the best of its samples.
"""

import functools

ATTENTION_BATCH = 4  # B of the GPU sweep: enough (B, N) pairs to fill the GPU at short T
# (name, label, dtype, precision): the ceiling table.
CEILINGS = (
    ("f32", "float32, precision HIGHEST (full float32)", "float32", "highest"),
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


def precision_of(dtype: str) -> str:
    return "highest" if dtype == "float32" else "default"


def _sweep_shape(plan) -> dict:
    """`measure.attention_sweep`'s sizes and timing, from the plan."""
    return dict(
        batch=plan.batch, heads=plan.heads, head_dim=plan.head_dim, block_size=plan.block_size,
        repeats=plan.samples, materialise_max_length=plan.materialise_max_length,
        min_sample_seconds=plan.min_sample_seconds,
    )  # fmt: skip


def attention_point(run, name: str, dtype: str, length: int, is_causal=False) -> dict:
    """One (implementation, dtype, T = S) point, as chapter 8 measures one (`attention_sweep`:
    a checked run, the compiled costs, the timed calls)."""
    import jax

    from jaxloops import measure

    try:
        with jax.default_matmul_precision(precision_of(dtype)):
            (row,) = measure.attention_sweep(
                jax.random.key(length), [length], [(name, dtype, is_causal)],
                **_sweep_shape(run.plan),
            )  # fmt: skip
    except Exception as error:  # noqa: BLE001 - compile or run: out of memory, XLA, ...
        causal = " causal" if is_causal else ""
        error = run.fail(f"attention {name} {dtype} T={length}{causal}", error)
        row = {"implementation": name, "dtype": dtype, "T": int(length), "seconds": None,
               "is_causal": bool(is_causal), "error": error}  # fmt: skip
    if row.get("samples"):
        row["shortest_sample_seconds"] = min(row["samples"]) * row["calls_per_sample"]
    return {**row, "precision": precision_of(dtype)}


def causal_point(run, name: str, length: int) -> dict:
    """Full against causal bfloat16 attention at T = S, as chapter 9 measures it
    (`causal_sweep`: the two calls in turn; the speedup is the median of their ratios)."""
    import jax

    from jaxloops import measure

    try:
        with jax.default_matmul_precision("default"):
            (row,) = measure.causal_sweep(
                jax.random.key(length), [length], [name], dtype="bfloat16",
                **_sweep_shape(run.plan),
            )  # fmt: skip
    except Exception as error:  # noqa: BLE001
        error = run.fail(f"causal {name} T={length}", error)
        row = {"implementation": name, "dtype": "bfloat16", "T": length, "full_seconds": None,
               "causal_seconds": None, "speedup": None, "error": error}  # fmt: skip
    return row


def best_of_samples(fn, args, plan) -> dict:
    """A ceiling by the book's rule: the best of `plan.samples` samples of `fn(*args)`, each
    several calls long (`measure.timing.calls_per_sample`), per call."""
    from jaxloops.measure import interleaved_samples, timing

    call = functools.partial(fn, *args)
    calls = timing.calls_per_sample(call, plan.min_sample_seconds)
    samples = interleaved_samples({"ceiling": timing.queued(call, calls)}, plan.samples)
    shortest = min(samples["ceiling"])
    return {"seconds": shortest / calls, "calls_per_sample": calls,
            "shortest_sample_seconds": shortest, "statistic": "best of samples"}  # fmt: skip


def ceiling_point(run, name: str) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    _, label, dtype, precision = next(c for c in CEILINGS if c[0] == name)
    n = run.plan.matmul_size
    if precision == "TF32_TF32_F32" and jax.default_backend() != "gpu":
        precision = "high"
    row = {"name": name, "label": label, "dtype": dtype, "precision": precision, "size": n}
    row.update(flops_per_s=None, seconds=None, error="")
    rng = np.random.default_rng(0)
    a, b = (jnp.asarray(rng.standard_normal((n, n), np.float32), dtype) for _ in range(2))
    matmul = jax.jit(functools.partial(jnp.matmul, precision=precision))
    row.update(best_of_samples(matmul, (a, b), run.plan))
    row["flops_per_s"] = 2.0 * n**3 / row["seconds"]
    return row


def bandwidth_point(run) -> dict:
    import jax
    import jax.numpy as jnp

    big = jnp.ones((run.plan.read_bytes // 4,), jnp.float32)
    read = jax.jit(lambda x: jnp.sum(x, dtype=jnp.float32))
    row = {"nbytes": run.plan.read_bytes, "error": ""}
    row.update(best_of_samples(read, (big,), run.plan))
    row["bytes_per_s"] = big.nbytes / row["seconds"]
    return row


def mlp_point(run, batch_size: int) -> dict:
    """Chapter 6's device loop (the digits MLP, a scanned epoch) at one batch size."""
    import jax

    import jaxloops
    from jaxloops import measure

    plan, key = run.plan, jax.random.key(0)
    with jax.default_matmul_precision("highest"):  # float32 means float32, not TF32
        params = jaxloops.init_mlp(
            key, (jaxloops.data.NUM_FEATURES, *plan.mlp_hidden, jaxloops.data.NUM_CLASSES)
        )
        optimizer = jaxloops.make_optimizer(3e-3, 1e-2)
        train_step = jaxloops.make_train_step(jaxloops.mlp_loss, optimizer)
        batches = measure.random_batches(
            key, plan.mlp_steps, batch_size, jaxloops.data.NUM_FEATURES, jaxloops.data.NUM_CLASSES
        )
        row = measure.scan_throughput(
            train_step, params, optimizer.init(params), batches, plan.samples
        )
    return {**row, "precision": "highest"}


def _transformer_step_rate(run, config, batch: int, loss_fn=None):
    """`scan_throughput` of the train step of `loss_fn` (default chapter 11's loss) for
    `config`, `run.plan.lm_steps` steps of (batch, config.max_len) random tokens a call, in
    float32 at HIGHEST (not TF32). Returns (its row, the parameters it started from)."""
    import jax

    import jaxloops
    from jaxloops import measure

    key, lm = jax.random.key(0), run.plan.lm
    shape = (run.plan.lm_steps, batch, config.max_len)  # (steps, B, T)
    tokens = jax.random.randint(key, shape, 0, config.vocab_size)
    with jax.default_matmul_precision("highest"):  # float32 means float32, not TF32
        params = jaxloops.init_transformer(key, config)
        optimizer = jaxloops.make_optimizer(lm["learning_rate"], lm["weight_decay"])
        step = jaxloops.make_train_step(loss_fn or jaxloops.transformer_loss, optimizer)
        row = measure.scan_throughput(step, params, optimizer.init(params),
                                      jaxloops.Batch(tokens, tokens), run.plan.samples)  # fmt: skip
    return row, params


def memory_point(run) -> list[dict]:
    """Chapter 14's train step (chapter 11's widths, chapter 14's depth, batch and length) in
    float32 and with bfloat16 compute (float32 master parameters and Adam state), timed in
    one process: the GPU appendix's bfloat16 row."""
    import dataclasses

    import jax.numpy as jnp

    import jaxloops
    from jaxloops import precision

    lm, part = jaxloops.backend.LanguageModelSizes(**run.plan.lm), run.plan.memory
    config = dataclasses.replace(
        jaxloops.TransformerConfig.from_sizes(lm, jaxloops.text.VOCAB_SIZE),
        num_layers=part["layers"], max_len=part["seq_len"],
    )  # fmt: skip
    loss = jaxloops.transformer_loss
    rows = []
    for name, loss_fn in (
        ("float32", loss),
        ("bfloat16 compute", precision.compute_in(loss, jnp.bfloat16)),
    ):
        row, _ = _transformer_step_rate(run, config, part["batch_size"], loss_fn)
        rows.append({"compute": name, "L": config.num_layers, "B": part["batch_size"],
                     "T": config.max_len, "ms per step": 1e3 / row["steps_per_s"]})  # fmt: skip
    return rows


def lm_model_flops(params, batch: int, length: int, layers: int, width: int) -> float:
    """FLOPs of one train step by the usual count: 6 per parameter per token (forward and
    backward of every weight but the embedding tables) plus the attention scores, 12 L T D per
    token (the (T, T) products forward and backward, no causal saving counted)."""
    import jax

    weights = sum(x.size for name, tree in params.items() if name != "embed"
                  for x in jax.tree.leaves(tree))  # fmt: skip
    tokens = batch * length
    return 6.0 * weights * tokens + 12.0 * layers * length * width * tokens


def lm_point(run) -> dict:
    """Chapter 11's train step at the backend's sizes: steps/s and model FLOP utilisation,
    against the f32 ceiling this run measured and the board's published f32 peak."""
    import jaxloops
    from jaxloops.measure import published

    lm = run.plan.lm
    lm_sizes = jaxloops.backend.LanguageModelSizes(**lm)
    config = jaxloops.TransformerConfig.from_sizes(lm_sizes, jaxloops.text.VOCAB_SIZE)
    row, params = _transformer_step_rate(run, config, lm["batch_size"])
    model_flops = lm_model_flops(
        params, lm["batch_size"], lm["max_len"], lm["num_layers"], lm["model_dim"]
    )
    rate = model_flops * row["steps_per_s"]
    ceiling = next((c["flops_per_s"] for c in run.results["ceilings"] if c["name"] == "f32"), None)
    peaks = published.published_peaks(run.results["facts"]["device_kind"])
    return {**row, "precision": "highest", "sizes": lm,
            "model_flops_per_step": model_flops, "model_flops_per_s": rate,
            "mfu_of_measured_f32": rate / ceiling if ceiling else None,
            "mfu_of_published_f32": rate / peaks.f32_flops_per_s if peaks else None}  # fmt: skip


def plot(run) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from jaxloops.measure import gpu_report

    fig, ax = plt.subplots(figsize=(7, 4.5))
    gpu_report.plot_attention(run.results, ax)
    fig.tight_layout()
    fig.savefig(run.out / "attention_latency.png", dpi=120)
    plt.close(fig)
