"""Chapter 9's verdicts on its causal speedups: each goal met or missed as the figures say."""

import pytest

from jaxloops.pages import ch09_causal as page


def test_the_causal_claim_holds_in_the_worst_round_from_t_2048_on_every_machine():
    lowest = {1024: 0.97, 2048: 1.31, 4096: 1.42}  # T = 1024 (unrolled) is not claimed
    failed, sentence, checked = page.causal_claim(lowest)
    assert failed == [] and checked == [2048, 4096]
    assert "every paired round at every T ≥ 2048" in sentence and "1.31 at T = 2048" in sentence
    # Known-wrong: one round in which causal was no faster fails the page, wherever it runs.
    for wrong in ({2048: 1.0}, {4096: 0.95}):
        failed, _, _ = page.causal_claim({**lowest, **wrong})
        assert len(failed) == 1 and "lowest ratio" in failed[0]
    with pytest.raises(ValueError, match="no causal speedup"):
        page.causal_claim({})
    with pytest.raises(ValueError, match="no causal speedup at T >= 2048"):
        page.causal_claim({1024: 1.5})


def test_the_unroll_control_fails_a_slower_unrolled_call_only_on_two_free_cores():
    ratio = {"causal": 1.53, "causal, unroll=False": 0.93, "full, unroll=True": 0.63}
    failed, clause = page.unroll_findings(ratio, 1.98, 2, "cpu")
    assert failed == [] and clause.startswith("1.65 times as fast as walked, faster")
    slower = {**ratio, "causal, unroll=False": 1.6}  # walked faster than unrolled
    assert len(page.unroll_findings(slower, 1.98, 2, "cpu")[0]) == 1
    failed, clause = page.unroll_findings(slower, 1.06, 2, "cpu")
    assert failed == [] and "found 1.06 of 2 cores free" in clause
    faster_full = {**ratio, "full, unroll=True": 1.1}  # full attention gaining from unrolling
    assert len(page.unroll_findings(faster_full, 1.06, 2, "cpu")[0]) == 1
    assert "runs on a gpu" in page.unroll_findings(ratio, 2.0, 2, "gpu")[1]
