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


def test_a_per_backend_value_splits_and_any_other_value_is_shared():
    from jaxloops.sizes import By, MeasureSizes, _per_backend

    cpu, gpu, tpu = _per_backend(MeasureSizes, repeats=By(5, 20, 9), matmul_size=512)
    assert (cpu.repeats, gpu.repeats, tpu.repeats) == (5, 20, 9)
    assert cpu.matmul_size == gpu.matmul_size == tpu.matmul_size == 512
    _, gpu, tpu = _per_backend(MeasureSizes, repeats=By(5, 20), matmul_size=512)
    assert tpu.repeats == gpu.repeats == 20  # no TPU value: the GPU's
    with pytest.raises(TypeError, match="unknown"):  # a misspelt size is not silently dropped
        _per_backend(MeasureSizes, repeats=1, matmul_size=2, unknown=3)


def test_the_tpu_column_fits_the_chip():
    """The TPU's biggest experiments stay inside the v5e's 15.75 GiB: the attention sweep's
    float32 q, k, v and output at its longest T, and naive's scores only where it runs."""
    tpu = jaxloops.experiment_sizes("tpu")
    a, hbm = tpu.attention, 15.75 * 2**30
    assert max(a.lengths) >= 16384
    qkvo = 4 * 4 * a.heads * max(a.lengths) * a.head_dim * 4  # B = 4 at most
    scores = 4 * a.heads * a.materialise_max_length**2 * 4  # (B, N, T, S) float32, B = 4
    assert qkvo < hbm / 8 and scores < hbm / 2
    assert 4 * a.heads * (2 * a.materialise_max_length) ** 2 * 4 > hbm / 2  # doubled: it would not
    L, D, N, K, F, T, B = tpu.lm.speed
    params = L * (2 * D * D + 2 * D * D * K // N + 2 * D * F)  # q, o; k, v; the MLP
    assert 70e6 < params < 130e6  # about 100 M parameters (embeddings aside)


@pytest.mark.parametrize("backend", ["cpu", "gpu", "tpu"])
def test_the_biggest_model_search_unrolls_few_blocks(backend):
    """Chapter 14's search over L compiles the unrolled step of each technique without remat
    at the deepest L that fits, every block of it (on a TPU, seconds a probe at L 8); the
    formula's answer is where the search starts (the compiled one is smaller on XLA:CPU,
    larger on XLA:TPU: about 22 against 17, compiled ahead of time). And the chapter's own L
    fits at that batch without remat, at a margin of 1.5 over the formula: the search's
    first compile measures it there."""
    from jaxloops import memory
    from jaxloops.measure.step_memory import TECHNIQUES, formula_technique

    sizes = jaxloops.experiment_sizes(backend)
    part = sizes.memory
    config = dataclasses.replace(
        jaxloops.TransformerConfig.from_sizes(sizes.lm, jaxloops.text.VOCAB_SIZE),
        num_layers=part.layers, max_len=part.seq_len,
    )  # fmt: skip
    for name, program in TECHNIQUES.items():
        if not program.get("scanned"):
            found = memory.biggest_model(
                config, part.fit_batch, part.seq_len, part.budget_mib * 2**20,
                **formula_technique(program),
            )  # fmt: skip
            assert 1 <= found["L"] <= 36, (name, found)
    margin = memory.biggest_model(
        config, part.fit_batch, part.seq_len, part.budget_mib * 2**20, margin=1.5
    )
    assert margin["L"] >= part.layers or backend == "cpu"  # a CPU compiles a step of any size
