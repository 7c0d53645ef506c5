"""Chapter 10's figures: each derived from known rows, and each wrong row rejected."""

import pytest

from jaxloops.measure.roofline import Roofline
from jaxloops.pages import ch10_heads_and_cache as page

ROOF = Roofline("test", 1e9, (1e9,), 1e8, (1e8,), 8, 4)  # 1 GFLOP/s, 100 MB/s


def sweep_rows(seconds: dict, lengths=(64, 256)):
    """Decode-sweep rows for N = 8, H = 2, B = 1, float32, with the given step seconds."""
    rows = []
    for (kv_heads, length), time in seconds.items():
        flops, cache_bytes = 4 * 8 * length * 2, 2 * kv_heads * length * 2 * 4
        rows.append(
            {
                "K": kv_heads,
                "S": length,
                "seconds": time,
                "flops": flops,
                "cache_bytes": cache_bytes,
                "bytes_per_second": cache_bytes / time,
                "predicted": ROOF.predict(flops, cache_bytes),
            }
        )
    return rows


def test_in_place_figures_and_the_mqa_note():
    rows = [
        {
            "B": b,
            "kind": kind,
            "cache MiB (K and V)": 8.0 * b,
            "scratch MiB, as given": s,
            "scratch MiB, drop_unit_axes": d,
        }
        for b, kind, s, d in ((4, "MHA", 1.0, 1.0), (1, "MHA", 9.0, 0.5), (4, "MQA", 20.0, 20.0))
    ]
    figures = page.in_place_figures(rows, 4)
    assert figures == {
        "b_large": 4,
        "mha_scratch": 1.0,
        "mha_cache_mib": 32.0,
        "b1_mha_scratch": 9.0,
        "b1_mha_cache_mib": 8.0,
        "b1_mha_loop_scratch": 0.5,
    }
    assert page.mqa_note(rows[0], 4) == "MQA with B = 4 is in place too."
    assert "keeps 20 MiB of scratch beside its 32 MiB cache" in page.mqa_note(rows[2], 4)


def test_prediction_of_a_step_is_memory_bound_below_the_ridge():
    rows = page.predicted_steps(
        ROOF, batch=1, heads=8, head_dim=2, length=64, kv_choices=(8, 2, 1), itemsize=4
    )
    assert [r["FLOPs per byte"] for r in rows] == [0.5, 2.0, 4.0]  # N / 2K for float32
    assert [r["bound"] for r in rows] == ["memory", "memory", "memory"]  # ridge is 10
    figures = page.prediction_figures(rows, ROOF, 64)
    assert figures["intensity_gqa"] == 2.0 and figures["ridge"] == 10.0
    assert figures["pred_mha"] == pytest.approx(2 * 8 * 64 * 2 * 4 / 1e8 * 1e3)
    assert page.decode_table(sweep_rows({(8, 64): 1e-3}), 8)[0]["kind"] == "MHA"


def test_decode_figures_divide_the_right_rows():
    rows = sweep_rows({(8, 256): 4e-3, (2, 256): 2e-3, (1, 256): 1e-3, (8, 64): 1.0})
    figures = page.decode_figures(rows, ROOF, (8, 2, 1), 256)
    assert figures["mha_over_gqa"] == 2.0 and figures["mha_over_mqa"] == 4.0
    assert figures["bytes_ratio"] == 8.0 and figures["bytes_ratio_gqa"] == 4.0
    assert figures["mha_ms"] == 4.0  # S = 256, not the slow row at S = 64
    with pytest.raises(ValueError, match="S = 128"):
        page.decode_figures(rows, ROOF, (8, 2, 1), 128)


def test_floor_figures_leave_out_caches_that_fit_in_the_last_level_cache():
    rows = sweep_rows({(8, 64): 1e-9, (8, 256): 1.0})  # 8 KiB: impossibly fast; 32 KiB: slow
    figures = page.floor_figures(rows, 8192, 256, 8)
    assert figures["floor_rows"] == 1 and figures["floor_worst_S"] == 256
    assert figures["floor_worst"] < 1 and "S = 64" in figures["cache_note"]
    slow = next(r for r in rows if r["S"] == 256)  # 32 KiB, 8 KiB of it from the cache at best
    cache = slow["cache_bytes"]
    assert figures["floor_worst"] == pytest.approx(
        slow["predicted"] / slow["seconds"] * (1 - 8192 / cache)
    )
    quick = [{**r, "seconds": r["predicted"] / 1.2} if r["S"] == 256 else r for r in rows]
    beaten = page.floor_figures(quick, 8192, 256, 8)["floor_worst"]
    assert beaten == pytest.approx(1.2 * (1 - 8192 / cache))  # 1.2x the whole read's floor
    unfiltered = page.floor_figures(rows, None, 64, 8)  # the fast row is judged
    assert unfiltered["floor_worst"] > 1 and unfiltered["cache_note"] == ""
    with pytest.raises(ValueError, match="S = 128"):
        page.floor_figures(rows, 2**30, 128, 8)


def test_layout_figures_pair_samples_call_by_call():
    times = {
        ("decode_attention", "(B, K, S, H)"): (1.0, 2.0, 4.0),
        ("decode_attention", "(B, S, K, H)"): (2.0, 4.0, 8.0),
        ("attention", "(B, K, S, H)"): (3.0, 2.0, 4.0),
        ("attention", "(B, S, K, H)"): (4.0, 8.0, 16.0),
    }
    rows = [
        {
            "function": f,
            "layout": lay,
            "samples": s,
            "seconds": sorted(s)[1],
            "transposes": int(lay == "(B, S, K, H)"),
        }
        for (f, lay), s in times.items()
    ]
    figures = page.layout_figures(rows)
    assert figures["layout_alone"] == 2.0 and figures["general_ratio"] == 4.0
    assert figures["function_alone"] == 1.0  # median of 3, 1, 1: a ratio of medians says 1
    assert (figures["base_transposes"], figures["swapped_transposes"]) == (0, 1)


def test_serving_figures_for_llama_3_8b():
    figures = page.serving_figures(
        layers=32,
        head_dim=128,
        kv_heads=8,
        mha_heads=32,
        context=8192,
        free_bytes=64 * 2**30,
        batch=16,
    )
    assert figures["ex_kib_token"] == 128 and figures["ex_gib_sequence"] == 1
    assert (figures["ex_fit_gqa"], figures["ex_fit_mha"]) == (64, 16)
    assert figures["ex_gib_per_head"] == 2


def test_a_last_level_cache_larger_than_every_cache_judges_the_longest_steps():
    """A processor whose last-level cache holds every cache (and the floor's read): the steps
    at the longest S are judged, as where no cache size is known, and left out of the note."""
    rows = sweep_rows({(8, 64): 1e-9, (8, 256): 1.0})
    figures = page.floor_figures(rows, 2**30, 256, 8)
    assert figures["floor_rows"] == 1 and figures["floor_worst_S"] == 256
    assert "no cache here is larger" in figures["floor_where"]
    assert figures["floor_margin"] == page.IN_CACHE_MARGIN == 0.25  # not 0.03
    assert page.floor_figures(rows, 8192, 256, 8)["floor_margin"] == 0.03
    assert "S = 64" in figures["cache_note"] and "S = 256" not in figures["cache_note"]
    fast = page.floor_figures(rows, 2**30, 64, 8)  # the impossibly fast step
    assert fast["floor_worst"] > 1 + fast["floor_margin"]  # is judged, and fails even so


def test_plots_draw_one_panel_per_kind_and_one_line_per_k():
    assert len(page.kv_grouping(8, (8, 2, 1)).axes) == 3
    assert len(page.cache_layout().axes[0].patches) == 2 * 2 * 6
    rows = [{"K": k, "S": s, "seconds": 1e-3, "predicted": 5e-4} for k in (8, 1) for s in (64, 256)]
    fig = page.decode_times(rows, (8, 1), batch=1, heads=8, head_dim=2)
    assert [len(ax.get_lines()) for ax in fig.axes] == [4, 3]  # 2 x (measured, roofline); 2 + y=1


def loop_rows(rows):
    """`loop_memory_rows` rows from (kind, B, K, cache MiB, copies as given, scratch as
    given, scratch in drop_unit_axes), the cache aliased and drop_unit_axes copying none."""
    return [
        {
            "kind": kind,
            "B": b,
            "K": k,
            "cache MiB (K and V)": cache,
            "aliased MiB": cache,
            "scratch MiB, as given": given_mib,
            "copies, as given": given,
            "scratch MiB, drop_unit_axes": loop_mib,
            "copies, drop_unit_axes": 0,
        }
        for kind, b, k, cache, given, given_mib, loop_mib in rows
    ]


# Chapter 10's loops as this CPU compiled them (XLA:CPU copies a cache with a size-1 axis in
# the as-given loop), and as a TPU v5e did (the record of 2026-12-07: no copy in any loop body;
# its scratch, outside the loop, twice MHA's cache at B = 8)
CPU_LOOPS = loop_rows(
    [
        ("MHA", 8, 16, 256.0, 0, 5.5, 5.5),
        ("GQA", 8, 4, 64.0, 0, 4.75, 4.75),
        ("MQA", 8, 1, 16.0, 8, 24.6, 16.0),
        ("MHA", 1, 16, 32.0, 8, 48.2, 0.688),
        ("GQA", 1, 4, 8.0, 8, 12.1, 0.594),
        ("MQA", 1, 1, 2.0, 8, 3.07, 0.57),
    ]
)
TPU_LOOPS = loop_rows(
    [
        ("MHA", 8, 16, 256.0, 0, 512.0615234375, 512.0615234375),
        ("GQA", 8, 4, 64.0, 0, 35.1, 35.1),
        ("MQA", 8, 1, 16.0, 0, 10.6, 10.6),
        ("MHA", 1, 16, 32.0, 0, 96.0, 96.3),
        ("GQA", 1, 4, 8.0, 0, 4.33, 4.33),
        ("MQA", 1, 1, 2.0, 0, 1.32, 6.32),
    ]
)


def failing(claims: dict) -> list[str]:
    return [claim for claim, holds in claims.items() if not holds]


def test_in_place_claims_hold_where_the_loops_copy_and_where_they_do_not():
    assert failing(page.in_place_claims(CPU_LOOPS)) == []
    assert failing(page.in_place_claims(TPU_LOOPS)) == []  # same program, scratch as measured


def test_in_place_claims_fail_for_a_wrong_loop():
    def wrong(rows, index, **change):
        rows = [dict(r) for r in rows]
        rows[index].update(change)
        return failing(page.in_place_claims(rows))

    # without a size-1 axis, two scratches or a copy are not one program
    (claim,) = wrong(TPU_LOOPS, 0, **{"scratch MiB, drop_unit_axes": 500.0})
    assert claim.startswith("without a size-1 axis both loops are one program (MHA, B = 8")
    assert wrong(CPU_LOOPS, 1, **{"copies, as given": 2})
    # drop_unit_axes copying in the loop, or a cache not aliased
    assert wrong(CPU_LOOPS, 3, **{"copies, drop_unit_axes": 8})
    assert wrong(TPU_LOOPS, 5, **{"aliased MiB": 0.0})
    # a copy in the as-given loop that costs less than a cache, or no more than drop_unit_axes
    assert wrong(CPU_LOOPS, 2, **{"scratch MiB, as given": 8.0})
    assert wrong(CPU_LOOPS, 2, **{"scratch MiB, drop_unit_axes": 24.6})
    # B = 1: a copy that saves no cache's worth, and a cache's worth saved without a copy
    assert wrong(CPU_LOOPS, 5, **{"scratch MiB, as given": 2.2})
    (claim,) = wrong(TPU_LOOPS, 3, **{"scratch MiB, as given": 200.0})
    assert claim.startswith("B = 1 saves a cache's worth exactly where as given copies it")


def test_in_place_sentences_say_what_the_loops_did():
    cpu = page.in_place_sentences(CPU_LOOPS, 8)
    assert cpu["in_place_size1"].startswith("The prediction holds")
    assert "48 MiB of scratch carried as given and 0.7 MiB" in cpu["in_place_size1"]
    assert cpu["in_place_large"].startswith("its scratch is a small fraction of the cache")
    tpu = page.in_place_sentences(TPU_LOOPS, 8)
    assert tpu["in_place_size1"].startswith("Here the prediction's cause is absent")
    assert "no loop with B = 1 saves a cache's worth" in tpu["in_place_size1"]
    assert "its scratch is 2.0 times the cache (MHA, B = 8: 512 MiB" in tpu["in_place_large"]
    assert "none of it is a copy inside the loop body" in tpu["in_place_large"]
    mixed = [dict(r) for r in CPU_LOOPS]
    mixed[5].update({"copies, as given": 0, "scratch MiB, as given": 0.57})
    text = page.in_place_sentences(mixed, 8)["in_place_size1"]
    assert "3 of the 4 loops with a size-1 axis copy the cache" in text
    assert "The 2 of 3 loops with B = 1 that save" in text


def test_the_mqa_note_names_the_scratch_it_measured():
    tpu_mqa, cpu_mqa = TPU_LOOPS[2], CPU_LOOPS[2]
    assert "as much as carried as given" in page.mqa_note(tpu_mqa, 8)
    assert "(B, 1, S, H) shape the caller passed in" not in page.mqa_note(tpu_mqa, 8)
    assert "(B, 1, S, H) shape the caller passed in" in page.mqa_note(cpu_mqa, 8)


def layout_rows(times: dict, transposes: dict):
    """`decode_layout_control` rows: per (function, layout) its samples and transposes."""
    return [
        {
            "function": f,
            "layout": lay,
            "samples": s,
            "seconds": sorted(s)[len(s) // 2],
            "transposes": transposes.get((f, lay), 0),
        }
        for (f, lay), s in times.items()
    ]


HM, SW = "(B, K, S, H)", "(B, S, K, H)"


def layout_case(swapped_over_base, swapped_transposes, base_transposes=0):
    """Four calls over three rounds: decode_attention on (B, S, K, H) takes the given
    multiples of its time on (B, K, S, H), round by round."""
    base = (6.51e-3, 6.50e-3, 6.52e-3)
    times = {
        ("decode_attention", HM): base,
        ("decode_attention", SW): tuple(b * r for b, r in zip(base, swapped_over_base)),
        ("attention", HM): base,
        ("attention", SW): base,
    }
    transposes = {
        ("decode_attention", SW): swapped_transposes,
        ("decode_attention", HM): base_transposes,
    }
    return page.layout_figures(layout_rows(times, transposes))


def test_layout_claims_tie_the_time_to_the_transposes():
    # this CPU: two transposes and 8.9 times; a TPU v5e: none, and the same time
    assert failing(page.layout_claims(layout_case((8.8, 8.9, 9.0), 2))) == []
    tpu = layout_case((0.995, 1.0, 1.004), 0)
    assert failing(page.layout_claims(tpu)) == []
    assert page.layout_margin(tpu) == 0.03  # the rounds spread less than CEILING_MARGIN
    assert tpu["layout_alone_low"] == pytest.approx(0.995)


def test_layout_claims_fail_for_a_wrong_answer():
    (claim,) = failing(page.layout_claims(layout_case((1.0, 1.0, 1.0), 1)))  # a free transpose
    assert "transposes the (B, S, K, H) cache (1 whole-cache transposes)" in claim
    (claim,) = failing(page.layout_claims(layout_case((1.5, 1.5, 1.5), 0)))  # slow, no transpose
    assert "without a transpose, so both layouts take the same time: 1.500" in claim
    assert failing(page.layout_claims(layout_case((0.8, 0.8, 0.8), 0)))  # faster is not "same"
    (claim,) = failing(page.layout_claims(layout_case((9.0, 9.0, 9.0), 2, base_transposes=1)))
    assert claim.startswith("decode_attention's program transposes no cache stored (B, K, S, H)")
    # the rounds' own spread widens "the same time": 1.10 is within rounds from 0.9 to 1.2
    assert failing(page.layout_claims(layout_case((0.9, 1.1, 1.2), 0))) == []


def test_layout_sentences_follow_the_transposes():
    cpu = page.layout_sentences(layout_case((8.8, 8.9, 9.0), 2))
    assert "8.9 times slower, the 2 transposes" in cpu["layout_alone_text"]
    assert "the layout-alone row is why" in cpu["layout_choice"]
    tpu = page.layout_sentences(layout_case((0.995, 1.0, 1.004), 0))
    assert "at 1.00 times its time" in tpu["layout_alone_text"]
    assert "without a whole-cache transpose" in tpu["layout_alone_text"]
    assert "its program holding no transpose of it" in tpu["layout_choice"]
    assert "(here it made none, and took 1.00 times the time" in tpu["layout_takeaway"]
    assert "(8.9 times slower here" in cpu["layout_takeaway"]


def test_call_cost_is_what_a_call_adds_to_its_steps():
    assert page.call_cost(6.51e-3, 5.75e-3, 64) == pytest.approx(0.76e-3 * 64 / 63)
    assert page.call_cost(5.0e-3, 5.75e-3, 64) == 0.0  # a faster single call shows no cost
    with pytest.raises(ValueError, match="at least 2 steps"):
        page.call_cost(1.0, 1.0, 1)


# The TPU v5e's record (2026-12-07), as the roofline and rows it held: the read 4 GiB at
# 677.1 GB/s, B = 16, N = 16, H = 64, bfloat16, 64 steps a call
TPU_ROOF = Roofline("tpu", 1.488e14, (1.488e14,), 677.1e9, (677.1e9,), 8192, 4 * 2**30)


def tpu_sweep(seconds: dict):
    rows = []
    for (kv_heads, length), time in seconds.items():
        flops, cache_bytes = 4 * 16 * 16 * length * 64, 2 * 16 * kv_heads * length * 64 * 2
        rows.append(
            {
                "K": kv_heads,
                "S": length,
                "seconds": time,
                "flops": flops,
                "cache_bytes": cache_bytes,
                "bytes_per_second": cache_bytes / time,
                "predicted": TPU_ROOF.predict(flops, cache_bytes),
            }
        )
    return rows


TPU_SWEEP = {(16, 65536): 5.75e-3, (4, 65536): 1.48e-3, (1, 65536): 0.394e-3, (16, 16384): 1.51e-3}


def tpu_alike(single_seconds=6.51e-3, sweep=TPU_SWEEP):
    control = layout_rows(
        {
            (f, lay): (single_seconds,) * 3
            for f in ("decode_attention", "attention")
            for lay in (HM, SW)
        },
        {},
    )
    return page.timed_alike(
        tpu_sweep(sweep), control, TPU_ROOF, llc=None, length=65536, heads=16, steps=64
    )


def test_the_floor_timed_alike_holds_on_the_tpus_record():
    figures = tpu_alike()
    assert figures["sweep_floor"] == pytest.approx(1.103, abs=1e-3)  # what failed on the chip
    assert figures["alike_floor"] == pytest.approx(0.974, abs=1e-3)  # one call each
    assert figures["call_ms"] == pytest.approx(0.76 * 64 / 63)
    assert figures["read_gbs_alike"] == pytest.approx(771, abs=1)
    assert failing(page.floor_claims(figures)) == []
    text = page.floor_sentence(figures)
    assert "ran at 0.97 of the floor's speed" in text and "beat it by what a call costs" in text


def test_the_floor_timed_alike_fails_for_a_step_faster_than_the_read():
    # one call of the step faster than the read of its bytes: no call's cost explains that
    # (the chip's sweep with no cost to a call: both the call and the sweep beat the read)
    alike, sweep = failing(page.floor_claims(tpu_alike(single_seconds=5.75e-3)))
    assert alike.startswith(
        "timed alike with the roofline's read, one call each, MHA's step ran at 1.103"
    )
    assert sweep.startswith(
        "the sweep's fastest step ran at 1.103 of its floor's speed, at most 1.030"
    )
    fast_call = failing(
        page.floor_claims(
            tpu_alike(single_seconds=5.9e-3, sweep={**TPU_SWEEP, (16, 65536): 5.0e-3})
        )
    )
    assert any(c.startswith("timed alike with the roofline's read") for c in fast_call)
    # a sweep step beyond what the call's cost explains (GQA twice as fast as its bytes allow)
    (claim,) = failing(page.floor_claims(tpu_alike(sweep={**TPU_SWEEP, (4, 65536): 0.74e-3})))
    assert (
        "at most 1.173: 1 + 0.03, times the 1.139 that a call's cost of 0.772 ms explains" in claim
    )
    # a CPU's steps, slower than the floor: no call's cost needed
    slow = tpu_alike(single_seconds=13.2e-3, sweep={k: 2 * v for k, v in TPU_SWEEP.items()})
    assert failing(page.floor_claims(slow)) == []
    assert page.floor_sentence(slow).endswith("beat the floor by more than that margin either.")
    with pytest.raises(ValueError, match="no MHA row"):
        page.timed_alike(
            tpu_sweep(TPU_SWEEP), [], TPU_ROOF, llc=None, length=4096, heads=16, steps=64
        )


def test_beside_clause_follows_the_read():
    assert "shared machine" in page.beside_clause({"mha_gbs": 23.6, "roof_gbs_beside": 37.5})
    assert "not timed alike" in page.beside_clause({"mha_gbs": 747.0, "roof_gbs_beside": 677.1})


def test_the_leads_growth_needs_both_the_median_and_the_lowest_round_to_rise():
    grew = {"short_lead": 1.75, "short_lead_low": 1.24, "short_lead_high": 2.35,
            "long_lead": 2.28, "long_lead_low": 1.99, "long_lead_high": 2.29}  # fmt: skip
    assert page.lead_grows(grew)  # a build's figures: one short round ran far above the rest
    assert not page.lead_grows({**grew, "long_lead": 1.70})  # the median fell
    assert not page.lead_grows({**grew, "long_lead_low": 1.20})  # the lowest round fell
