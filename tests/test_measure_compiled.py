import functools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxloops
from jaxloops import measure
from jaxloops.measure import compiled


def test_compiled_flops_of_a_matmul_is_2mnk():
    m, k, n = 7, 11, 13
    a, b = np.ones((m, k), np.float32), np.ones((k, n), np.float32)  # NumPy: no compile
    flops = measure.compiled_flops(jnp.matmul, a, b)
    assert flops == pytest.approx(2 * m * n * k, rel=0.01)


def test_compiled_costs_count_the_two_matmuls_of_naive_attention():
    query, key_, value = measure.random_qkv(
        jax.random.key(0), batch=1, length=32, heads=3, head_dim=8
    )
    costs = measure.compiled_costs(jaxloops.attention, query, key_, value)
    matmuls = 4 * 1 * 3 * 32 * 32 * 8  # 2 FLOPs per multiply-add, two products of T x S x H
    assert matmuls <= costs["flops"] <= 1.5 * matmuls
    assert costs["temp_bytes"] >= 3 * 32 * 32 * 4  # one float32 (B, N, T, S) array at least
    assert costs["bytes_accessed"] >= 3 * query.nbytes  # reads Q, K, V at least once
    assert costs["transcendentals"] >= 3 * 32 * 32  # one exponential per score


def test_a_jitted_function_is_compiled_as_it_is():
    double = jax.jit(lambda x: 2 * x)
    program = compiled.compile_call(double, np.ones(5, np.float32))
    assert isinstance(program, jax.stages.Compiled)
    assert compiled.costs_of(program)["flops"] == pytest.approx(5, abs=1)


def test_compiled_fusions_find_the_exponentials_and_the_loop_body():
    query, key_, value = measure.random_qkv(
        jax.random.key(0), batch=1, length=24, heads=3, head_dim=8
    )
    naive = measure.compiled_fusions(jaxloops.attention, query, key_, value)
    assert any("exponential" in f["ops"] for f in naive)
    assert all(f["runs"] == "once" for f in naive)  # no loop in naive attention
    blockwise = measure.compiled_fusions(
        functools.partial(jaxloops.blockwise_attention, block_size=8, parallel_blocks=1),
        query,
        key_,
        value,
    )
    in_loop = [f for f in blockwise if f["runs"] == "loop"]
    assert any("exponential" in f["ops"] for f in in_loop)  # the softmax runs once per tile


def test_fusion_rows_carry_their_dims_and_elements():
    hlo = (
        "ENTRY %main (p: f32[3,5]) -> f32[3,5] {\n"
        "  %p = f32[3,5]{1,0} parameter(0)\n"
        "  ROOT %f = f32[3,5]{1,0} fusion(%p), kind=kLoop, calls=%fused\n"
        "}\n"
    )
    (row,) = compiled.fusions_of(hlo)
    assert row["shape"] == "f32[3,5]" and row["dims"] == (3, 5) and row["elements"] == 15
    assert row["runs"] == "once" and row["kind"] == "kLoop"


def test_collectives_parse_tuple_and_single_results():
    hlo = (
        "%a = (f32[3,5]{1,0}, f32[]) all-reduce(%x, %y), channel_id=1\n"
        "%b = bf16[7]{0} all-gather(%z), dimensions={0}\n"
        "%c = f32[11]{0} add(%p, %q)\n"
    )
    assert measure.collectives(hlo) == {"all-reduce": (1, 64), "all-gather": (1, 14)}


def test_collectives_step_over_a_tpus_tiled_layouts():
    # A TPU prints each shape's tiles ("T(256)") inside its layout: parentheses in a tuple.
    hlo = (
        "%a = (f32[3,5]{1,0:T(4,128)}, f32[]{:T(256)}) all-reduce(%x, %y), channel_id=1\n"
        "%b = bf16[7]{0:T(512)(128)(2,1)S(1)} all-gather(%z), dimensions={0}\n"
    )
    assert measure.collectives(hlo) == {"all-reduce": (1, 64), "all-gather": (1, 14)}


# Programs as a TPU v5e compiled them (JAX 0.10.2, tests/tpu_probe.py): `(sin(a) * 2 + 1) @ b`
# for a (3, 5) and b (5, 7), and naive and blockwise attention (B 1, T = S = 24, N 3, H 8;
# blocks of 8). Their shapes carry
# tiled layouts, their matmuls are convolutions, and their fusions may return tuples.
TPU_TEXTS = pathlib.Path(__file__).with_name("data") / "tpu_v5e"


def tpu_text(name: str) -> str:
    return (TPU_TEXTS / f"{name}.hlo").read_text()


def test_entry_instructions_read_shapes_without_their_tiled_layouts():
    found = compiled.entry_instructions(tpu_text("sin_then_matmul"))
    assert ("fusion", "fusion", "f32[3,7]") in found  # the product's output
    assert [op for _, op, _ in found].count("parameter") == 2
    (row,) = [
        r for r in compiled.fusions_of(tpu_text("sin_then_matmul")) if r["fusion"] == "fusion"
    ]
    assert row["shape"] == "f32[3,7]" and row["dims"] == (3, 7) and row["kind"] == "kOutput"


def test_entry_instructions_read_results_that_are_tuples():
    found = compiled.entry_instructions(tpu_text("naive_attention"))
    # The fusion that writes the row sums and the weights: a kernel a TPU runs, not bookkeeping.
    assert ("fusion.22", "fusion", "(f32[3,24], bf16[3,24,24])") in found
    assert [op for _, op, _ in found].count("copy-start") == 2  # each ends in a copy-done
    # A TPU's slice-start holds a tuple inside its tuple, and layouts with parentheses.
    hlo = (
        "ENTRY %main (p: f32[64,64]) -> f32[16,64] {\n"
        "  %p = f32[64,64]{1,0:T(8,128)} parameter(0)\n"
        "  %s = ((f32[64,64]{1,0:T(8,128)}), f32[16,64]{1,0:T(8,128)S(1)}, s32[]{:S(2)}) "
        "slice-start(%p), slice={[0:16], [0:64]}\n"
        "  ROOT %d = f32[16,64]{1,0:T(8,128)S(1)} slice-done(%s)\n"
        "}\n"
    )
    assert compiled.entry_instructions(hlo) == [
        ("p", "parameter", "f32[64,64]"),
        ("s", "slice-start", "((f32[64,64]), f32[16,64], s32[])"),
        ("d", "slice-done", "f32[16,64]"),
    ]


def test_a_fusion_that_returns_a_tuple_is_read_and_a_nested_one_runs_where_its_caller_runs():
    rows = compiled.fusions_of(tpu_text("naive_attention"))
    (exponentials,) = [r for r in rows if "exponential" in r["ops"]]
    assert exponentials["shape"] == "(f32[3,24], bf16[3,24,24])" and exponentials["elements"] == 0
    assert {r["runs"] for r in rows} == {"once"}  # fusions inside fusions, no loop
    blockwise = compiled.fusions_of(tpu_text("blockwise_attention"))  # blocks of 8, T = 24
    assert any("exponential" in r["ops"] for r in blockwise if r["runs"] == "loop")


def test_loop_copies_count_only_copies_of_the_given_size_inside_a_loop_body():
    hlo = (
        "%body (c: f32[7,3]) -> f32[7,3] {\n"
        "  %c = f32[7,3]{1,0} parameter(0)\n"
        "  ROOT %k = f32[7,3]{0,1} copy(%c)\n"
        "}\n"
        "ENTRY %main (x: f32[7,3]) -> f32[7,3] {\n"
        "  %x = f32[7,3]{1,0} parameter(0)\n"
        "  %y = f32[7,3]{0,1} copy(%x)\n"
        "  ROOT %w = f32[7,3]{1,0} while(%y), condition=%cond, body=%body\n"
        "}\n"
    )
    assert measure.loop_copies(hlo, 21) == 1  # the entry's copy runs once: not counted
    assert measure.loop_copies(hlo, 22) == 0
    with pytest.raises(ValueError, match="elements must be >= 1, got 0"):
        measure.loop_copies(hlo, 0)


def test_calls_target_finds_a_custom_call_by_name():
    hlo = '%r = f32[2]{0} custom-call(%a), custom_call_target="__cudnn$fmhaSoftmax"\n'
    assert compiled.calls_target(hlo, "__cudnn$fmha")
    assert not compiled.calls_target(hlo, "__cublas$gemm")


def test_entry_instructions_lists_the_top_level_kernels_of_a_program():
    f = jax.jit(lambda a, b: (jnp.sin(a) * 2 + 1) @ b)
    hlo = f.lower(np.ones((3, 5), np.float32), np.ones((5, 7), np.float32)).compile().as_text()
    found = compiled.entry_instructions(hlo)
    ops = [op for _, op, _ in found]
    assert ops.count("parameter") == 2
    assert "f32[3,7]" in {shape for _, _, shape in found}  # the product's output
    assert "sine" not in ops  # the element-wise chain ran inside a fusion, not on its own
    with pytest.raises(ValueError, match="no ENTRY computation"):
        compiled.entry_instructions("HloModule m")


class _NoMatmulCount:
    """A compiled program whose cost analysis misses its matmuls, as XLA:GPU's does for the
    ones it hands to cuBLAS (jax-ml/jax#22249): the known-wrong count a FLOP figure must not use."""

    def __init__(self, compiled):
        self.compiled = compiled

    def cost_analysis(self):
        return {**compiled._cost(self.compiled), "flops": 1.0}

    def memory_analysis(self):
        return self.compiled.memory_analysis()


class _LoweredCount:
    """A lowered program whose cost analysis counts `flops`, or (None) is empty, as a TPU's."""

    def __init__(self, flops):
        self.flops = flops

    def cost_analysis(self):
        return {} if self.flops is None else {"flops": self.flops}


def test_flops_come_from_the_lowered_program_not_the_compiled_count():
    m, k, n = 64, 32, 16
    lowered = jax.jit(jnp.matmul).lower(np.ones((m, k), np.float32), np.ones((k, n), np.float32))
    undercounting = _NoMatmulCount(lowered.compile())
    assert compiled.costs_of(undercounting)["flops"] == 1.0  # the wrong count, if asked alone
    right = _LoweredCount(2.0 * m * n * k)  # what a CPU's or a GPU's lowered program counts
    assert compiled.costs_of(undercounting, right)["flops"] == 2 * m * n * k
    # A backend that counts no lowered program (a TPU) leaves only the compiled count.
    assert compiled.costs_of(undercounting, _LoweredCount(None))["flops"] == 1.0
    # The real program's count, however this backend gives it, is the product's.
    assert compiled.lowered_flops(lowered) == 2 * m * n * k


def test_the_step_flops_are_its_matmuls_and_the_two_counts_agree_where_both_exist():
    """The module docstring's "within 0.5 %", on the MLP train step, where the backend counts
    the lowered program (a CPU); on every backend, the count used is the step's matmuls and a
    few % of element-wise work."""
    # Only lowered and compiled, never run: shapes lower the same program as values, without
    # compiling the initialiser, the sampler and the optimizer state's zeros first.
    params = jax.eval_shape(
        lambda key: jaxloops.init_mlp(key, (64, 128, 128, 10)), jax.random.key(0)
    )
    optimizer = jaxloops.make_optimizer(3e-3, 1e-2)
    step = jax.jit(jaxloops.make_train_step(jaxloops.mlp_loss, optimizer))
    batch = jaxloops.Batch(
        jax.ShapeDtypeStruct((256, 64), jnp.float32), jax.ShapeDtypeStruct((256,), jnp.int32)
    )
    lowered = step.lower(params, jax.eval_shape(optimizer.init, params), batch)
    program = lowered.compile()
    # Forward 2 FLOPs per weight per example; backward twice that, less the first layer's
    # input gradient, which nothing needs.
    weights = 64 * 128 + 128 * 128 + 128 * 10
    matmuls = 3 * 2 * 256 * weights - 2 * 256 * 64 * 128
    assert matmuls <= compiled.lowered_flops(lowered, program) <= 1.05 * matmuls
    low, high = compiled._cost(lowered).get("flops"), compiled._cost(program)["flops"]
    if low:  # a backend that counts lowered programs (a TPU does not: compiled.py)
        assert abs(low / high - 1) < 0.005
