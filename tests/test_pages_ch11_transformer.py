"""Chapter 11's figures, plots and findings: each derived from known inputs, and each wrong
input rejected."""

import math

import numpy as np
import pytest

import jaxloops
from jaxloops.loop import History
from jaxloops.pages import ch11_transformer as page
from jaxloops.text import Corpus

PROBES = ("trained windows", "unseen train text", "validation")


def test_corpus_figures_count_the_split_and_the_unknown_characters():
    corpus = Corpus(
        train=np.array([5, 0, 5, 5, 0, 5, 5, 5]),
        validation=np.array([5, 5]),
        files=["a.py", "b.py", "c.py"],
        split_file="c.py",
        split_offset=7,
        python_version="3.11.9",
    )
    figures = page.corpus_figures(corpus, unknown_id=0)
    assert figures["modules"] == 3 and figures["last_file"] == "c.py"
    assert (figures["train_chars"], figures["val_chars"], figures["val_share"]) == (8, 2, 20.0)
    assert figures["unknown_share"] == 25.0  # 2 of 8, not of all 10 characters


def test_model_figures_name_the_config_s_sizes():
    sizes = jaxloops.experiment_sizes().lm
    config = jaxloops.TransformerConfig.from_sizes(sizes, 11)
    figures = page.model_figures(sizes, config, 1234)
    assert figures["layers"] == config.num_layers and figures["seq_len"] == config.max_len
    assert figures["group"] * config.num_kv_heads == config.num_heads
    assert figures["params"] == 1234


def test_probe_curves_put_the_loss_before_training_first():
    history = History(train={}, hooks=[(1, {"a": 2.0}), (2, {"a": 1.0})])
    epochs, curves = page.probe_curves(history, {"a": 3.0})
    assert list(epochs) == [0, 1, 2] and list(curves["a"]) == [3.0, 2.0, 1.0]


def test_training_figures_take_gaps_in_the_right_order():
    curves = {
        "trained windows": [4.0, 1.0],
        "unseen train text": [4.0, 1.5],
        "validation": [4.2, 1.2],
    }
    figures = page.training_figures(curves, 64)
    assert figures["seen_gap"] == 0.5 and figures["module_gap"] == pytest.approx(-0.3)
    assert figures["initial_loss"] == 4.2 and figures["val_bits"] == 1.2 / math.log(2)
    # Numbers only: no sentence chosen by the sign of a gap (no control stands behind one).
    assert not any(isinstance(value, str) for value in figures.values())


def test_compressed_bits_find_repetition_and_refuse_empty_text():
    assert (
        page.compressed_bits("ab" * 5000)
        < 0.1
        < page.compressed_bits("".join(chr(33 + (i * 7919) % 90) for i in range(10000)))
    )
    with pytest.raises(ValueError, match="empty"):
        page.compressed_bits("")


def test_map_figures_keep_symbol_and_local_apart():
    figures = page.map_figures({"symbol": (0.5, 0.25), "local": (0.3, 0.1)})
    assert figures["map_symbol_share"] == 50.0 and figures["map_symbol_lift"] == 2.0
    assert figures["map_local_chance"] == 10.0 and figures["map_local_lift"] == pytest.approx(3)


def test_decode_speed_figures_split_the_speedup():
    figures = page.decode_speed_figures(300.0, 100.0, 1e6, 5e6, batch=2)
    assert figures["speedup"] == 3.0 and figures["flops_ratio"] == 5.0
    assert figures["below_above"] == "below"
    assert "0.15 GFLOP/s and the recomputing one at 0.25" in figures["below_above_why"]
    assert "0.60" in figures["below_above_why"]  # 3 = 5 x 0.6
    assert page.decode_speed_figures(600.0, 100.0, 1e6, 5e6, 2)["below_above"] == "above"


def test_entropy_and_exercise_figures():
    assert page.entropy_bits([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]]) == 0.5
    figures = page.exercise_figures(math.log(64), 2 * math.log(2), 64, xz_bits=2.0)
    assert figures["ex_initial_ratio"] == pytest.approx(1.0)
    assert figures["ex_perplexity"] == pytest.approx(4.0) and figures["ex_ascii_ratio"] == 4.0
    assert figures["ex_xz_nats"] == 2 * math.log(2)


def test_plots_draw_each_curve_and_the_map():
    fig = page.training_curves(
        [3.0, 2.0],
        [0, 1, 2],
        {p: [4, 3, 2] for p in PROBES},
        steps_per_epoch=5,
        vocab_size=64,
        title="t",
    )
    assert len(fig.axes[0].get_lines()) == 1 + 3 + 1  # train, three probes, ln V
    assert list(fig.axes[0].get_lines()[1].get_xdata()) == [0, 5, 10]
    fig = page.attention_weights(np.tril(np.ones((3, 3))) / 3, "a b", title="t")
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["a", "␣", "b"]


def test_summary_adds_up_the_groups_and_names_the_furthest_above_its_prediction():
    groups = {
        "matmul: MLP": {"seconds": 3.0, "predicted": 2.5, "flops": 10.0},
        "attention": {"seconds": 2.0, "predicted": 0.5, "flops": 4.0},
        "norms": {"seconds": 1.0, "predicted": 0.9, "flops": 0.0},
    }
    told = page.summary({}, groups)
    assert told["traced"] == 6.0 and told["predicted"] == pytest.approx(3.9)
    assert told["matmul_share"] == 0.5 and told["dot_flops"] == 14.0
    assert told["worst"] == "attention"  # 1.5 s above, not the largest time (matmul: MLP)
    assert (told["worst_traced"], told["worst_predicted"]) == (2.0, 0.5)


def test_against_control_states_the_speedup_and_the_predicted_saving():
    groups = {
        "attention": {"seconds": 2.0, "predicted": 0.5},
        "norms": {"seconds": 1.0, "predicted": 0.2},
    }
    control = {
        "attention": {"seconds": 5.0, "predicted": 1.5},
        "norms": {"seconds": 1.0, "predicted": 0.2},
    }
    told = page.against_control({"attention": 4.0, "textbook": 6.0}, groups, control)
    assert told["speedup"] == 1.5 and told["saved"] == 2.0 and told["control_step"] == 6.0
    assert told["saved_predicted"] == pytest.approx(1.0)  # 1.7 - 0.7: control minus ours
    assert (told["attention_traced"], told["control_attention_traced"]) == (2.0, 5.0)


def test_the_page_fault_findings_fail_each_claim_that_the_figures_contradict():
    temp = 4096 * 1000  # 1,000 pages of temporaries
    small = {"faults": 1000.0, "seconds": {"step": 0.010}, "of_ceiling": 0.3,
             "gradient_over_forward": 5.0}  # fmt: skip
    huge = {**small, "faults": 20.0, "seconds": {"step": 0.008}, "of_ceiling": 0.4}
    kept = {**small, "faults": 0.0, "seconds": {"step": 0.007}, "gradient_over_forward": 3.0}
    runs = {"4 KiB pages": small, "huge pages": huge, "memory kept": kept}
    failed, paragraph = page.allocator_findings(1000.0, temp, runs)
    assert failed == [] and "1,000 times" in paragraph and "20 faults" in paragraph
    assert "20 faults and 0.0080 s (40%)" in paragraph  # reported, not claimed
    assert "0 faults and 0.0070 s (30%): 0.70 times the default's" in paragraph
    assert len(page.allocator_findings(3000.0, temp, runs)[0]) == 1  # 3 per page
    slower = {**runs, "huge pages": {**huge, "seconds": {"step": 0.0105}}}
    assert page.allocator_findings(1000.0, temp, slower)[0] == []  # time not claimed
    more = {**runs, "memory kept": {**kept, "gradient_over_forward": 5.2}}  # above 5.0
    assert page.allocator_findings(1000.0, temp, more)[0] == []  # reported, not claimed
    as_slow = {**runs, "memory kept": {**kept, "seconds": {"step": 0.0102}}}  # CI's 1.02
    assert page.allocator_findings(1000.0, temp, as_slow)[0] == []  # time not claimed
    for kind, wrong in [
        ("huge pages", {"faults": 200.0}),  # only 5x fewer
        ("memory kept", {"faults": 1000.0}),  # as many: memory handed back
    ]:
        assert (
            len(page.allocator_findings(1000.0, temp, {**runs, kind: {**runs[kind], **wrong}})[0])
            == 1
        )


def test_the_goal_findings_check_the_ceiling_and_state_each_goal_as_set():
    goal = {"of_ceiling": 0.6, "gradient_over_forward": 3.1, "ceiling": 2e11, "tokens_per_s": 7e3}
    failed, sentence = page.goal_findings(goal, "In a fresh process", "cpu")
    assert failed == [] and "60% of the 200 GFLOP/s" in sentence
    assert "The goal is ≥ 55 %; this build measured 60.0%: met." in sentence
    assert "The goal is ≤ 3.3; this build measured 3.100: met." in sentence
    # A missed goal is said, visibly, with the goal as set; it does not fail the build ...
    failed, sentence = page.goal_findings({**goal, "of_ceiling": 0.5}, "In process", "cpu")
    assert (
        failed == []
        and "The goal is ≥ 55 %; this build measured 50.0%: missed, by 5.0%." in sentence
    )
    _, sentence = page.goal_findings({**goal, "gradient_over_forward": 3.4}, "In process", "cpu")
    assert "measured 3.400: missed, by 0.100" in sentence
    # ... while a step above its ceiling (a known-wrong ceiling) does, on every backend.
    for backend in ("cpu", "tpu"):
        assert len(page.goal_findings({**goal, "of_ceiling": 1.1}, "Here", backend)[0]) == 1
    assert "not applicable here" in page.goal_findings(goal, "Here", "tpu")[1]


def test_the_bf16_prediction_scales_matmul_time_by_the_ceilings_and_the_rest_by_bytes():
    """Half the time in matmuls at equal ceilings, the other kernels moving half the bytes:
    the step takes 0.75 of its time, a speed-up of 4/3; a known-wrong bytes ratio (the
    float32 program against itself) predicts 1 and falls outside rounds of 1.25 to 1.45."""
    from jaxloops.measure.breakdown import Kernel

    kernel = lambda flops, size: Kernel("k", "fusion", "", (), "", flops, size)
    wide = [kernel(1e9, 100.0), kernel(0.0, 400.0), kernel(0.0, 400.0)]
    narrow = [kernel(1e9, 50.0), kernel(0.0, 200.0), kernel(0.0, 200.0)]
    # best samples twice as fast in bfloat16, paired rounds equal: the paired ratio counts
    rates = {"ceilings": {"float32": 2e12, "bfloat16": 4e12}, "matmul_ratio": 1.0, "speedup": 1.3,
             "speedup_low": 1.25, "speedup_high": 1.45,
             "of_ceiling": {"float32": 0.4, "bfloat16": 0.5},
             "tokens_per_s": {"float32": 1.0, "bfloat16": 1.3}}  # fmt: skip
    right = page.precision_prediction(0.5, rates, wide, narrow)
    assert right["bytes_ratio"] == 0.5 and right["speedup_predicted"] == pytest.approx(4 / 3)
    assert page.no_faster_than_predicted(right, 0.1)
    # A prediction short of what every round gained: 1.25 > 1.0 x 1.1
    wrong = page.precision_prediction(0.5, rates, wide, wide)
    assert wrong["speedup_predicted"] == 1.0 and not page.no_faster_than_predicted(wrong, 0.1)
    # The chip's run (0ebc9d1): a gain predicted and none measured is a miss the page shows,
    # not a failed claim
    chip = {"speedup_predicted": 1.10, "speedup_low": 0.974, "speedup_high": 0.988}
    assert page.no_faster_than_predicted(chip, 0.1)
    with pytest.raises(ValueError, match="matmul_share must be in"):
        page.precision_prediction(1.5, rates, wide, narrow)


def test_the_time_to_the_stated_loss_is_the_first_hook_at_or_below_it():
    seconds, losses = [0.0, 3.0, 5.0, 7.0], np.array([4.5, 2.6, 2.25, 2.0])  # as the page has them
    hit = page.time_to_loss(seconds, losses, steps_per_epoch=50, target=2.25)
    assert hit == {"reached": True, "steps": 100, "seconds": 5.0, "loss": 2.25}
    missed = page.time_to_loss(seconds, losses, steps_per_epoch=50, target=1.5)
    assert missed == {"reached": False, "steps": 150, "seconds": 7.0, "loss": 2.0}
    with pytest.raises(ValueError, match="one time per loss"):
        page.time_to_loss(seconds[:2], losses, steps_per_epoch=50)


def test_a_variant_is_predicted_from_its_matmul_flops_and_its_other_bytes():
    """A variant with 4/3 the matmul FLOPs and 1.5 times the other bytes, the matmuls half the
    time: 0.5 * 4/3 + 0.5 * 1.5 = 17/12; the base against itself predicts 1.0. The page shows
    the predictions beside the measured ratios and does not assert them."""
    from jaxloops.measure.breakdown import Kernel

    kernel = lambda flops, size: Kernel("k", "fusion", "", (), "", flops, size)
    base = [kernel(3e9, 10.0), kernel(0.0, 200.0)]
    remat = [kernel(3e9, 10.0), kernel(1e9, 5.0), kernel(0.0, 300.0)]
    measured = {"remat": {"ratio": 1.4, "low": 1.35, "high": 1.5, "tokens": 1.0}}
    (row,) = page.variant_rows(0.5, base, {"remat": remat}, measured)
    assert row["FLOPs ratio"] == pytest.approx(4 / 3) and row["other bytes ratio"] == 1.5
    assert row["predicted time ratio"] == pytest.approx(17 / 12)
    assert row["tokens/s ratio"] == pytest.approx(1 / 1.4)
    assert page.kernel_prediction(0.5, base, base)["time_ratio"] == 1.0
    with pytest.raises(ValueError, match="matmul_share must be in"):
        page.kernel_prediction(-0.1, base, remat)


def test_precision_groups_puts_the_two_breakdowns_side_by_side():
    group = lambda s, b: {"seconds": s, "bytes": b, "flops": 0.0, "predicted": 0.0, "kernels": 1}
    wide = {"matmul: MLP": group(0.010, 8e6), "norms": group(0.002, 4e6), "loss": group(0.0, 1e6)}
    narrow = {
        "norms": group(0.003, 2e6),
        "matmul: MLP": group(0.009, 4e6),
        "casts": group(1e-3, 6e6),
    }
    rows = page.precision_groups(wide, narrow)
    assert [r["group"] for r in rows] == ["matmul: MLP", "norms", "loss", "casts"]
    mlp, norms, loss, casts = rows
    assert mlp["float32 ms"] == pytest.approx(10.0) and mlp["bfloat16 ms"] == pytest.approx(9.0)
    assert mlp["time, bf16 / f32"] == pytest.approx(0.9) and mlp["bfloat16 MB"] == 4.0
    assert norms["time, bf16 / f32"] == pytest.approx(1.5)  # a group bfloat16 made slower
    assert loss["bfloat16 ms"] == 0.0 and loss["time, bf16 / f32"] is None
    assert casts["float32 ms"] == 0.0 and casts["time, bf16 / f32"] is None  # bf16's alone


def test_the_blockwise_bound_is_the_controls_gap_amplified_and_rejects_a_wrong_attention():
    # The CPU: the control's gap is below one rounding of a 3-nat loss; blockwise's 2.4e-7 passes
    cpu = page.same_training_bound(control_gap=1e-8, loss=3.0)
    assert cpu == pytest.approx(10 * 3.0 * np.finfo(np.float32).eps) and 2.4e-7 <= cpu
    # The TPU v5e: training amplified rounding to 5.4e-3 nats; a control of the same order passes
    assert 5.4e-3 <= page.same_training_bound(control_gap=2e-3, loss=2.9)
    # ... a curve 0.2 nats away (a different function, not its rounding) does not
    assert not 0.2 <= page.same_training_bound(control_gap=5.4e-3, loss=2.9)
    # ... nor does a rounding-sized gap with no amplification measured to excuse it
    assert not 1e-4 <= page.same_training_bound(control_gap=0.0, loss=2.9)
    with pytest.raises(ValueError, match="control_gap -1"):
        page.same_training_bound(control_gap=-1.0, loss=2.9)
