import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from backend_marks import xla_cpu_only
from conftest import normal
from jaxloops import step_speed

TINY = (1, 8, 2, 1, 12, 5, 3)  # L, D, N, K, F, T, B


@pytest.fixture(scope="module")
def programs():
    return step_speed.step_programs(TINY, jax.random.key(0))


def test_bad_sizes_raise():
    with pytest.raises(ValueError, match=r"seven positive ints .* got \(1, 8, 2\)"):
        step_speed.step_programs((1, 8, 2), jax.random.key(0))
    with pytest.raises(ValueError, match="seven positive ints"):
        step_speed.step_programs((1, 8, 2, 1, 12, 0, 3), jax.random.key(0))


def test_rates_are_consistent_with_their_seconds(programs):
    row = step_speed.step_rates(programs, rounds=2)
    assert programs["tokens"] == 5 * 3
    assert row["tokens_per_s"] == pytest.approx(15 / row["seconds"]["step"])
    assert row["flops_per_s"] == pytest.approx(row["flops"] / row["seconds"]["step"])
    assert row["of_ceiling"] == pytest.approx(row["flops_per_s"] / row["ceiling"])
    ratio = row["seconds"]["gradient"] / row["seconds"]["forward"]
    assert row["gradient_over_forward"] == pytest.approx(ratio)


def test_the_breakdown_groups_every_matmul_of_the_step(programs):
    groups = step_speed.step_breakdown(programs, tries=1)
    L, D, N, K, F, T, B = TINY
    assert groups["matmul: MLP"]["flops"] == 3 * 2 * B * T * 2 * D * F * L
    assert all(g["predicted"] > 0 for g in groups.values() if g["bytes"])


def test_summary_adds_up_the_groups_and_names_the_furthest_above_its_prediction():
    groups = {
        "matmul: MLP": {"seconds": 3.0, "predicted": 2.5, "flops": 10.0},
        "attention": {"seconds": 2.0, "predicted": 0.5, "flops": 4.0},
        "norms": {"seconds": 1.0, "predicted": 0.9, "flops": 0.0},
    }
    told = step_speed.summary({}, groups)
    assert told["traced"] == 6.0 and told["predicted"] == pytest.approx(3.9)
    assert told["matmul_share"] == 0.5 and told["dot_flops"] == 14.0
    assert told["worst"] == "attention"  # 1.5 s above, not the largest time (matmul: MLP)
    assert (told["worst_traced"], told["worst_predicted"]) == (2.0, 0.5)


def test_the_textbook_control_computes_what_attention_computes():
    from jaxloops.attention import attention, attention_rounding_bound, textbook_attention

    # NumPy data, and the comparisons in NumPy: the only programs are the ones under test.
    query = normal((3, 7, 6, 5), 1)  # (B, T, N, H)
    key = normal((3, 7, 2, 5), 2)  # (B, S, K, H), G = 3
    value = normal((3, 7, 2, 5), 3)

    def grads(attend, causal=True):
        loss = lambda q, k, v: (attend(q, k, v, is_causal=causal) ** 2).sum()  # noqa: E731
        dq_dk_dv = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(query, key, value)
        return [np.asarray(g) for g in dq_dk_dv]

    out = np.asarray(attention(query, key, value, is_causal=True))
    bound = attention_rounding_bound(query, key, np.abs(value).max())
    error = float(np.abs(np.asarray(textbook_attention(query, key, value)) - out).max())
    assert error <= bound
    want, got = grads(attention), grads(textbook_attention)
    scale = max(float(np.abs(g).max()) for g in want)
    grad_bound = attention_rounding_bound(query, key, scale)
    assert max(float(np.abs(a - b).max()) for a, b in zip(want, got)) <= grad_bound
    # A known-wrong answer: the control without its causal mask is rejected by both bounds.
    wrong = np.asarray(textbook_attention(query, key, value, is_causal=False))
    assert float(np.abs(wrong - out).max()) > bound
    wrong_grads = grads(textbook_attention, causal=False)
    assert max(float(np.abs(a - b).max()) for a, b in zip(want, wrong_grads)) > grad_bound


def test_step_seconds_times_each_program_by_name(programs):
    seconds = step_speed.step_seconds({"a": programs, "b": programs}, rounds=1)
    assert set(seconds) == {"a", "b"} and all(s > 0 for s in seconds.values())


def test_against_control_states_the_speedup_and_the_predicted_saving():
    groups = {
        "attention": {"seconds": 2.0, "predicted": 0.5},
        "norms": {"seconds": 1.0, "predicted": 0.2},
    }
    control = {
        "attention": {"seconds": 5.0, "predicted": 1.5},
        "norms": {"seconds": 1.0, "predicted": 0.2},
    }
    told = step_speed.against_control({"attention": 4.0, "textbook": 6.0}, groups, control)
    assert told["speedup"] == 1.5 and told["saved"] == 2.0 and told["control_step"] == 6.0
    assert told["saved_predicted"] == pytest.approx(1.0)  # 1.7 - 0.7: control minus ours
    assert (told["attention_traced"], told["control_attention_traced"]) == (2.0, 5.0)


@xla_cpu_only("the step writes device memory, not fresh host pages (0 faults)")
def test_page_faults_count_the_fresh_pages_a_program_writes(programs):
    # A 64 MiB output is a block above glibc's mmap threshold: fresh 4 KiB pages every call,
    # one fault each (where a process gets huge pages only when it asks, and has not).
    with pytest.raises(ValueError, match="calls must be >= 1, got 0"):
        step_speed.page_faults(programs, calls=0)
    if step_speed.huge_pages_contrast() or "hugetlb=1" in os.environ.get("GLIBC_TUNABLES", ""):
        pytest.skip("this process may get huge pages without asking")
    big = jnp.zeros((16 * 2**20,), jnp.float32)
    pages = big.nbytes / 4096
    faults = step_speed.page_faults({"step": (jax.jit(lambda x: x + 1.0), (big,))}, calls=2)
    assert 0.5 * pages < faults < 2 * pages


def test_with_tunable_sets_one_glibc_tunable_and_keeps_the_others():
    name = step_speed.HUGE_PAGES
    assert step_speed.with_tunable("", name, "1") == f"{name}=1"
    assert step_speed.with_tunable(f"a.b=2:{name}=0", name, "1") == f"a.b=2:{name}=1"
    assert step_speed.with_tunable(f"{name}=1::x=3", name, "0") == f"x=3:{name}=0"
    with pytest.raises(ValueError, match="without ':' or '='"):
        step_speed.with_tunable("", name, "1:x=2")


def test_huge_pages_contrast_needs_glibc_2_35_and_madvise_mode(monkeypatch, tmp_path):
    thp = tmp_path / "enabled"
    monkeypatch.setattr(step_speed, "_THP", thp)
    monkeypatch.setattr(step_speed.platform, "libc_ver", lambda: ("glibc", "2.36"))
    thp.write_text("always [madvise] never\n")
    assert step_speed.huge_pages_contrast() is None
    thp.write_text("[always] madvise never\n")
    assert "not madvise" in step_speed.huge_pages_contrast()
    thp.unlink()
    assert "'absent'" in step_speed.huge_pages_contrast()
    monkeypatch.setattr(step_speed.platform, "libc_ver", lambda: ("glibc", "2.31"))
    assert "not glibc >= 2.35 (glibc 2.31)" in step_speed.huge_pages_contrast()
    monkeypatch.setattr(step_speed.platform, "libc_ver", lambda: ("", ""))
    assert "unknown" in step_speed.huge_pages_contrast()


def test_the_page_fault_findings_fail_each_claim_that_the_figures_contradict():
    temp = 4096 * 1000  # 1,000 pages of temporaries
    small = {"faults": 1000.0, "seconds": {"step": 0.010}, "of_ceiling": 0.3,
             "gradient_over_forward": 5.0}  # fmt: skip
    huge = {**small, "faults": 20.0, "seconds": {"step": 0.008}, "of_ceiling": 0.4}
    kept = {**small, "faults": 0.0, "seconds": {"step": 0.007}, "gradient_over_forward": 3.0}
    runs = {"4 KiB pages": small, "huge pages": huge, "memory kept": kept}
    failed, paragraph = step_speed.allocator_findings(1000.0, temp, runs)
    assert failed == [] and "1,000 times" in paragraph and "20 faults" in paragraph
    assert "20 faults and 0.0080 s (40%)" in paragraph  # reported, not claimed
    assert "allocator took 30% of the" in paragraph and "0 faults and 0.0070 s" in paragraph
    assert len(step_speed.allocator_findings(3000.0, temp, runs)[0]) == 1  # 3 per page
    slower = {**runs, "huge pages": {**huge, "seconds": {"step": 0.0105}}}
    assert step_speed.allocator_findings(1000.0, temp, slower)[0] == []  # time not claimed
    for kind, wrong in [
        ("huge pages", {"faults": 200.0}),  # only 5x fewer
        ("memory kept", {"faults": 1000.0}),  # as many: memory handed back
        ("memory kept", {"seconds": {"step": 0.0099}}),
        ("memory kept", {"gradient_over_forward": 5.2}),  # more than the default's 5.0
    ]:
        assert (
            len(
                step_speed.allocator_findings(
                    1000.0, temp, {**runs, kind: {**runs[kind], **wrong}}
                )[0]
            )
            == 1
        )


def test_the_goal_findings_fail_each_goal_the_figures_miss_on_two_free_cores():
    goal = {"of_ceiling": 0.6, "gradient_over_forward": 3.1, "ceiling": 2e11, "tokens_per_s": 7e3}
    failed, sentence = step_speed.goal_findings(goal, 1.97, 2)
    assert failed == [] and "60% of the 200 GFLOP/s" in sentence and "both goals met" in sentence
    for wrong in ({"of_ceiling": 0.44}, {"gradient_over_forward": 3.61}, {"of_ceiling": 1.1}):
        assert len(step_speed.goal_findings({**goal, **wrong}, 1.97, 2)[0]) == 1, wrong
    # One core busy (free_cores read 1.06 in a busy build): the goals are not checked, the
    # ceiling still is, and the sentence says why.
    failed, sentence = step_speed.goal_findings({**goal, "of_ceiling": 0.4}, 1.06, 2)
    assert failed == [] and "1.06 of 2 cores free" in sentence and "only that" in sentence
    assert len(step_speed.goal_findings({**goal, "of_ceiling": 1.1}, 1.06, 2)[0]) == 1
    assert step_speed.goal_findings({**goal, "of_ceiling": 0.4}, 7.9, 8)[0] == []  # not 2 cores


def test_an_unknown_allocator_is_refused_by_name():
    with pytest.raises(
        ValueError, match="allocator must be one of .*'4 KiB pages'.*got 'tcmalloc'"
    ):
        step_speed.rates_in_fresh_process((1,) * 7, 1, "tcmalloc")
