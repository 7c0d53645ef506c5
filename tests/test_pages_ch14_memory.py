"""Chapter 14's figures: one point per policy, each named in the legend."""

import pytest

from conftest import SMALL_TRANSFORMER
from jaxloops.memory import step_bytes
from jaxloops.pages import ch14_memory as page
from jaxloops.pages.common import MiB


def test_each_remat_policy_is_one_point_named_in_the_legend(plt):
    rows = [
        {"policy": "no remat", "extra GFLOP per block": 0.0, "temp MiB": 24.5},
        {"policy": "names", "extra GFLOP per block": 0.035, "temp MiB": 4.9},
        {"policy": "nothing", "extra GFLOP per block": 0.040, "temp MiB": 4.6},
    ]
    fig = page.remat_tradeoff(rows)
    ax = fig.axes[0]
    points = {line.get_label(): (*line.get_xdata(), *line.get_ydata()) for line in ax.get_lines()}
    legend = [text.get_text() for text in ax.get_legend().get_texts()]
    plt.close(fig)
    assert points == {"no remat": (0.0, 24.5), "names": (0.035, 4.9), "nothing": (0.040, 4.6)}
    assert legend == ["no remat", "names", "nothing"]


def test_fits_budget_is_the_formula_at_the_budget():
    config = SMALL_TRANSFORMER
    need = sum(step_bytes(config, 6, 5))
    assert page.fits_budget(config, 5, need)(6) and not page.fits_budget(config, 5, need - 1)(6)
    # Two micro-batches of 3 hold less than one batch of 6 (a budget of M * B would not).
    halves = sum(step_bytes(config, 6, 5, micro=2))
    assert halves < need and page.fits_budget(config, 5, halves)(3, 2)
    assert not page.fits_budget(config, 5, halves)(6)


def fit_row(name, L, B, problems=()):
    """A row of `largest_fit_table`: (formula, compiled) answers for L and B."""
    return {
        "technique": name, "margin": 1.3,
        "formula L": L[0], "compiled L": L[1], "held / budget at L": 0.9, "compiles for L": 2,
        "formula B": B[0], "compiled B": B[1], "held / budget at B": 0.95, "compiles for B": 3,
        "problems at L": list(problems), "problems at B": [],
    }  # fmt: skip


def test_the_fit_table_states_compiled_over_formula_and_counts_compiles():
    rows = [fit_row("none", (4, 3), (10, 7)), fit_row("remat, dots saved", (0, 0), (5, 5))]
    shown = page.fit_table(rows)
    assert shown[0]["compiled / formula L"] == 0.75 and shown[0]["compiled / formula B"] == 0.7
    assert shown[1]["compiled / formula L"] is None  # no formula answer: no ratio
    assert shown[0]["compiles"] == 5 and shown[0]["held / budget at B"] == 0.95
    assert page.ratio_range(shown, "L") == (0.75, 0.75)  # the row without a ratio left out
    assert page.ratio_range(shown, "B") == (0.7, 1.0)


def test_search_failures_name_each_search_that_failed_and_only_those():
    rows = [fit_row("none", (4, 3), (10, 7)), fit_row("bf16", (7, 3), (20, 6), ["4 fits"])]
    assert page.search_failures(rows) == {"bf16, L": ["4 fits"]}
    assert page.search_failures(rows[:1]) == {}


def test_fit_numbers_are_the_named_techniques_answers_and_the_searches():
    rows = [
        fit_row(name, (n + 5, n + 4), (n + 11, n + 7))
        for n, name in enumerate(page.FIT_NAMES.values())
    ]
    rows[0]["compiles for B"] = 2  # this search's first prediction was right
    numbers = page.fit_numbers(rows)
    assert numbers["fit_none_L"] == 4 and numbers["fit_none_formula_B"] == 11
    assert numbers["fit_nothing_L"] == 5 and numbers["fit_bf16_B"] == len(rows) - 1 + 7
    assert numbers["searches"] == 2 * len(rows) and numbers["right_first"] == len(rows) + 1
    assert numbers["probes"] == 5 * len(rows) - 1
    assert numbers["fit_L_low"] == 4 / 5 and numbers["fit_B_high"] == (len(rows) + 6) / (
        len(rows) + 10
    )


def test_the_run_sentence_says_what_the_device_reported():
    run = {"before": None, "after": None}
    assert "memory_stats() is None" in page.run_memory_sentence(run, 2**20)
    before = {"bytes_in_use": 2 * MiB, "peak_bytes_in_use": 3 * MiB}
    raised = {**run, "before": before,
              "after": {"bytes_in_use": 5 * MiB, "peak_bytes_in_use": 12 * MiB}}  # fmt: skip
    said = page.run_memory_sentence(raised, 16 * MiB)
    assert "a peak of 12 MiB of arrays in use" in said and "2 MiB of them in use before" in said
    assert said.endswith("its peak, is 10 MiB, 0.62× the budget.") and "reserved" not in said
    kept = {**run, "before": {**before, "peak_bytes_in_use": 14 * MiB},
            "after": {"peak_bytes_in_use": 14 * MiB}}  # fmt: skip
    assert page.run_memory_sentence(kept, 16 * MiB).endswith("so its own is not shown.")


# The chip's record of 2026-12-07: a step that holds 8,066 MiB (compiled) against a budget of
# 8,192 MiB, its temporaries in the reserve, not in bytes_in_use
TPU_BEFORE = {"bytes_in_use": 1125 * MiB, "peak_bytes_in_use": 1125 * MiB,
              "bytes_reserved": 0, "peak_bytes_reserved": 0}  # fmt: skip
TPU_AFTER = {"bytes_in_use": 1573535232, "peak_bytes_in_use": 1573537792,
             "bytes_reserved": 8180040704, "peak_bytes_reserved": 8180040704}  # fmt: skip


def test_a_tpus_footprint_counts_the_reserve_that_bytes_in_use_leaves_out():
    seen = page.allocator_footprint(TPU_BEFORE, TPU_AFTER)
    held, budget = 8458024960, 8192 * MiB
    assert seen["counters"][-1] == "peak_bytes_reserved" and seen["reserved"] == 8180040704
    assert 0.98 < seen["footprint"] / held < 1.05 and 0.99 < seen["footprint"] / budget < 1.01
    # The old reading, the peak in use over the budget, is the known-wrong answer: 0.18
    assert TPU_AFTER["peak_bytes_in_use"] / budget < 0.2
    said = page.run_memory_sentence({"before": TPU_BEFORE, "after": TPU_AFTER}, budget)
    assert "7,801 MiB reserved (peak_bytes_reserved)" in said and "1.00× the budget" in said
    assert "0.18×" not in said
    # A reserve set before the run is not the run's: no footprint is claimed
    earlier = {**TPU_BEFORE, "peak_bytes_reserved": TPU_AFTER["peak_bytes_reserved"]}
    assert page.allocator_footprint(earlier, TPU_AFTER)["footprint"] is None
    numbers = page.run_numbers(
        {"loss": 4.6, "step_held": held, "before": TPU_BEFORE, "after": TPU_AFTER},
        {"held / budget at L": held / budget}, budget)  # fmt: skip
    assert 0.98 < numbers["run_footprint_over_held"] < 1.05


def test_run_numbers_are_the_runs_and_none_where_it_did_not_get_there():
    row = fit_row("none", (4, 3), (10, 7))  # held 0.9 of the budget at the compiled L
    run = {"loss": 5.0, "step_held": 9 * MiB, "before": None, "after": None}
    numbers = page.run_numbers(run, row, 10 * MiB)
    assert numbers["run_loss"] == 5.0 and numbers["run_held"] == 9.0
    assert numbers["run_over_search"] == 1.0 and "memory_stats() is None" in numbers["run_memory"]
    failed = page.run_numbers({**run, "loss": None, "step_held": None}, row, 10 * MiB)
    assert failed["run_loss"] is None and failed["run_held"] is None
    assert failed["run_over_search"] is None and failed["run_footprint_over_held"] is None


def test_loss_scaling_claims_tie_the_bound_to_the_gradients_float16_keeps():
    """The CPU's run (0.1 % of the gradients lost, scaled inside the bound) and the chip's of
    2026-12-07 (scaled 0.367, alone 1.06 against 0.0156), with most gradients lost, hold
    whatever the subnormal probes say; each known-wrong answer fails one claim."""
    bound = 16 * 2.0**-10
    cpu = {"scaled": 0.004, "alone": 0.6}
    chip = {"scaled": 0.367, "alone": 1.061}
    kept = {"made": True, "read": True, "matmul": True}
    read_flushed = {**kept, "read": False}
    assert all(page.loss_scaling_claims(cpu, bound, kept, 0.001).values())
    assert all(page.loss_scaling_claims(chip, bound, read_flushed, 0.9).values())
    assert all(page.loss_scaling_claims(chip, bound, kept, 0.9).values())  # probes: reported
    wrong = [
        (chip, 0.001),  # outside the bound though float16 kept the gradients
        (cpu, 0.9),  # inside though it lost most of them
        ({"scaled": 0.9, "alone": 0.8}, 0.9),  # scaling made it worse
        ({"scaled": 0.001, "alone": 0.01}, 0.001),  # float16 alone inside the bound
    ]
    for gaps, lost in wrong:
        assert not all(page.loss_scaling_claims(gaps, bound, kept, lost).values()), gaps
    claims = page.loss_scaling_claims(chip, bound, read_flushed, 0.9)
    claim = next(k for k in claims if "exactly where" in k)
    assert "read False" in claim and "90.0%" in claim and "at most 1.6%" in claim


def test_loss_scaling_sentence_says_what_the_backend_did():
    bound = 16 * 2.0**-10
    kept = {"made": True, "read": True, "matmul": True}
    sentence = page.loss_scaling_sentence(
        {"scaled": 0.004, "alone": 0.6}, bound, kept, 0.2, 0.001, 2.0**15
    )
    assert "stays within 0.40 %" in sentence and "1.6 %" in sentence and "60.0 %" in sentence
    assert "kept float16's subnormals in each probe" in sentence and "0.1 % of" in sentence
    assert sentence.startswith("Held at 2¹⁵ (its growth interval longer than the run), ")
    flushed = page.loss_scaling_sentence(
        {"scaled": 0.367, "alone": 1.061},
        bound,
        {**kept, "read": False, "matmul": False},
        0.42,
        0.9,
        2.0**12,
    )
    assert "flushes float16's subnormals" in flushed and "42 %" in flushed and "90.0 %" in flushed
    assert "2⁻¹⁵ read and doubled and 2⁻¹⁵ passed through a matmul, computed as 0" in flushed
    assert "half of 2⁻¹⁴" not in flushed and "elsewhere" not in flushed
    assert "36.7 %" in flushed and "106.1 %" in flushed
    assert "Held at 2¹², " in flushed and "2¹⁵" not in flushed  # the run's own start
    # Outside the bound with every probe kept: the page says it does not know where
    lost_elsewhere = page.loss_scaling_sentence(
        {"scaled": 0.367, "alone": 1.061}, bound, kept, 0.93, 0.9, 2.0**15
    )
    assert "outside the bound" in lost_elsewhere and "loses them elsewhere" in lost_elsewhere
    assert "stays within" not in lost_elsewhere


def test_a_power_of_two_is_written_with_superscripts_and_a_fraction_is_refused():
    assert page.power_of_two(15) == "2¹⁵" and page.power_of_two(-14.0) == "2⁻¹⁴"
    with pytest.raises(ValueError, match="15.5"):
        page.power_of_two(15.5)


def test_the_scale_rows_follow_the_run_and_refuse_a_missing_epoch():
    # From 2^40, 10 steps an epoch: 7 skipped (halved to 2^33), then 3 and 0 more
    hooks = [(1, {"scale": 2.0**33}), (2, {"scale": 2.0**31}), (3, {"scale": 2.0**32})]
    rows = page.scale_rows(hooks, [0.7, 0.3, 0.0], 2.0**40, 10)
    assert [r["step"] for r in rows] == [0, 10, 20, 30]
    assert [r["log2 scale"] for r in rows] == [40, 33, 31, 32]
    assert [r["skipped"] for r in rows] == [0, 7, 10, 10]
    with pytest.raises(ValueError, match="2 hook records for 3 epochs"):
        page.scale_rows(hooks[:2], [0.7, 0.3, 0.0], 2.0**40, 10)


def test_the_scale_plot_has_one_line_per_run_in_each_panel(plt):
    hooks = [(1, {"scale": 2.0**16}), (2, {"scale": 2.0**17})]
    rows = page.scale_rows(hooks, [0, 0.1], 2.0**15, 10)
    held = page.scale_rows([(1, {"scale": 2.0**15})], [0], 2.0**15, 10)
    fig = page.scale_plot({"grows": rows, "held": held})
    left, right = fig.axes
    assert [line.get_label() for line in left.get_lines()] == ["grows", "held"]
    assert list(left.get_lines()[0].get_ydata()) == [15, 16, 17]
    assert list(right.get_lines()[0].get_ydata()) == [0, 0, 1]


def test_the_growing_scale_sentence_says_inside_or_outside_and_refuses_a_scale_that_fell():
    bound = 16 * 2.0**-10
    inside = page.growing_scale_sentence({"worst": 0.001, "last": 0.0005}, bound, 2.0**15,
                                         2.0**25, 0)  # fmt: skip
    assert inside.startswith("From 2¹⁵ the scale rose to 2²⁵ by the last step, with 0 steps")
    assert "within 0.10 % of float32's at every epoch, inside the bound" in inside
    outside = page.growing_scale_sentence({"worst": 0.05, "last": 0.02}, bound, 2.0**15,
                                          2.0**36, 1)  # fmt: skip
    assert "1 step skipped" in outside and "ends 2.0 %" in outside and "5.0 % away" in outside
    assert "outside the bound of 16 float16 roundings (1.6 %)" in outside
    with pytest.raises(ValueError, match="did not rise"):
        page.growing_scale_sentence({"worst": 0.001, "last": 0.0}, bound, 2.0**15, 2.0**15, 3)
