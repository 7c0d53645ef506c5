import importlib

import jax
import numpy as np
import pytest

from conftest import normal
from jaxloops import measure


def _roof(flops=(3.0, 7.0, 5.0), rates=(2.0, 1.0)):
    return measure.Roofline("cpu", max(flops), flops, max(rates), rates, 8, 64)


def test_the_ceiling_is_the_best_of_its_interleaved_samples():
    roof = measure.measure_roofline(
        jax.random.key(0), matmul_size=33, read_bytes=4 * 1001, samples=3
    )
    assert len(roof.flops_samples) == len(roof.bytes_samples) == 3
    assert roof.flops_per_s == max(roof.flops_samples) > min(roof.flops_samples) * 0.999
    assert roof.bytes_per_s == max(roof.bytes_samples) and roof.read_bytes == 4 * 1001
    with pytest.raises(ValueError, match="samples >= 1, got 0"):
        measure.measure_roofline(jax.random.key(0), matmul_size=33, read_bytes=64, samples=0)


def test_the_matmul_ceiling_runs_at_the_precision_the_programs_run_at():
    """A ceiling at another precision than the programs' is not theirs (a TPU's default float32
    matmul is one bfloat16 pass): the ceiling's matmul takes JAX's default, and says which."""
    roofline = importlib.import_module("jaxloops.measure.roofline")
    a = normal((256, 256))
    with jax.default_matmul_precision("bfloat16"):
        one_pass = roofline.ceiling_matmul.lower(a, a).as_text()
        roof = roofline.measure_roofline(
            jax.random.key(0), matmul_size=16, read_bytes=64, samples=1
        )
    with jax.default_matmul_precision("highest"):
        full = roofline.ceiling_matmul.lower(a, a).as_text()
    assert roof.precision == "bfloat16"
    assert "HIGHEST" in full and "HIGHEST" not in one_pass  # a pinned precision fails this


def test_raised_keeps_every_sample_and_the_best_of_old_and_new():
    roof = _roof().raised(flops_samples=[4.0, 11.0], bytes_samples=[0.5])
    assert roof.flops_per_s == 11.0 and roof.flops_samples == (3.0, 7.0, 5.0, 4.0, 11.0)
    assert roof.bytes_per_s == 2.0 and len(roof.bytes_samples) == 3
    assert _roof().raised(flops_samples=[1.0]).flops_per_s == 7.0  # a slower sample lowers nothing


def test_raise_roofline_is_what_every_later_chapter_reads(tmp_path, monkeypatch):
    path = tmp_path / "roofline.json"
    env = importlib.import_module("jaxloops.measure.roofline").ROOFLINE_ENV
    monkeypatch.setenv(env, str(path))
    path.write_text(
        '{"device": "cpu", "flops_per_s": 7.0, "flops_samples": [7.0], "bytes_per_s": 2.0, '
        '"bytes_samples": [2.0], "matmul_size": 8, "read_bytes": 64}'
    )
    assert measure.raise_roofline(flops_samples=[9.0]).flops_per_s == 9.0
    assert measure.roofline().flops_per_s == 9.0 and measure.roofline().flops_samples == (7.0, 9.0)


def test_samples_beside_the_ceiling_raise_a_ceiling_measured_at_a_slow_moment(
    tmp_path, monkeypatch
):
    rooflines = importlib.import_module("jaxloops.measure.roofline")
    monkeypatch.setenv(rooflines.ROOFLINE_ENV, str(tmp_path / "roofline.json"))
    # 1 FLOP/s and 1 byte/s: any 8 x 8 matmul and any read of 64 bytes beat them.
    rooflines.store_roofline(_roof(flops=(1.0,), rates=(1.0,)))
    calls = []
    samples, roof = measure.samples_beside_ceiling({"work": lambda: calls.append(1)}, 3)
    assert list(samples) == ["work"] and len(samples["work"]) == 3
    assert len(roof.flops_samples) == 4 and roof.flops_per_s == max(roof.flops_samples) > 1.0
    assert roof.bytes_samples == (1.0,)  # the read only when asked for
    assert measure.roofline() == roof  # stored for every later chapter
    _, roof = measure.samples_beside_ceiling({"work": lambda: None}, 2, read=True)
    assert len(roof.bytes_samples) == 3 and roof.bytes_per_s == max(roof.bytes_samples) > 1.0
    with pytest.raises(ValueError, match="name the ceilings' own samples"):
        measure.samples_beside_ceiling({rooflines.MATMUL: lambda: None}, 1)
    # Another matmul joins the compute ceiling's samples at its own FLOPs per call.
    _, roof = measure.samples_beside_ceiling(
        {"work": lambda: None}, 2, matmuls={"own": (lambda: None, 1e15)}
    )
    assert len(roof.flops_samples) == 6 + 2 + 2 and roof.flops_per_s > 1e15  # 6 before it
    with pytest.raises(ValueError, match="share no name"):
        measure.samples_beside_ceiling(
            {"work": lambda: None}, 1, matmuls={"work": (lambda: None, 1.0)}
        )


def test_an_epoch_above_the_ceiling_is_measured_again_beside_it(key, monkeypatch):
    import jaxloops

    params = jaxloops.init_mlp(key, (5, 7, 3))
    optimizer = jaxloops.make_optimizer(1e-3, 1e-4)
    step = jaxloops.make_train_step(jaxloops.mlp_loss, optimizer)
    # Only timed: NumPy values put on the device, no sampler compiled for them.
    batches = jaxloops.Batch(
        jax.device_put(normal((3, 11, 5))),
        jax.device_put(np.random.default_rng(0).integers(0, 3, (3, 11)).astype(np.int32)),
    )
    epochs = {"a": (step, params, optimizer.init(params), batches)}
    raises = []

    def stuck_at(ceiling):  # a ceiling that the matmul samples never raise
        def fake(flops_samples=(), bytes_samples=()):
            raises.append(len(flops_samples))
            return _roof(flops=(ceiling,))

        return fake

    rooflines = importlib.import_module("jaxloops.measure.roofline")
    monkeypatch.setattr(rooflines, "roofline", lambda: _roof())
    monkeypatch.setattr(rooflines, "raise_roofline", stuck_at(1.0))  # 1 FLOP/s: always beaten
    rows, roof = measure.scan_throughputs(epochs, rounds=2, tries=3)
    # Three tries: 2 samples of the roofline's matmul, then 2 more of the epoch's own layer too.
    assert raises == [2, 4, 4]
    assert rows["a"]["flops_per_s"] > roof.flops_per_s  # still above: the page's check fails
    raises.clear()
    monkeypatch.setattr(rooflines, "raise_roofline", stuck_at(1e30))
    measure.scan_throughputs(epochs, rounds=2, tries=3)
    assert raises == [2]  # below the ceiling at once: measured once


def test_the_last_level_cache_is_a_plausible_size_or_unknown():
    size = measure.last_level_cache_bytes()
    assert size is None or 2**16 <= size <= 2**32, size
