"""Chapter 9's verdicts on its causal speedups: each goal met or missed as the figures say."""

import pytest

from jaxloops.pages import ch09_causal as page


def test_the_causal_claim_needs_the_rules_wins_from_t_2048_on_every_machine():
    wins = {1024: (6, 15), 2048: (13, 15), 4096: (15, 15)}  # T = 1024 (unrolled) is not claimed
    failed, sentence, checked = page.causal_claim(wins)
    assert failed == [] and checked == [2048, 4096]
    assert "13 of 15 at T = 2048, 13 needed" in sentence
    # Known-wrong: a causal call that wins only 12 of 15 rounds (a coin does so 1.8 % of the
    # time) fails the page, wherever it runs; so does one that lost most rounds.
    for wrong in ({2048: (12, 15)}, {4096: (4, 15)}):
        failed, _, _ = page.causal_claim({**wins, **wrong})
        assert len(failed) == 1 and "needs 13" in failed[0]
    with pytest.raises(ValueError, match="no causal speedup"):
        page.causal_claim({})
    with pytest.raises(ValueError, match="no causal speedup at T >= 2048"):
        page.causal_claim({1024: (15, 15)})
    with pytest.raises(ValueError, match="5 paired rounds cannot show"):
        page.causal_claim({2048: (5, 5)})


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
