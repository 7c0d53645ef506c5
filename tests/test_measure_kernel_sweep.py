import json

import jax
import jax.numpy as jnp
import numpy as np

from jaxloops.measure import kernel_sweep as ks

IMPLEMENTATIONS = {
    "blockwise", "xla", "pallas, B T N H", "pallas", "flash_attention", "splash",
    "ceiling: depth H", "ceiling: square",
}  # fmt: skip


def test_the_plan_runs_the_goals_configurations_first():
    p = ks.plan()
    assert p.configs[:4] == (
        ks.Config(128, 8192, False, "forward"),
        ks.Config(64, 8192, False, "forward"),
        ks.Config(128, 8192, True, "forward"),
        ks.Config(64, 8192, True, "forward"),
    )
    assert p.configs[4] == ks.Config(128, 8192, False, "forward+backward")
    assert len(set(p.configs)) == len(p.configs) == 2 * 5 * 2 * 2
    assert (p.batch, p.heads, p.dtype) == (4, 8, "bfloat16")
    # Every (Tb, Sb) for the forward pass at T = 8192, equal blocks elsewhere.
    assert len(ks.block_pairs(p.configs[0], p)) == 16
    assert ks.block_pairs(p.configs[4], p) == [(b, b) for b in (128, 256, 512, 1024)]


def test_flops_are_the_issues_count():
    forward = ks.attention_flops(4, 8, 8192, 128, "forward")
    assert forward == 4 * 4 * 8 * 8192**2 * 128
    assert ks.attention_flops(4, 8, 8192, 128, "forward+backward") == 3.5 * forward


def test_the_depth_ceiling_sums_every_product():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((512, 64), np.float32)
    b = rng.standard_normal((256, 64), np.float32)
    out = np.asarray(jax.jit(ks.depth_matmul, static_argnames=("tile", "interpret"))(
        jnp.asarray(a), jnp.asarray(b), tile=128, interpret=True))  # fmt: skip
    tiles = [a[i : i + 128] @ b[j : j + 128].T for i in range(0, 512, 128) for j in (0, 128)]
    expected = np.sum(tiles, axis=0, dtype=np.float64)
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-3)
    assert np.abs(out - 2 * expected).max() > 1  # a sum counted twice is not


def test_the_quick_sweep_writes_its_rows_and_resumes(tmp_path):
    path = tmp_path / "kernels.json"
    rows = ks.sweep(path, budget=300, quick=True, max_configs=2)
    record = json.loads(path.read_text())
    assert record["rows"] == rows and record["sources"] == ks.source_hashes()
    assert record["facts"]["backend"] == jax.default_backend()
    p = ks.plan(quick=True)
    assert {row["config"] for row in rows} == {c.name for c in p.configs[:2]}
    for row in rows:
        assert row["implementation"] in IMPLEMENTATIONS
        assert (row["B"], row["N"], row["H"], row["T"], row["dtype"]) == (1, 2, 64, 256, "bfloat16")
        if row["error"]:
            assert row["seconds"] is None and row["tflops"] is None
            continue
        assert len(row["samples"]) == p.rounds and row["seconds"] == np.median(row["samples"])
        rate_seconds = min(row["samples"]) if "ceiling" in row["implementation"] else row["seconds"]
        assert np.isclose(row["tflops"], row["flops"] / rate_seconds / 1e12)
    ours = [r for r in rows if r["implementation"] == "pallas" and r["config"] == p.configs[0].name]
    assert {(r["block_q"], r["block_k"]) for r in ours} == {(128, 128), (128, 256), (256, 128),
                                                           (256, 256)}  # fmt: skip
    assert all(not r["error"] and r["flops"] == 4 * 2 * 256**2 * 64 for r in ours)
    if jax.default_backend() == "cpu":  # the libraries' TPU kernels do not compile here
        library = [r for r in rows if r["implementation"] in ("flash_attention", "splash")]
        assert library and all("interpret" in r["error"] for r in library)
    # Resumed: nothing left to run in no time; rows of another kernel source are dropped.
    assert ks.sweep(path, budget=0, quick=True, max_configs=2) == rows
    assert ks.load_rows(path, "another source") == []
