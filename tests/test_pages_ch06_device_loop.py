"""Chapter 6's page: the fetch experiment's figures, its taking-turns check, and what the
matmul ceiling is called on each backend."""

import pytest

from jaxloops.pages import ch06_device_loop as page
from jaxloops.pages import render

STEPS, K = 10, 3


def rounds(h, d, d_f, slow=(1.0, 1.0, 1.0, 1.0, 1.0), every=None):
    """Samples of the seven runs, seconds per call of STEPS steps, one per round; each round
    slows every run by its factor in `slow` (a busy stretch of a shared machine)."""
    overlapped = max(h, d)
    per_step = {
        page.EVERY: h + d_f if every is None else every,
        page.every_k(K): overlapped + (h + d_f - overlapped) / K,
        page.NEVER: overlapped,
        page.SCAN: 0.9 * d,
        page.FED_FETCH: d_f,
        page.FED: d,
        page.HOST: h,
    }
    return {name: [STEPS * t * f for f in slow] for name, t in per_step.items()}


def test_fetch_figures_take_each_ratio_within_rounds_and_predict_from_the_parts():
    h, d, d_f = 0.004, 0.004, 0.005  # seconds per step
    samples = rounds(h, d, d_f, slow=(1.0, 3.0, 1.0, 2.0, 1.0))
    figures = page.fetch_figures(samples, STEPS, K, (1.0, 1.0), dispatch=0.0)
    assert figures.h == pytest.approx(h) and figures.d_f == pytest.approx(d_f)
    # Taking turns: every step is h + d_f; never fetching, with a core for each, max(h, d).
    assert figures.predicted[page.EVERY] == pytest.approx(h + d_f)
    assert figures.predicted[page.NEVER] == pytest.approx(max(h, d))
    got, want = figures.ratios["every_over_never"]
    assert got == pytest.approx((h + d_f) / max(h, d)) and want == pytest.approx(got)
    assert figures.turns == pytest.approx(1.0)
    glued = figures.glued()
    assert glued["fetch_ms"] == pytest.approx(1.0) and glued["k_way"] == pytest.approx(1 / K)
    assert glued["fed_over_scan"] == pytest.approx(1 / 0.9)
    # With no core free (shares that add up to 1), queuing saves nothing: h + c + d.
    busy = page.fetch_figures(samples, STEPS, K, (0.5, 0.5), dispatch=0.001)
    assert busy.predicted[page.NEVER] == pytest.approx(h + 0.001 + d)
    with pytest.raises(ValueError, match="scan, data on device"):
        page.fetch_figures({k: v for k, v in samples.items() if k != page.SCAN}, STEPS, K,
                           (1.0, 1.0), 0.0)  # fmt: skip


def test_turns_ratio_divides_out_a_slow_round_but_not_a_slow_driver():
    h, d_f = 0.004, 0.005
    # Round 2 slows all three runs, and the pair divides it out; rounds 1 and 4 slow only the
    # every-step run (a neighbour's burst), two rounds of five that the median passes over.
    # The ratio of the medians would read 1.6: every's median lands on a slow round, h's and
    # d_f's on quick ones.
    slow = rounds(h, 0.004, d_f, slow=(1.0, 1.6, 1.0, 1.6, 1.0))
    slow[page.EVERY] = [STEPS * (h + d_f) * f for f in (1.6, 1.6, 1.0, 1.6, 1.0)]
    slow[page.HOST] = [STEPS * h * f for f in (1.0, 1.6, 1.0, 1.0, 1.0)]
    slow[page.FED_FETCH] = [STEPS * d_f * f for f in (1.0, 1.6, 1.0, 1.0, 1.0)]
    assert page.turns_ratio(slow) == pytest.approx(1.0)
    # A step that really takes half again as long is not divided out.
    wrong = rounds(h, 0.004, d_f, slow=(1.0, 1.6, 1.0, 1.6, 1.0), every=1.5 * (h + d_f))
    assert page.turns_ratio(wrong) == pytest.approx(1.5)


def test_turns_check_rejects_a_step_that_overlapped_or_took_far_longer():
    h, d, d_f = 0.004, 0.004, 0.0045
    take = lambda every, cores: page.turns_check(
        page.fetch_figures(rounds(h, d, d_f, every=every), STEPS, K, (1.0, 1.0), 0.0), cores, 0.4
    )
    failed, sentence = take(h + d_f, 2.0)
    assert failed == [] and sentence.startswith("if a step took above 1.4 × (h + d_f) or below")
    # Overlapped where fetching every step should take turns: nearer max(h, d) than h + d_f.
    assert take(max(h, d), 2.0)[0][0].startswith("a step overlapped")
    # Half again as long as h + d_f with two cores free is rejected; with one, not checked.
    assert take(1.5 * (h + d_f), 2.0)[0][0].startswith("a step took 1.50x h + d_f > 1.4")
    failed, sentence = take(1.5 * (h + d_f), 1.0)
    assert failed == [] and "only on a build with two cores free" in sentence


def test_over_host_is_each_fed_driver_over_the_host_work_in_its_round():
    h, d, d_f = 0.004, 0.002, 0.003
    ratios = page.over_host(rounds(h, d, d_f, slow=(1.0, 2.0, 1.0)), K)
    assert ratios == pytest.approx([(h + d_f) / h, (h + (h + d_f - h) / K) / h, 1.0])


def test_ceiling_label_says_what_the_matmul_computed_on_each_backend():
    assert page.ceiling_label("tpu", "default") == (
        "float32 matmul at default precision (one bfloat16 pass on a TPU)"
    )
    assert (
        page.ceiling_label("cpu", "highest")
        == "float32 matmul at highest precision (float32 on a CPU)"
    )
    assert page.ceiling_label("gpu", "fastest") == page.ceiling_label("gpu", "default")
    assert "TF32" in page.ceiling_label("gpu", "default")
    with pytest.raises(ValueError, match="'mps'"):
        page.ceiling_label("mps", "default")
    with pytest.raises(ValueError, match="'tf16'"):
        page.ceiling_label("tpu", "tf16")


def test_label_ceiling_renames_the_dashed_line_of_draw_throughput(plt):
    sweeps = {"narrow": [{"batch_size": b, "examples_per_s": 1.0 * b, "flops_per_s": 2.0 * b}
                         for b in (8, 32)]}  # fmt: skip
    fig, (left, right) = plt.subplots(1, 2)
    render.draw_throughput(left, right, sweeps, ceiling=128.0)
    page.label_ceiling(right, "float32 matmul at default precision (one bfloat16 pass on a TPU)")
    labels = [text.get_text() for text in right.get_legend().get_texts()]
    with pytest.raises(ValueError, match="found 0"):
        page.label_ceiling(left, "anything")  # the examples/s axis has no ceiling line
    plt.close(fig)
    assert labels == ["narrow", "float32 matmul at default precision (one bfloat16 pass on a TPU)"]
