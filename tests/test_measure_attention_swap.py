import jax
import pytest

import jaxloops
from jaxloops.blockwise import blockwise_attention
from jaxloops.measure import attention_swap


def test_masked_flops_are_half_the_scores_and_the_mix_forward_and_backward():
    L, D, N, K, F, T, B = 2, 64, 4, 2, 256, 128, 3
    full_forward = 4 * B * N * T * T * (D // N)  # QK^T and PV, one layer
    assert attention_swap.masked_flops((L, D, N, K, F, T, B)) == L * 3 * full_forward / 2
    assert (
        attention_swap.masked_flops((L, D, N, K, F, T, B)) != L * full_forward / 2
    )  # forward only


def test_the_swaps_bytes_are_q_k_v_and_out_and_their_gradients_read_and_written():
    L, D, N, K, F, T, B = 2, 64, 4, 2, 256, 128, 3
    q, k = B * T * N * 16 * 2, B * T * K * 16 * 2  # bfloat16
    assert attention_swap.swap_bytes((L, D, N, K, F, T, B)) == L * 8 * (q + k)
    assert attention_swap.swap_bytes((L, D, N, K, F, T, B)) != L * 4 * (q + k)  # forward only
    assert attention_swap.swap_bytes((L, D, N, K, F, T, B), itemsize=4) == L * 16 * (q + k)
    with pytest.raises(ValueError, match="0"):
        attention_swap.swap_bytes((L, D, N, K, F, T, B), itemsize=0)


def test_the_prediction_moves_the_step_by_the_layers_difference_only():
    assert attention_swap.predicted_step(10.0, 1.0, 0.25, 4) == 7.0
    assert attention_swap.predicted_step(10.0, 1.0, 0.25, 4) != 10.0 - (1.0 - 0.25)  # one layer
    with pytest.raises(ValueError, match="layers >= 1"):
        attention_swap.predicted_step(10.0, 1.0, 0.25, 0)


def test_swap_sizes_are_chapter_11s_on_a_tpu_and_one_small_layer_elsewhere():
    tpu, cpu = jaxloops.experiment_sizes("tpu"), jaxloops.experiment_sizes("cpu")
    assert attention_swap.swap_sizes(tpu) == tpu.lm.speed
    L, D, N, K, F, T, B = attention_swap.swap_sizes(cpu)
    assert (L, N, K, T, B) == (
        1,
        cpu.kernel.heads,
        cpu.kernel.kv_heads,
        cpu.kernel.block,
        cpu.kernel.batch,
    )
    assert D // N == cpu.kernel.head_dim


def test_the_swap_reports_shares_and_a_prediction_consistent_with_its_seconds():
    sizes = (1, 32, 2, 1, 64, 16, 2)
    attends = {"attention": jaxloops.attention, "blockwise": blockwise_attention}
    swap = attention_swap.attention_swap(sizes, attends, rounds=2, key=jax.random.key(0))
    s = swap["seconds"]
    assert set(s) == {"step, attention", "step, blockwise", "layer, attention", "layer, blockwise"}
    assert swap["flops"] == swap["steps"]["attention"]["step_flops"]  # one model's work for both
    for name in attends:
        assert swap["of_ceiling"][name] == pytest.approx(
            swap["flops"] / s[f"step, {name}"] / swap["ceiling"]
        )
    expected = s["step, attention"] - (s["layer, attention"] - s["layer, blockwise"])
    assert swap["predicted"] == pytest.approx(expected)
    assert swap["measured_over_predicted"] == pytest.approx(expected / s["step, blockwise"])
    unmasked = swap["flops"] - attention_swap.masked_flops(sizes)
    assert swap["of_ceiling_unmasked"] == pytest.approx(
        unmasked / s["step, blockwise"] / swap["ceiling"]
    )
    with pytest.raises(ValueError, match="two attentions"):
        attention_swap.attention_swap(sizes, {"attention": jaxloops.attention}, rounds=1)


def test_the_traced_step_splits_its_copies_by_the_file_that_made_them():
    from jaxloops.measure import step_speed

    sizes = (1, 32, 2, 1, 64, 16, 2)
    programs = step_speed.step_programs(sizes, jax.random.key(0), names=("step",))
    traced = attention_swap.traced_step(programs, tries=1)
    groups, by_file = traced["groups"], traced["copies by file"]
    assert groups["matmul: MLP"]["flops"] == 3 * 2 * 2 * 16 * 2 * 32 * 64  # as step_breakdown's
    copies = groups.get("copies and transposes", {"kernels": 0, "seconds": 0.0, "bytes": 0.0})
    # The files' rows add up to the group's, kernel for kernel
    assert sum(r["kernels"] for r in by_file.values()) == copies["kernels"]
    assert sum(r["seconds"] for r in by_file.values()) == pytest.approx(copies["seconds"])
    assert sum(r["bytes"] for r in by_file.values()) == pytest.approx(copies["bytes"])
    assert all("/" not in name for name in by_file)  # a file's name, not its path


def _swaps(jaxpr) -> int:
    """Transposes between (B, T, N, H) and (B, N, T, H) in a jaxpr and every jaxpr inside it."""
    count = 0
    for eqn in jaxpr.eqns:
        swapped = eqn.primitive.name == "transpose" and eqn.params["permutation"] == (0, 2, 1, 3)
        count += swapped
        inner = [getattr(p, "jaxpr", p) for v in eqn.params.values()
                 for p in (v if isinstance(v, tuple | list) else [v])]  # fmt: skip
        count += sum(_swaps(j) for j in inner if hasattr(j, "eqns"))  # a (closed) jaxpr's
    return count


def test_the_layer_pass_makes_the_swaps_the_steps_attention_makes():
    # Chapter 17 predicts the step from one layer's pass timed alone, and says the pass pays
    # for the same swaps as the step's layers: the kernel's, in and out, forward and backward.
    import jax.numpy as jnp

    from jaxloops import pallas_attention, transformer

    B, T, N, K, H = 1, 128, 4, 2, 64
    keys = jax.random.split(jax.random.key(0), 4)
    shapes = [(B, T, N, H), (B, T, K, H), (B, T, K, H), (B, T, N, H)]
    q, k, v, d_out = (jax.random.normal(key, s, jnp.bfloat16) for key, s in zip(keys, shapes))
    kernel = pallas_attention.pallas_attention
    layer = _swaps(jax.make_jaxpr(attention_swap.layer_pass(kernel))(q, k, v, d_out).jaxpr)

    config = transformer.TransformerConfig(64, 1, N * H, N, K, 4 * N * H, T)
    params = transformer.init_transformer(jax.random.key(1), config)["block_0"]["attention"]
    x = jax.random.normal(keys[0], (B, T, N * H), jnp.float32)

    def block(x):
        return transformer.attention_block(params, x, attend=kernel)[0].sum()

    step = _swaps(jax.make_jaxpr(jax.grad(block))(x).jaxpr)
    assert layer == step == 8  # q, k, v and out forward; their cotangents backward
    heads_major = lambda q, k, v, is_causal: kernel(q, k, v, is_causal=is_causal, layout="BNTH")
    assert _swaps(jax.make_jaxpr(attention_swap.layer_pass(heads_major))(q, k, v, d_out).jaxpr) == 0
