"""Chapter 8's figures, tables and plots: each derived from known rows, and each wrong row
rejected."""

import pytest

from jaxloops.measure.roofline import CEILING_MARGIN, Roofline
from jaxloops.pages import ch08_attention as page

ROOF = Roofline("test", 1e9, (1e9, 0.9e9), 1e8, (1e8,), 8, 4)  # 1 GFLOP/s, 100 MB/s
NAMES = {"naive": "naive", "xla": "xla", "blockwise": "blockwise"}


def sweep(lengths=(16, 32), seconds=None):
    """(implementation, T) -> row: naive's scratch and FLOPs grow as T², blockwise's as T."""
    rows = {}
    for t in lengths:
        for name, temp in (("naive", t * t), ("xla", t * t), ("blockwise", 2 * t)):
            rows[name, t] = {
                "temp_bytes": temp,
                "flops": 3 * t * t,
                "bytes_accessed": 8 * t,
                "seconds": (seconds or {}).get(name, 1e-3),
            }
    return rows


def test_growth_figures_per_doubling_at_the_two_longest_lengths():
    figures = page.growth_figures(sweep((8, 16, 32)), (8, 16, 32), 1, 1)
    assert figures["T_prev"] == 16 and figures["naive_mem_growth"] == 4.0
    assert figures["flop_growth"] == 4.0 and figures["block_mem_growth"] == 2.0
    assert figures["mem_ratio"] == 16.0 and figures["naive_scores_copies"] == 0.25
    with pytest.raises(ValueError, match=r"\[32\]"):
        page.growth_figures(sweep((32,)), (32,), 1, 1)


def test_prediction_timing_and_table_keep_implementations_apart():
    rows = sweep(seconds={"naive": 4e-3, "xla": 2e-3, "blockwise": 1e-3})
    prediction = {
        "naive": (2e-3, "compute", 1e5),
        "xla": (1e-3, "memory", 1e5),
        "blockwise": (1e-3, "compute", 1e4),
    }
    figures = page.prediction_figures(prediction, ROOF, 32)
    assert figures["naive_bytes_ms"] == 1.0 and figures["naive_gib"] == 1e5 / 2**30
    assert figures["peak_spread"] == 100 * ROOF.spread("flops") > 0
    timed = page.timing_figures(rows, prediction, 32)
    assert timed["naive_ratio"] == 2.0 and timed["block_ratio"] == 1.0
    assert timed["block_speedup"] == 4.0 and timed["xla_vs_naive"] == 0.5
    assert timed["predicted_speedup"] == 2.0  # naive's 2 ms predicted over blockwise's 1
    table = page.prediction_table(rows, prediction, NAMES, 32)
    assert [r["ratio"] for r in table] == [2.0, 2.0, 1.0]


def test_fusion_figures_find_where_the_exponentials_went():
    naive = [
        {"fusion": "a", "ops": "dot, exponential", "shape": "f32[1,8,8]"},
        {"fusion": "b", "ops": "dot", "shape": "f32[1,4,4]"},
    ]
    xla = [
        {"fusion": "c", "ops": "transpose", "shape": "f32[8,8]"},
        {"fusion": "d", "ops": "dot, exponential", "shape": "f32[16]"},
    ]
    figures = page.fusion_figures(naive, xla, 64, 8)
    assert figures["naive_softmax_home"].startswith("the first matmul")
    assert figures["xla_softmax_home"].startswith("the second matmul")
    assert figures["xla_full_passes"] == "c (transpose)"
    assert (figures["naive_transposes"], figures["xla_transposes"]) == (0, 1)
    assert page.softmax_home(naive[1:], 8) == "a kernel of its own"
    # XLA:TPU's matmul is a convolution, and its fusions may return tuples
    tpu = [{"fusion": "e", "ops": "convolution, exponential", "shape": "(f32[8], bf16[2,4,8])"}]
    assert page.softmax_home(tpu, 8).startswith("the first matmul")
    assert page.result_arrays(tpu[0]) == [("f32", 8), ("bf16", 64)]
    assert page.score_writes(tpu, 64) == (1, 0.5)  # one bfloat16 array: half a float32 one


def test_parts_figures_pair_calls_and_find_the_worst_move():
    def part(name, seconds, predicted, samples):
        return {
            "part": name,
            "seconds": seconds,
            "predicted": predicted,
            "ratio": seconds / predicted,
            "bound": "memory" if name == "softmax" else "compute",
            "samples": samples,
            "transcendentals": 100,
            "bytes_accessed": 8.0,
            "flops": 4.0,
        }

    parts = [
        part("scores: Q Kᵀ", 2.0, 1.0, (2.0, 2.0, 2.0)),
        part("softmax", 3.0, 0.5, (3.0, 6.0, 3.0)),
        part("mix: weights V", 1.0, 0.9, (1.0, 1.0, 1.0)),
        part("whole (naive)", 6.0, 2.0, (6.0, 6.0, 6.0)),
        part("control: softmax, exp → 1 / (1 - x)", 2.0, 0.5, (1.0, 2.0, 3.0)),
        part("control: square matmul, FLOPs of Q Kᵀ", 1.0, 1.0, (1.0, 1.0, 1.0)),
    ]
    figures = page.parts_figures(parts)
    assert (figures["exp_ratio_low"], figures["exp_ratio"], figures["exp_ratio_high"]) == (
        1.0,
        3.0,
        3.0,
    )  # 3/1, 6/2, 3/3 sorted: a ratio of medians would say 1.5
    assert figures["worst_part"] == "softmax" and figures["worst_excess_ms"] == 2500.0
    assert figures["qk_vs_square"] == 2.0 and figures["parts_share"] == 50.0
    # the lowest ratio of the moves and the whole (mix's 1/0.9), not the square control's 1
    assert figures["moves_min_ratio"] == 1 / 0.9 and figures["softmax_bound"] == "memory"


def test_formula_ratios_divide_the_compiled_scratch_by_the_formula():
    formula = lambda b, n, t, s, dtype: 2 * b * n * t * s * 4  # noqa: E731  (two score arrays)
    figures = page.formula_ratios(sweep((16, 32)), 16, 32, formula, 1, 1)
    assert figures["ex_ratio_long"] == figures["ex_ratio_short"] == 1 / 8  # sweep keeps T²
    assert figures["ex_formula_mib"] == 8 * 32 * 32 / 2**20 and figures["ex_T_short"] == 16


def test_numerics_figures_take_the_worst_of_each_dtype():
    rows = [
        {"implementation": i, "dtype": d, "max_abs_error": e}
        for i, d, e in (
            ("naive", "float32", 1e-7),
            ("xla", "float32", 3e-7),
            ("cudnn", "float32", None),
            ("naive", "bfloat16", 2e-3),
            ("cudnn", "bfloat16", 9e-3),
            ("blockwise", "bfloat16", 1e-3),
        )
    ]
    figures = page.numerics_figures(rows)
    assert figures["err_f32"] == 3e-7 and figures["err_bf16"] == 9e-3
    assert figures["bf16_errors"] == [2e-3, 1e-3]  # cuDNN is not one of the three compared
    with pytest.raises(KeyError):
        page.numerics_figures(rows[:3])  # no bfloat16 row ran


def test_chapter_8_plots_draw_every_line():
    rows = {
        (name, t): {
            "temp_bytes": t * t if name != "blockwise" else 2 * t,
            "flops": 3 * t * t,
            "seconds": 1e-3,
        }
        for name in NAMES
        for t in (16, 32)
    }
    fig = page.scratch_and_flops(rows, (16, 32), NAMES, batch=1, heads=1, head_dim=2)
    assert "(same as naive)" in fig.axes[0].get_lines()[1].get_label()
    fig = page.latency(rows, (16, 32), NAMES, lambda name, t: (1e-3,), title="t")
    assert len(fig.axes[0].get_lines()) == 3 + 2


def test_cudnn_figures():
    report = [
        {"implementation": "cudnn", "works": False, "error": "no GPU"},
        {"implementation": "xla", "works": True, "error": ""},
    ]
    assert page.cudnn_figures(report) == {
        "cudnn_status": "refused every request",
        "cudnn_error": "no GPU",
    }


# The page's claims, restated so that each holds on every backend (issue 41, item 4). Each
# claim function is fed two recorded runs of the page, which both pass, and known-wrong
# inputs, which fail: this CPU's (`make chapter N=08`, 2 cores, JAX 0.10.2: the figures its
# cells glued) and the TPU v5e's (results/tpu/08_attention.ipynb, 2026-12-06: the dicts its
# failing checks printed, its tables, its glued figures). The TPU ran an earlier page, so a
# figure the page added since is derived from what it recorded, as each comment says.
MiB = 2**20
CPU, TPU = dict(N=4, lengths=(256, 2048, 4096)), dict(N=8, lengths=(1024, 8192, 16384))
CPU["temp"] = {  # (implementation, T) -> compiled scratch bytes
    ("naive", 256): 2359296,  # ex_ratio_short 1.125 x the formula's 2 MiB (two score arrays)
    ("naive", 2048): 128 * MiB,  # naive_mem_mib 512 / naive_mem_growth 4.0
    ("naive", 4096): 512 * MiB,
    ("xla", 4096): 512 * MiB,
    ("blockwise", 2048): 17457608,  # block_mem_mib / block_mem_growth 1.2702885756170033
    ("blockwise", 4096): 22176200,  # block_mem_mib 21.14887237548828
}
CPU["flops"] = {2048: 1.0, 4096: 3.9995250283663615}  # flop_growth
TPU["temp"] = {
    ("naive", 1024): 21004288,  # ex_ratio_short 0.31298828125 x the formula's 64 MiB
    ("naive", 8192): 3221322240,  # naive_mem_mib / naive_mem_growth 2.666626613548603
    ("naive", 16384): 8590063616,  # naive_mem_mib 8192.123046875
    ("xla", 16384): 8590031360,  # xla_mem_mib 8192.09228515625
    ("blockwise", 8192): 101204992,  # block_mem_mib / block_mem_growth 1.3315491789179728
    ("blockwise", 16384): 134759424,  # block_mem_mib 128.5166015625
}
TPU["flops"] = {8192: 1.0, 16384: 4.015320549556614}
TPU["growth"] = {  # the dict cell 9's check printed
    "T_prev": 8192,
    "naive_mem_growth": 2.666626613548603,
    "flop_growth": 4.015320549556614,
    "block_mem_growth": 1.3315491789179728,
    "naive_mem_mib": 8192.123046875,
    "xla_mem_mib": 8192.09228515625,
    "block_mem_mib": 128.5166015625,
    "mem_ratio": 63.74369495672525,
    "scores_mib": 8192.0,
    "naive_scores_copies": 1.0000150203704834,
}


def recorded_growth(run: dict) -> dict:
    """`growth_figures` of the scratch and FLOPs a run recorded."""
    rows = {key: {"temp_bytes": temp} for key, temp in run["temp"].items()}
    for t, flops in run["flops"].items():
        rows["naive", t]["flops"] = flops
    return page.growth_figures(rows, run["lengths"], 1, run["N"])


def failed_as(claims: dict) -> list[str]:
    """The failed claims, each by the words before its figures."""
    return [claim.split(":")[0] for claim in page.failed(claims)]


def test_scratch_claims_hold_on_the_cpu_and_the_tpu_and_reject_wrong_scratch():
    cpu, tpu = recorded_growth(CPU), recorded_growth(TPU)
    for name, figure in TPU["growth"].items():  # the derived rows give what the TPU printed
        assert tpu[name] == pytest.approx(figure, rel=1e-12), name
    assert (cpu["naive_scores_copies"], cpu["naive_mem_growth"]) == (2.0, 4.0)
    assert cpu["naive_slope"] == pytest.approx(1.9575187496394222)  # the CPU's glued slope
    assert tpu["naive_prev_copies"] == pytest.approx(1.5, abs=1e-4)  # 1.5 arrays, then 1
    assert tpu["naive_slope"] == pytest.approx(2.169, abs=1e-3)
    assert page.failed(page.scratch_claims(cpu)) == page.failed(page.scratch_claims(tpu)) == []
    # The claims it replaces: 4x per doubling held on the CPU, not on the TPU (2.67).
    assert 3.5 < cpu["naive_mem_growth"] < 4.5 and not 3.5 < tpu["naive_mem_growth"] < 4.5
    wrong = {
        # blockwise holding a whole score array, as naive does
        "blockwise's scratch holds no score array": dict(block_mem_mib=8192.0, mem_ratio=1.0),
        # naive holding less than one float32 score array (as on the TPU at T = 1024)
        "naive's scratch holds at least one score array": dict(naive_scores_copies=0.63),
        "naive's scratch grows near T²": dict(naive_slope=1.0),  # linear, like blockwise
        "blockwise's scratch grows at most linearly": dict(block_mem_growth=4.0),
        "FLOPs grow 4x per doubling": dict(flop_growth=2.0),
    }
    for claim, change in wrong.items():
        failed = failed_as(page.scratch_claims(dict(tpu, **change)))
        assert claim in failed, (claim, failed)
        assert claim in failed_as(page.scratch_claims(dict(cpu, **change)))


CPU_TIMED = {  # make chapter N=08 on this CPU: cell 15's glued figures
    "naive_ms": 707.9609140000684,
    "xla_ms": 844.0478750017064,
    "block_ms": 220.92116700150655,
    "naive_ratio": 8.450728110897831,
    "xla_ratio": 9.999152000405424,
    "block_ratio": 2.637073148182027,
    "block_speedup": 3.204586158986027,
    "xla_vs_naive": 1.1922238337039393,
}
TPU_TIMED = {  # the dict cell 15's check printed (results/tpu/08_attention.ipynb, bd5191d)
    "naive_ms": 1.3778054999988854,
    "xla_ms": 2.850875000007136,
    "block_ms": 1.1573899999746118,
    "naive_ratio": 1.473129589073489,
    "xla_ratio": 1.135614232548667,
    "block_ratio": 4.951016809919809,
    "block_speedup": 1.190441856270668,
    "xla_vs_naive": 2.069141834612681,
}
for _timed in (CPU_TIMED, TPU_TIMED):  # recorded before the page printed it: derived
    _timed["predicted_speedup"] = (_timed["naive_ms"] / _timed["naive_ratio"]) / (
        _timed["block_ms"] / _timed["block_ratio"]
    )
CPU_SPREAD = 0.6067067112989888  # the same run's roofline_margin (ch8_margin, in %)
# The TPU's flops spread was 0.0066; its bytes spread was not recorded. Its claims are fed
# the least margin there is, CEILING_MARGIN: a larger one only weakens the floor.
TPU_MARGIN = CEILING_MARGIN


def test_roofline_margin_is_the_larger_of_two_calls_and_the_ceilings_spread():
    quiet = Roofline("quiet", 1e9, (1e9, 0.99e9), 1e8, (1e8, 0.995e8), 8, 4)
    assert page.roofline_margin(quiet) == CEILING_MARGIN
    assert page.roofline_margin(ROOF) == ROOF.spread("flops") > CEILING_MARGIN


def test_latency_claims_hold_on_the_cpu_and_the_tpu_and_reject_a_rate_above_the_roofline():
    assert page.failed(page.latency_claims(CPU_TIMED, CPU_SPREAD)) == []
    assert page.failed(page.latency_claims(TPU_TIMED, TPU_MARGIN)) == []
    # The claims they replace held on the CPU only: naive >= 1.5x its roofline, blockwise
    # >= 1.5x faster (the TPU: 1.47 and 1.19).
    assert CPU_TIMED["naive_ratio"] >= 1.5 and CPU_TIMED["block_speedup"] >= 1.5
    assert TPU_TIMED["naive_ratio"] < 1.5 and TPU_TIMED["block_speedup"] < 1.5
    beats = "no program beats its roofline"
    for timed, margin in ((CPU_TIMED, CPU_SPREAD), (TPU_TIMED, TPU_MARGIN)):
        # a measured time below its prediction by more than the margin: a rate above the roof
        faster = dict(timed, block_ratio=0.95 / (1 + margin))
        assert beats in failed_as(page.latency_claims(faster, margin))
        # blockwise as slow as naive
        same = dict(timed, block_speedup=1.0, block_ratio=timed["naive_ratio"])
        assert failed_as(page.latency_claims(same, margin)) == ["blockwise is faster than naive"]
    # TPU's floor is 1 / 1.03 = 0.971: its XLA, at 1.14, is above it by 17 %
    assert beats in failed_as(page.latency_claims(dict(TPU_TIMED, xla_ratio=0.96), TPU_MARGIN))


def test_closer_claims_follow_the_softmax_pass_on_the_cpu_and_the_tpu():
    cpu_softmax, tpu_softmax = 8.654610584708252, 1.1772644641211256  # CPU_PARTS, TPU_PARTS
    # The claim it replaces, "blockwise is closer to its prediction", held on the CPU only:
    # on the TPU naive is the closer (1.47 against 4.95), and the roofline predicted a
    # speed-up of 4.0 (naive memory-bound, blockwise compute-bound) where 1.19 came.
    assert CPU_TIMED["block_ratio"] * 1.03 <= CPU_TIMED["naive_ratio"]
    assert TPU_TIMED["naive_ratio"] * 1.03 <= TPU_TIMED["block_ratio"]
    assert CPU_TIMED["predicted_speedup"] == pytest.approx(1.0, abs=1e-4)  # both compute-bound
    assert TPU_TIMED["predicted_speedup"] == pytest.approx(4.0, abs=0.01)
    assert not page.streams_the_scores(cpu_softmax) and page.streams_the_scores(tpu_softmax)
    assert page.failed(page.closer_claims(CPU_TIMED, cpu_softmax)) == []
    assert page.failed(page.closer_claims(TPU_TIMED, tpu_softmax)) == []
    # Closer in the sense of the ratios exactly when faster than predicted: the same claim.
    for timed in (CPU_TIMED, TPU_TIMED):
        closer = timed["block_ratio"] < timed["naive_ratio"]
        assert closer == (timed["block_speedup"] > timed["predicted_speedup"])
    # Wrong: the direction the softmax predicts does not come. A CPU whose blockwise gained
    # no more than the roofline's 1.0; a TPU whose blockwise gained more than its 4.0.
    slow = "blockwise is the closer to its prediction, as a slow pass over the scores predicts"
    streamed = "naive is the closer to its prediction, as a streamed pass over the scores predicts"
    assert failed_as(page.closer_claims(dict(CPU_TIMED, block_speedup=1.0), cpu_softmax)) == [slow]
    assert failed_as(page.closer_claims(dict(TPU_TIMED, block_speedup=5.0), tpu_softmax)) == [
        streamed
    ]
    # Each recorded run against the other backend's softmax: the prediction turns, and fails.
    assert failed_as(page.closer_claims(CPU_TIMED, tpu_softmax)) == [streamed]
    assert failed_as(page.closer_claims(TPU_TIMED, cpu_softmax)) == [slow]


def recorded_tpu_rows() -> tuple[dict, tuple, object]:
    """The TPU sweep's rows, as far as the run recorded them, and its predictions: at T = 4096
    the table's figures; at T = 1024 and 16384 read off its latency plot (0.56 to 0.57 ms at
    1024, blockwise 10.7 ms at 16384) and the predictions scaled as T² from 4096's."""
    lengths = (1024, 4096, 16384)
    table = {"naive": (1.378, 0.935), "xla": (2.851, 2.51), "blockwise": (1.157, 0.234)}
    at_1024 = {"naive": 0.56, "xla": 0.57, "blockwise": 0.57}
    rows = {}
    for name, (measured, _) in table.items():
        rows[name, 4096] = {"seconds": measured * 1e-3}
        rows[name, 1024] = {"seconds": at_1024[name] * 1e-3}
        rows[name, 16384] = {"seconds": 10.7e-3 if name == "blockwise" else None}

    def predicted(name, T):
        return (table[name][1] * 1e-3 * (T / 4096) ** 2, "memory", 0)

    return rows, lengths, predicted


def test_call_cost_figures_find_the_tpus_fixed_cost_and_blockwise_at_its_longest():
    rows, lengths, predicted = recorded_tpu_rows()
    costs = page.call_cost_figures(rows, lengths, predicted, 4096)
    assert costs["floor_ms"] == pytest.approx(0.56) and costs["fixed_cost"]
    assert costs["first_pred_ms"] == pytest.approx(2.51 / 16)  # XLA's, the largest at 1024
    assert costs["floor_share"] == pytest.approx(100 * 0.56 / 1.157)
    assert costs["T_block_longest"] == 16384
    assert costs["block_ratio_longest"] == pytest.approx(10.7 / (0.234 * 16))
    note = page.closer_note(TPU_TIMED, costs, 1.1772644641211256, 4096, 64)
    assert "naive is the closer" in note and "Part of that is the call" in note
    assert "at T = 16384" in note and "H = 64 deep" in note
    # Calls whose time is their work (1.2 times the prediction at T = 1024: no fixed cost),
    # blockwise run no longer than the timed T:
    for name in NAMES:
        rows[name, 1024]["seconds"] = 1.2 * predicted(name, 1024)[0]
    rows["blockwise", 16384]["seconds"] = None
    costs = page.call_cost_figures(rows, lengths, predicted, 4096)
    assert not costs["fixed_cost"] and costs["T_block_longest"] == 4096
    note = page.closer_note(TPU_TIMED, costs, 1.1772644641211256, 4096, 64)
    assert "the call" not in note and "its loop" not in note
    note = page.closer_note(CPU_TIMED, costs, 8.654610584708252, 4096, 64)
    assert "it is the closer to its prediction" in note


def fusions(table: str) -> list[dict]:
    """Rows of a page's fusion table as printed: fusion | kind | result | runs | operations."""
    rows = []
    for line in table.strip().splitlines():
        fusion, _, shape, _, ops = (cell.strip() for cell in line.strip("|").split("|"))
        rows.append({"fusion": fusion, "shape": shape, "ops": "" if ops == "—" else ops})
    return rows


CPU_NAIVE = fusions("""
| copy_bitcast_fusion.2 | kLoop | f32[4,4096,64] | once | copy, multiply, transpose |
| copy_bitcast_fusion.1 | kLoop | f32[4,64,4096] | once | copy, transpose |
| transpose_copy_fusion | kLoop | f32[1,4,4096,64] | once | copy, transpose |
| ynn_fusion.1 | kCustom | f32[4,4096,4096] | once | dot |
| bitcast_copy_fusion.1 | kLoop | f32[1,4,1,4096,4096] | once | copy |
| ynn_fusion | kCustom | f32[1,4,1,4096,64] | once | divide, dot, exponential, multiply, reduce, subtract |
| copy_bitcast_fusion | kLoop | f32[1,4096,4,64] | once | copy, transpose |
""")  # noqa: E501
CPU_XLA = fusions("""
| transpose_copy_fusion.1 | kLoop | f32[1,4,4096,1,64] | once | copy, transpose |
| transpose_copy_fusion | kLoop | f32[1,4,64,4096] | once | copy, transpose |
| copy_bitcast_fusion.2 | kLoop | f32[4,64,4096] | once | copy, transpose |
| ynn_fusion.1 | kCustom | f32[1,1,4,4096,4096] | once | divide, dot, exponential, multiply, reduce, subtract |
| copy_bitcast_fusion.1 | kLoop | f32[4,4096,4096] | once | copy, transpose |
| ynn_fusion | kCustom | f32[4,64,4096] | once | dot |
| copy_bitcast_fusion | kLoop | f32[1,4096,4,64] | once | copy, transpose |
""")  # noqa: E501
TPU_NAIVE = fusions("""
| fusion.24 | kLoop | f32[8,4096,64] | once | multiply |
| fusion.28 | kLoop | f32[8,4096,64] | once | — |
| fusion.14.clone.1 | kOutput | f32[8,4096,4096] | once | convolution, fusion |
| fusion.30 | kLoop | bf16[8,4096,4096] | once | — |
| fusion.31 | kLoop | f32[8,4096,64] | once | — |
| fusion.22 | kOutput | (f32[8,4096], bf16[8,4096,4096]) | once | convert, exponential, fusion, reduce, reduce-window, subtract |
| fusion.11 | kOutput | f32[1,4096,8,64] | once | convolution, divide, fusion |
""")  # noqa: E501
TPU_XLA = fusions("""
| fusion.23 | kLoop | f32[4096,8,64] | once | — |
| fusion.19 | kLoop | bf16[4096,8,64] | once | convert |
| fusion.22 | kLoop | f32[4096,8,64] | once | — |
| fusion.11 | kLoop | f32[8,4096,4096] | once | divide, exponential, subtract |
| fusion.16 | kOutput | (f32[8,4096], f32[8,4096,4096]) | once | convolution, fusion, multiply, reduce |
| fusion.2 | kLoop | f32[8,4096] | once | exponential, reduce, subtract |
| fusion.8 | kOutput | f32[1,4096,8,64] | once | convolution, fusion |
""")  # noqa: E501
CPU_SCORES, TPU_SCORES = 4 * 4096 * 4096, 8 * 4096 * 4096  # B N T S at T = S = 4096


def test_fusion_claims_hold_on_the_cpu_and_the_tpu_and_reject_a_program_without_scores():
    cpu = page.fusion_figures(CPU_NAIVE, CPU_XLA, CPU_SCORES, 4096)
    tpu = page.fusion_figures(TPU_NAIVE, TPU_XLA, TPU_SCORES, 4096)
    # what the page quotes: XLA:CPU transposes XLA's weights whole, XLA:TPU transposes none
    assert (cpu["xla_transposes"], tpu["xla_transposes"]) == (1, 0)
    assert cpu["xla_full_passes"].endswith("copy_bitcast_fusion.1 (copy, transpose)")
    counts = [(f["naive_score_arrays"], f["naive_score_f32"], f["xla_score_arrays"],
               f["xla_score_f32"]) for f in (cpu, tpu)]  # fmt: skip
    assert counts == [(2, 2.0, 2, 2.0), (3, 2.0, 2, 2.0)]  # TPU: f32 scores + 2 in bfloat16
    assert tpu["naive_softmax_home"] == tpu["xla_softmax_home"] == "a kernel of its own"
    assert page.failed(page.fusion_claims(CPU_NAIVE, CPU_XLA, CPU_SCORES)) == []
    assert page.failed(page.fusion_claims(TPU_NAIVE, TPU_XLA, TPU_SCORES)) == []
    # The claim it replaces held on the CPU only: a transpose of a score-sized array by XLA.
    for table, scores, transposes in ((CPU_XLA, CPU_SCORES, 1), (TPU_XLA, TPU_SCORES, 0)):
        full = page.full_size(table, scores)
        assert sum("transpose" in f["ops"] for f in full) == transposes
    # blockwise's fusions, tiles of (N, Tq, Sb), no whole score array: rejected as naive's
    tiles = [{"fusion": "t", "shape": "f32[8,2048,512]", "ops": "convolution, exponential"}]
    for naive, xla, scores in ((CPU_NAIVE, CPU_XLA, CPU_SCORES), (TPU_NAIVE, TPU_XLA, TPU_SCORES)):
        assert failed_as(page.fusion_claims(tiles, xla, scores)) == [
            "naive's program writes a whole score array"
        ]
        assert failed_as(page.fusion_claims(naive, tiles, scores)) == [
            "XLA's program writes a whole score array"
        ]
        same = failed_as(page.fusion_claims(naive, naive, scores))  # one program twice
        assert same == ["the same four moves, exponentials included, cut into different kernels"]


CPU_PARTS = {  # make chapter N=08 on this CPU: cell 23's glued figures the claims read
    "moves_min_ratio": 3.9576887651428314,
    "softmax_bound": "memory",
    "softmax_ratio": 8.654610584708252,
    "qk_vs_square": 3.020525007176011,
    "mix_vs_square": 4.255873607338939,
    "exp_ratio": 1.0827503853052887,
    "control_exponentials": 0.0,
    "control_bytes_ratio": 1.0,
    "square_flops_ratio": 0.9990799427032471,
}
TPU_PARTS = {  # the dict cell 23's check printed (the figures the claims read), and two more
    # the lowest measured / predicted of the moves and the whole in its table (scores 1.68,
    # softmax 1.18, mix 1.66, whole 1.25): the softmax's
    "moves_min_ratio": 1.1772644641211256,
    # its table: the softmax's 1.07e9 FLOPs take 0.035 ms at 30,698 GFLOP/s, its prediction
    # 3.17 ms: the bytes' (memory-bound)
    "softmax_bound": "memory",
    "softmax_ratio": 1.1772644641211256,
    "qk_vs_square": 2.280253481421016,
    "mix_vs_square": 2.1008540766727966,
    "exp_ratio": 0.9935136248214849,
    "control_exponentials": 0.0,
    "control_bytes_ratio": 1.0,
    "square_flops_ratio": 0.9998779445868424,
}


def test_parts_claims_hold_on_the_cpu_and_the_tpu_and_reject_wrong_parts():
    assert page.failed(page.parts_claims(CPU_PARTS, CPU_SPREAD)) == []
    assert page.failed(page.parts_claims(TPU_PARTS, TPU_MARGIN)) == []
    # The claim it replaces held on the CPU only: the softmax >= 1.5x its prediction.
    assert CPU_PARTS["softmax_ratio"] >= 1.5 > TPU_PARTS["softmax_ratio"]
    wrong = {
        # a move measured at twice the roofline's rate
        "no move beats its roofline": dict(moves_min_ratio=0.5),
        "the softmax is memory-bound by the roofline": dict(softmax_bound="compute"),
        "the softmax control moves the softmax's bytes with no exponential": dict(
            control_exponentials=6.7e7
        ),
        "the square matmul has the scores matmul's FLOPs": dict(square_flops_ratio=0.5),
        "the thin matmuls take longer than the square one": dict(mix_vs_square=1.0),
        "the softmax takes under twice its control": dict(exp_ratio=2.5),  # exp-bound
    }
    for parts, margin in ((CPU_PARTS, CPU_SPREAD), (TPU_PARTS, TPU_MARGIN)):
        for claim, change in wrong.items():
            assert failed_as(page.parts_claims(dict(parts, **change), margin)) == [claim]
