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
