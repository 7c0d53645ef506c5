import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxloops
from conftest import normal
from jaxloops import model_flops, text
from jaxloops import pallas_attention as pa
from jaxloops.pages import ch17_pallas as page
from jaxloops.pages import goals


def test_vmem_rows_are_the_kernels_prediction_and_h64_pads_to_h128():
    rows = page.vmem_rows((128, 1024), (64, 128), jnp.bfloat16, vmem_mib=128.0)
    by = {(r["block"], r["H"]): r for r in rows}
    assert by[128, 64]["total"] == by[128, 128]["total"] == 0.71875  # 736 KiB
    assert by[1024, 128]["temporaries"] == 10.0  # two (1024, 1024) float32 tiles, one bfloat16
    assert by[1024, 128]["share"] == f"{14.5 / 128:.1%}"
    assert "| 1024 | 128 | 3 | 1.5 | 10 | 14.5 |" in page.vmem_table(rows)


def test_count_rows_predict_two_n_over_n_plus_one():
    rows = page.count_rows((1024, 4096), 512)
    assert [(r["n"], r["computed"], r["masked"], r["full"]) for r in rows] == [
        (2, 3, 2, 4), (8, 36, 8, 64)]  # fmt: skip
    assert rows[1]["predicted"] == rows[1]["ideal"] == 16 / 9


def test_agreement_rows_accept_rounding_and_reject_a_wrong_answer():
    query, key, value = (normal((1, 128, 2, 64), s) for s in (1, 2, 3))
    d_out = normal((1, 128, 2, 64), 4)
    naive = functools.partial(jaxloops.attention, is_causal=True)
    out = np.asarray(naive(query, key, value))
    loss = lambda q, k, v: (naive(q, k, v) * d_out).sum()
    grads = [np.asarray(g) for g in jax.grad(loss, (0, 1, 2))(query, key, value)]
    rows = page.agreement_rows([out, *grads], [out, *grads], query, key, value, d_out,
                               is_causal=True, interpret=True)  # fmt: skip
    assert all(r["error"] == 0 and r["ratio"] == 0 and r["bound"] > 0 for r in rows)
    shifted = np.roll(out, 1, axis=1)  # outputs one position late
    rows = page.agreement_rows([shifted, *grads], [out, *grads], query, key, value, d_out,
                               is_causal=True, interpret=True)  # fmt: skip
    assert rows[0]["ratio"] > 1
    with pytest.raises(ValueError, match="out: shapes differ"):
        page.agreement_rows([out[:, 1:], *grads], [out, *grads], query, key, value, d_out,
                            is_causal=True, interpret=True)  # fmt: skip


def test_the_kernel_reads_k_heads_not_n():
    query, key, value = (
        normal((1, 128, 4, 64), 1),
        normal((1, 128, 2, 64), 2),
        normal((1, 128, 2, 64), 3),
    )
    kernel = functools.partial(pa.pallas_attention, interpret=True)
    shapes = page.kernel_operand_shapes(kernel, query, key, value)
    assert shapes == [[(1, 4, 128, 64), (1, 2, 128, 64), (1, 2, 128, 64)]]


SOURCES = {"pallas_attention.py": "a", "pallas_kernels.py": "b"}


def row(implementation, H, T, is_causal, mode, tflops, blocks=(512, 512), error=""):
    flops = 4.0 * 4 * 8 * T * T * H * (3.5 if mode != "forward" else 1)
    seconds = None if error else flops / tflops / 1e12
    causal = "causal" if is_causal else "full"
    return {"config": f"H {H}, T {T}, {causal}, {mode}", "implementation": implementation,
            "layout": "" if "ceiling" in implementation else "BNTH", "block_q": blocks[0],
            "block_k": blocks[1], "H": H, "T": T, "is_causal": is_causal, "mode": mode,
            "error": error, "seconds": seconds, "tflops": None if error else tflops}  # fmt: skip


def fake_record():
    """Forward and forward+backward at H 128 and 64, T 2048 and 8192: the kernel at 140
    TFLOP/s full (two block sizes), causal at 1.8 times the speed; libraries slower. The
    matmul H deep at 120 and the square one at 240: attention's ceiling, forward (half of its
    products H deep), 1 / (0.5 / 120 + 0.5 / 240) = 160; forward + backward (3 of 7 H deep),
    1 / (3/7 / 120 + 4/7 / 240) = 168."""
    rows = []
    for mode in ("forward", "forward+backward"):
        for H in (128, 64):
            for T in (2048, 8192):
                for causal in (False, True):
                    gain = 1.8 if causal else 1.0  # causal's time is full's / 1.8
                    rows += [
                        row("ceiling: depth H", H, T, causal, mode, 120.0),
                        row("ceiling: depth H", H, T, causal, mode, 100.0, (256, 256)),
                        row("ceiling: square", H, T, causal, mode, 240.0, (8192, 8192)),
                        row("pallas", H, T, causal, mode, 140.0 * gain, (1024, 512)),
                        row("pallas", H, T, causal, mode, 100.0 * gain, (256, 256)),
                        row("flash_attention", H, T, causal, mode, 120.0 * gain, (1024, 1024)),
                        row("splash", H, T, causal, mode, 0, error="RuntimeError: no"),
                    ]
    return {"facts": {"device": "TPU v5 lite (TPU)", "date": "2026-12-07", "jax": "0.10.2"},
            "sources": SOURCES, "rows": rows}  # fmt: skip


def test_goal_values_from_a_recorded_run():
    values = page.goal_values(fake_record())
    assert values["pallas_forward_h128"] == pytest.approx(140 / 160)
    assert values["pallas_forward_h64"] == pytest.approx(140 / 160)
    assert values["pallas_forward_backward_h128"] == pytest.approx(140 / 168)
    assert values["pallas_causal_speedup"] == pytest.approx(1.8)
    # Causal's fastest blocks, (1024, 512), at T = 8192: query block i computes key blocks
    # 0 .. 2i + 1, 72 of the 8 x 16; the ideal speed-up is 128 / 72, the goal's share 1.8 / it.
    assert pa.block_counts(8192, 8192, pa.Blocks(1024, 512, True, True))["computed"] == 72
    assert values["pallas_causal_of_ideal"] == pytest.approx(1.8 * 72 / 128)
    assert values["pallas_over_library"] == pytest.approx(140 / 120)
    lines = page.goal_lines(values, recorded=True)
    assert "≥ 80 %. Recorded: met (87.5%)." in lines
    assert "not measured yet" in page.goal_lines(values, recorded=False)
    unrecorded = page.goal_values(None)
    assert set(unrecorded) == set(values) and set(unrecorded.values()) == {None}
    assert {g.key for g in goals.GOALS if g.chapter == 17} == set(values)


def test_attentions_ceiling_sums_the_time_of_its_shallow_and_deep_products():
    rows = fake_record()["rows"]
    assert page.ceiling(rows, mode="forward", H=128, T=8192, is_causal=False) == pytest.approx(160)
    where = dict(mode="forward+backward", H=64, T=2048, is_causal=True)
    assert page.ceiling(rows, **where) == pytest.approx(168)
    assert page.ceiling([r for r in rows if r["implementation"] != "ceiling: square"],
                        **where) is None  # fmt: skip
    # The depth-H matmul alone is below the kernel: not a ceiling for attention.
    assert page.depth_shares(rows) == pytest.approx([140 / 120] * 8)


def test_a_rate_above_the_devices_peak_is_reported_and_the_estimate_counts_nine_products():
    record = fake_record()
    assert page.peak_tflops(record) is None  # no device kind: no peak, nothing judged
    record["facts"]["device_kind"] = "TPU v5 lite"
    assert page.peak_tflops(record) == pytest.approx(197)  # published, as Pallas tabulates it
    assert page.peak_tflops(record) == pytest.approx(page.v5e_facts()["bf16_tflops"])
    record["facts"]["device_kind"] = "TPU v5p"  # 459 TFLOP/s published: the fake's rows fit
    assert page.above_peak(record) == []  # 140 full; causal's nominal 252 is not a rate
    record["rows"].append(row("pallas", 128, 8192, False, "forward", 500.0, (128, 128)))
    assert page.above_peak(record) == ["H 128, T 8192, full, forward, pallas: 500 > 459"]
    # This kernel's products: forward 1 H deep and 1 a block deep (as FlashAttention-2's), so
    # 2 / (1/120 + 1/240) = 160; forward + backward 5 and 4 of the 7 counted, 7 / (5/120 + 4/240)
    # = 120, below the 168 that FlashAttention-2's 3 and 4 give.
    rows = fake_record()["rows"]
    at = dict(H=128, T=8192, is_causal=False)
    assert page.kernel_estimate(rows, mode="forward", **at) == pytest.approx(160)
    assert page.kernel_estimate(rows, mode="forward+backward", **at) == pytest.approx(120)
    assert page.ceiling(rows, mode="forward+backward", **at) == pytest.approx(168)
    summary = page.summary_table(record)
    assert "| 58% of the square, 31% of the peak |" in summary  # 140 / 240, 140 / 459


def test_the_tables_and_the_note_say_what_was_recorded():
    record = fake_record()
    summary = page.summary_table(record)
    assert (
        "| forward | 128 | 8192 | full | 120 | 240 | 160 | 140 (88%), 1024/512 | 120 (75%), "
        "1024/1024 |" in summary
    )
    # Causal: milliseconds and the speed-up over full (its FLOPs are counted as full's).
    causal = "| forward | 128 | 8192 | causal | 120 | 240 | 160 | 4.36 ms (×1.80), 1024/512 |"
    assert causal in summary
    assert "failed: RuntimeError: no" in summary
    sweep = page.sweep_table(record, mode="forward", H=128, T=8192, is_causal=False)
    assert (
        sweep.splitlines()[2].startswith("| 256 / 256 |") and "failed" not in sweep.splitlines()[2]
    )
    assert "Stale" not in page.record_note(record, current=SOURCES)
    stale = page.record_note(record, current={**SOURCES, "pallas_kernels.py": "c"})
    assert "**Stale:**" in stale and "pallas_kernels.py" in stale
    assert page.record_note(None).startswith("**No TPU run has been recorded yet.**")
    assert page.load_record("/nonexistent/kernels.json") is None
    assert "interpreted" in page.backend_note("cpu") and "compiled" in page.backend_note("tpu")


def test_the_findings_state_the_prediction_and_what_missed_it():
    f = page.findings(fake_record())
    assert (f["depth_above"], f["full_configs"]) == (8, 8)
    assert f["h128_ceiling"] == pytest.approx(160) and f["h128_of"] == pytest.approx(87.5)
    assert f["blocks_8192"] == "1024/512" and f["n_8192"] == 16
    assert f["ideal_8192"] == pytest.approx(128 / 72)
    assert f["library_wins"] == 0 and "library_worst" not in f
    text = page.findings_markdown(fake_record())
    assert "predict 160.0. The kernel ran at 140.0, 88 % of the prediction." in text
    assert "below the goal's 1.8" in text and "The libraries" not in text
    # A record where splash is faster, causal only: the page says so, and by how much.
    record = fake_record()
    record["rows"] = [r for r in record["rows"] if r["implementation"] != "splash"]
    record["rows"].append(row("splash", 128, 8192, True, "forward", 140.0 * 1.8 * 1.05))
    f = page.findings(record)
    assert f["library_wins"] == 1 and f["library_causal"] == 1
    assert f["library_worst"] == pytest.approx(5.0)
    assert "faster in 1 of 16 configurations, 1 of them causal" in page.findings_markdown(record)
    assert page.findings_markdown(None).startswith("*No TPU run recorded")


def test_breakdown_rows_put_two_steps_side_by_side_and_leave_out_an_empty_trace():
    row = lambda ms, mb: {"seconds": ms / 1e3, "bytes": mb * 1e6}
    traced = {
        "a": {"attention": row(4.0, 30.0), "matmul": row(2.0, 10.0)},
        "b": {"matmul": row(2.0, 10.0), "attention": row(1.0, 3.0), "copies": row(0.5, 1.0)},
    }
    rows, said = page.breakdown_rows(traced, {"a": "with `a`", "b": "with b"})
    assert [r["group"] for r in rows] == ["attention", "matmul", "copies", "all traced"]
    assert rows[0]["with `a`, ms"] == 4.0 and rows[0]["with b, ms"] == 1.0
    assert rows[2]["with `a`, ms"] is None and rows[2]["with b, MB"] == 1.0
    assert rows[-1]["with `a`, ms"] == 6.0 and rows[-1]["with b, ms"] == 3.5
    assert "4.00 ms traced with a, 1.00 ms traced with b." in said and "`" not in said
    assert said.count("The attention row") == 1  # one sentence for both steps
    empty = {"a": traced["a"], "b": {"matmul": row(0.0, 10.0)}}
    rows, said = page.breakdown_rows(empty, {"a": "with a", "b": "with b"})
    assert not any(key.startswith("with b") for r in rows for key in r)
    assert "The trace of the step with b held none of its kernels" in said


def test_what_changed_names_the_group_that_moved_most_and_where_the_copies_came_from():
    row = lambda ms, kernels=1: {"seconds": ms / 1e3, "kernels": kernels}
    a = {
        "groups": {"attention": row(46.0), "copies and transposes": row(2.0), "MLP": row(19.0)},
        "copies by file": {"attention.py": row(1.5, 4), "transformer.py": row(0.5)},
    }
    b = {
        "groups": {"attention": row(4.0), "copies and transposes": row(13.0), "MLP": row(19.5)},
        "copies by file": {
            "pallas_attention.py": row(11.0, 12), "": row(2.0, 3), "transformer.py": row(0.001),
        },
    }  # fmt: skip
    said = page.what_changed({"a": a, "b": b}, {"a": "with `a`", "b": "with b"})
    assert "the group that moved most is copies and transposes" in said  # not attention's -42
    assert "2.00 ms with a, 13.00 ms with b (+11.00 ms)" in said and "`" not in said
    assert (
        "with b, by the file whose line made them: 11.00 ms made in pallas_attention.py "
        "(12 kernels), 2.00 ms made in no source line (3 kernels)." in said
    )
    assert "(1 kernel)" in said and "(1 kernels)" not in said  # with a: transformer.py's one
    assert "0.00 ms" not in said  # a file whose copies took no measurable time is left out
    empty = {"groups": {"MLP": row(0.0)}, "copies by file": {}}
    assert page.what_changed({"a": a, "b": empty}, {"a": "a", "b": "b"}) == ""
    with pytest.raises(ValueError, match="two steps"):
        page.what_changed({"a": a}, {"a": "a"})


def test_the_steps_mfu_is_the_fields_count_over_the_published_peak():
    sizes = (8, 1024, 16, 4, 4096, 1024, 8)  # chapter 11's step on the chip
    config = jaxloops.TransformerConfig(text.VOCAB_SIZE, *sizes[:-1])
    flops = model_flops.train_flops(config, 8, 1024, causal=True)
    seconds = flops / (0.5 * 197e12)  # half the peak
    assert page.step_mfu(sizes, seconds, "TPU v5 lite") == "50.0%"
    assert page.step_mfu(sizes, seconds / 2, "TPU v5 lite") == "100.0%"
    assert page.step_mfu(sizes, seconds, "cpu").startswith("none: no published peak")
