import dataclasses

import pytest

import jaxloops


@pytest.mark.parametrize("backend", ["cpu", "gpu", "tpu"])
def test_sizes_of_every_backend_are_consistent(backend):
    """The GPU sizes are never executed on CPU CI, so their consistency is checked here."""
    sizes = jaxloops.experiment_sizes(backend)
    assert sizes.backend == backend
    loop, attn, lm = sizes.loop, sizes.attention, sizes.lm
    assert all(width >= 1 for width in loop.hidden)
    assert sorted(loop.throughput_batch_sizes) == list(loop.throughput_batch_sizes)
    assert 0 < loop.batch_size <= 1347  # the digits training split has 1347 examples
    assert list(attn.lengths) == sorted(attn.lengths)
    assert attn.materialise_max_length <= max(attn.lengths)
    assert all(
        length % attn.block_size == 0 for length in attn.lengths if length >= attn.block_size
    )
    assert set(attn.causal_lengths) <= set(attn.lengths)
    assert attn.heads >= 1 and attn.head_dim >= 1 and attn.repeats >= 1
    assert lm.steps % lm.eval_every == 0
    # Chapter 10: MHA, GQA (K = N // 8) and MQA are three different K for the sweep's N.
    assert attn.decode_heads % 8 == 0 and attn.decode_heads >= 16 and attn.decode_steps >= 1
    ckpt = sizes.checkpoint
    assert 0 < ckpt.kill_epoch < ckpt.epochs and 0 < ckpt.stop_epoch < ckpt.epochs
    assert ckpt.keep_last >= 3 and ckpt.lm_windows >= lm.batch_size
    assert ckpt.lm_text_bytes > ckpt.lm_windows  # room to cut the windows from
    # The language model's sizes must build a config: TransformerConfig raises ValueError
    # unless N divides D and K divides N (tests/test_transformer.py feeds it both).
    jaxloops.TransformerConfig.from_sizes(lm, 97)
    # Chapter 12: the batch and the training rows split evenly over the mesh.
    shard = sizes.sharding
    assert shard.devices >= 2 and shard.batch_size % shard.devices == 0
    assert shard.examples % shard.devices == 0 and shard.batch_size <= shard.examples <= 1347
    assert shard.epochs >= 1 and all(width % shard.devices == 0 for width in shard.hidden)


def test_gpu_sizes_are_larger_than_cpu_sizes():
    cpu, gpu = jaxloops.experiment_sizes("cpu"), jaxloops.experiment_sizes("gpu")
    assert max(gpu.attention.lengths) > max(cpu.attention.lengths)
    assert gpu.lm.model_dim > cpu.lm.model_dim
    assert gpu.measure.matmul_size > cpu.measure.matmul_size


def test_sizes_are_frozen():
    sizes = jaxloops.experiment_sizes("cpu")
    with pytest.raises(dataclasses.FrozenInstanceError):
        sizes.loop.batch_size = 7


def test_unknown_backend_is_named():
    with pytest.raises(ValueError, match="'quantum'"):
        jaxloops.experiment_sizes("quantum")


def test_a_cpu_gpu_pair_splits_and_any_other_value_is_shared():
    from jaxloops.sizes import CpuGpu, MeasureSizes, _cpu_and_gpu

    cpu, gpu = _cpu_and_gpu(MeasureSizes, repeats=CpuGpu(5, 20), matmul_size=512)
    assert (cpu.repeats, gpu.repeats) == (5, 20)
    assert cpu.matmul_size == gpu.matmul_size == 512
    with pytest.raises(TypeError, match="unknown"):  # a misspelt size is not silently dropped
        _cpu_and_gpu(MeasureSizes, repeats=1, matmul_size=2, unknown=3)
