import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from backend_marks import xla_cpu_only
from conftest import normal
from jaxloops.measure import step_speed

TINY = (1, 8, 2, 1, 12, 5, 3)  # L, D, N, K, F, T, B


@pytest.fixture(scope="module")
def programs():
    return step_speed.step_programs(TINY, jax.random.key(0))


def test_bad_sizes_raise():
    with pytest.raises(ValueError, match=r"seven positive ints .* got \(1, 8, 2\)"):
        step_speed.step_programs((1, 8, 2), jax.random.key(0))
    with pytest.raises(ValueError, match="seven positive ints"):
        step_speed.step_programs((1, 8, 2, 1, 12, 0, 3), jax.random.key(0))
    with pytest.raises(ValueError, match=r"names must include 'step' .* got \('forward',\)"):
        step_speed.step_programs(TINY, jax.random.key(0), names=("forward",))


def test_rates_are_consistent_with_their_seconds(programs):
    row = step_speed.step_rates(programs, rounds=2)
    assert programs["tokens"] == 5 * 3
    assert row["tokens_per_s"] == pytest.approx(15 / row["seconds"]["step"])
    assert row["flops_per_s"] == pytest.approx(row["flops"] / row["seconds"]["step"])
    assert row["of_ceiling"] == pytest.approx(row["flops_per_s"] / row["ceiling"])
    ratio = row["seconds"]["gradient"] / row["seconds"]["forward"]
    assert row["gradient_over_forward"] == pytest.approx(ratio)


def test_the_bf16_step_computes_in_bfloat16_and_keeps_float32_weights(programs):
    """The policy changes the compiled program (bfloat16 matmuls), not the state: the step
    returns float32 parameters, and its loss is the float32 one's to bfloat16's rounding."""
    narrow = step_speed.step_programs(
        TINY, jax.random.key(0), compute=jnp.bfloat16, names=("step",)
    )
    assert set(narrow) == {"step", "tokens", "step_flops"}
    assert "bf16" in narrow["step"][0].as_text()  # (a TPU may also show bf16 in the float32 one)
    params, _, metrics = narrow["step"][0](*narrow["step"][1])
    assert {a.dtype for a in jax.tree.leaves(params)} == {jnp.dtype(jnp.float32)}
    wide_loss = programs["step"][0](*programs["step"][1])[2]["loss"]
    assert float(metrics["loss"]) == pytest.approx(float(wide_loss), rel=2**-6)
    row = step_speed.precision_rates(programs, narrow, rounds=3)
    assert row["speedup_low"] <= row["speedup"] <= row["speedup_high"]
    assert row["matmul_ratio"] > 0
    for kind in ("float32", "bfloat16"):
        rate = row["flops"][kind] / row["seconds"][kind]
        assert row["of_ceiling"][kind] == pytest.approx(rate / row["ceilings"][kind])


def test_the_breakdown_groups_every_matmul_of_the_step(programs):
    groups = step_speed.step_breakdown(programs, tries=1)
    L, D, N, K, F, T, B = TINY
    assert groups["matmul: MLP"]["flops"] == 3 * 2 * B * T * 2 * D * F * L
    assert all(g["predicted"] > 0 for g in groups.values() if g["bytes"])
    # The kernels' traced time: on an accelerator from the trace's "XLA Ops" line (reading only
    # its "XLA Modules" line left every group at 0 s on the chip); on a CPU from XLA's worker
    # threads, which JAX 0.12's CPU client no longer names (its trace has no kernels)
    cpu_without_kernels = jax.default_backend() == "cpu" and jax.__version_info__ >= (0, 12)
    if not cpu_without_kernels:
        assert groups["matmul: MLP"]["seconds"] > 0


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


def test_an_unknown_allocator_is_refused_by_name():
    with pytest.raises(
        ValueError, match="allocator must be one of .*'4 KiB pages'.*got 'tcmalloc'"
    ):
        step_speed.rates_in_fresh_process((1,) * 7, 1, "tcmalloc")


def test_the_remat_step_computes_the_same_loss_and_the_variants_are_timed_against_the_base(
    programs,
):
    remat = step_speed.step_programs(TINY, jax.random.key(0), names=("step",), remat="nothing")
    base_loss = programs["step"][0](*programs["step"][1])[2]["loss"]
    remat_loss = remat["step"][0](*remat["step"][1])[2]["loss"]
    assert float(remat_loss) == pytest.approx(float(base_loss), rel=1e-5)
    assert remat["step_flops"] > programs["step_flops"]  # the forward pass again
    ratios = step_speed.time_ratios(programs, {"remat": remat}, rounds=2)
    assert ratios["remat"]["low"] <= ratios["remat"]["ratio"] <= ratios["remat"]["high"]
    with pytest.raises(ValueError, match="unknown remat policy 'most'"):
        step_speed.step_programs(TINY, jax.random.key(0), names=("step",), remat="most")
    with pytest.raises(ValueError, match="'base' names"):
        step_speed.time_ratios(programs, {"base": remat}, rounds=1)


def test_allocator_runs_reads_every_kind_against_the_highest_ceiling(monkeypatch):
    """The processes raise the build's ceiling in turn; the median process of each kind is
    read against the highest one, so a faster step is never a smaller share of it."""
    ceilings = iter(range(100, 100 + 9 * 10, 10))  # each process sees a higher ceiling
    steps = {"4 KiB pages": [0.12, 0.11, 0.13], "huge pages": [0.09, 0.08, 0.10],
             "memory kept": [0.07, 0.08, 0.09]}  # fmt: skip
    calls = {name: iter(times) for name, times in steps.items()}

    def fake(sizes, rounds, allocator, env=None, breakdown=False):
        seconds = next(calls[allocator])
        ceiling = float(next(ceilings))
        return {"seconds": {"step": seconds}, "flops_per_s": 10.0 / seconds,
                "ceiling": ceiling, "of_ceiling": 10.0 / seconds / ceiling}  # fmt: skip

    monkeypatch.setattr(step_speed, "rates_in_fresh_process", fake)
    runs = step_speed.allocator_runs((1,) * 7, rounds=1)
    assert {r["ceiling"] for r in runs.values()} == {180.0}  # the ninth process's
    assert [runs[k]["seconds"]["step"] for k in steps] == [0.12, 0.09, 0.08]  # medians
    shares = [runs[k]["of_ceiling"] for k in steps]
    assert shares == sorted(shares) and shares[0] == pytest.approx(10.0 / 0.12 / 180.0)
    assert runs["huge pages"]["steps"] == [0.09, 0.08, 0.10]
