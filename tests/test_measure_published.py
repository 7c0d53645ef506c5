import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import normal
from jaxloops.measure import published

ON_GPU = jax.default_backend() == "gpu"


def round_mantissa(x, bits: int) -> np.ndarray:
    """float32 values rounded to `bits` explicit mantissa bits, nearest with ties to even:
    what a tensor core keeps of a float32 operand (TF32: 10 bits; bfloat16: 7)."""
    u = np.asarray(x, np.float32).view(np.uint32)
    drop = 23 - bits
    half = np.uint32((1 << (drop - 1)) - 1) + ((u >> np.uint32(drop)) & np.uint32(1))
    return ((u + half) & ~np.uint32((1 << drop) - 1)).view(np.float32)


def relative_error(out, reference) -> float:
    out = np.asarray(out, np.float64)
    return float(np.linalg.norm(out - reference) / np.linalg.norm(reference))


def test_the_rounding_equals_a_bfloat16_cast():
    x = normal((3, 5, 7), 1)
    # XLA's cast to bfloat16 on the device (one program); widening back to float32 is exact.
    as_bf16 = np.asarray(jax.device_put(x).astype(jnp.bfloat16)).astype(np.float32)
    np.testing.assert_array_equal(round_mantissa(x, 7), as_bf16)


def test_where_tf32_or_bfloat16_would_change_the_answer():
    assert jax.config.jax_default_matmul_precision == "highest"  # the suite's pin (conftest)
    a, b = normal((33, 97), 2), normal((97, 41), 3)
    reference = a.astype(np.float64) @ b.astype(np.float64)
    full = relative_error(jnp.matmul(a, b), reference)
    # The CPU ignores precision="tensorfloat32"/"bfloat16", so round the operands as a
    # tensor core does and multiply exactly: the error a GPU's TF32 or bf16 pass would add.
    tf32 = relative_error(
        round_mantissa(a, 10).astype(np.float64) @ round_mantissa(b, 10).astype(np.float64),
        reference,
    )
    bf16 = relative_error(
        round_mantissa(a, 7).astype(np.float64) @ round_mantissa(b, 7).astype(np.float64),
        reference,
    )
    # float32 lands near 1e-7; TF32 near 3e-4; bf16 operands near 3e-3. A comparison at the
    # suite's float32 tolerances (1e-5 and below) passes only the first.
    assert full < 1e-6 < 1e-4 < tf32 < 1e-3 < bf16 < 1e-2
    if ON_GPU:  # the GPU runs what the emulation describes (named dot algorithms, not levels)
        for precision, emulated in (("TF32_TF32_F32", tf32), ("BF16_BF16_F32", bf16)):
            measured = relative_error(jnp.matmul(a, b, precision=precision), reference)
            assert emulated / 3 < measured < emulated * 3, (precision, measured, emulated)


def test_published_peaks_by_device_kind():
    h200 = published.published_peaks("NVIDIA H200")
    assert h200.board == "NVIDIA H200 SXM" and h200.hbm_bytes_per_s == 4.8e12
    assert published.published_peaks("NVIDIA H100 PCIe").board == "NVIDIA H100 PCIe"
    assert published.published_peaks("NVIDIA H100 80GB HBM3").board == "NVIDIA H100 SXM"
    assert published.published_peaks("cpu") is None
    # 8192^3 bf16 matmul: 2 n^3 FLOPs over 989.5 TFLOP/s; 3 n^2 * 2 bytes over 4.8 TB/s.
    n = 8192
    assert h200.predict(2 * n**3, 3 * n * n * 2) == pytest.approx(2 * n**3 / 989.5e12)
    with pytest.raises(ValueError, match="precision is 'fp8'"):
        h200.flops_per_s("fp8")


def test_one_table_gives_the_interconnects_of_chapter_12():
    links = published.interconnect_peaks()
    assert links["H100 SXM, NVLink 4"] == (989.5e12, 450e9)  # the GPU roofline's own figure
    assert links["H200 SXM, NVLink 4"][0] == published.published_peaks("H200").bf16_flops_per_s
    assert set(links) == {"H100 SXM, NVLink 4", "H200 SXM, NVLink 4", "TPU v5p, ICI"}


def test_a_figure_a_board_does_not_publish_is_refused_by_name():
    tpu = published.published_peaks("TPU v5p")
    with pytest.raises(ValueError, match="TPU v5p publishes no f32 figure"):
        tpu.flops_per_s("f32")
