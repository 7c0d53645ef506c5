import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import normal
from jaxloops import measure

ON_GPU = jax.default_backend() == "gpu"


def bf16_qkv(length=16, heads=4, head_dim=64):
    return normal((3, 1, length, heads, head_dim), 0, jnp.bfloat16)


def test_unknown_implementation_raises():
    with pytest.raises(ValueError, match="unknown implementation 'flash'"):
        measure.attention_fn("flash")


def test_attention_fn_is_cached_so_jit_reuses_compiles():
    first = measure.attention_fn("xla", is_causal=True)
    assert measure.attention_fn("xla", is_causal=True, block_size=7) is first


def test_cudnn_request_reports_what_happened():
    query, key, value = bf16_qkv()
    output, record = measure.run_attention("cudnn", query, key, value)
    if ON_GPU:  # the fused kernel must really be in the program
        assert record["works"] and record["cudnn_kernel"] and record["error"] == ""
    else:
        assert output is None and not record["works"]
        assert record["error"] == "RuntimeError: cuDNN is not detected."


@pytest.mark.skipif(
    not ON_GPU,
    reason=f"cuDNN's own refusals need a GPU; this run's backend, {jax.default_backend()}, "
    "has no cuDNN",
)
@pytest.mark.parametrize(
    "dtype, head_dim, refusal",
    [
        (jnp.float32, 64, "NotImplementedError: Q must be fp16/bf16"),
        (jnp.bfloat16, 36, "NotImplementedError: The head dim must be <= "),
    ],
)
def test_cudnn_refuses_float32_and_odd_head_dims(dtype, head_dim, refusal):
    query, key, value = normal((3, 1, 16, 4, head_dim), 0, dtype)
    _, record = measure.run_attention("cudnn", query, key, value)
    assert not record["works"] and record["error"].startswith(refusal), record["error"]


def test_fallback_is_recorded_and_its_output_is_right():
    query, key, value = bf16_qkv()
    output, record = measure.attention_with_fallback("cudnn", query, key, value)
    assert record["requested"] == "cudnn"
    assert record["ran"] == ("cudnn" if ON_GPU else "xla")
    expected = measure.reference_attention(query, key, value)  # float64 NumPy
    np.testing.assert_allclose(np.asarray(output, np.float32), expected, atol=2e-2)


def test_xla_program_has_no_cudnn_call():
    query, key, value = bf16_qkv()
    assert not measure.uses_cudnn_kernel(measure.attention_fn("xla"), query, key, value)


def test_report_covers_every_case():
    cases = (("naive", "float32", 8), ("cudnn", "float32", 8))
    rows = measure.implementation_report(cases, length=8, heads=3)
    assert [(r["implementation"], r["works"]) for r in rows] == [("naive", True), ("cudnn", False)]
    assert rows[1]["ran_instead"] == "xla" and rows[0]["ran_instead"] == ""
