"""jaxloops.model_flops: the field's count of a train step's FLOPs, against every matrix
product that the gradient's program really contains."""

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

import jaxloops
from jaxloops import model_flops

CONFIG = jaxloops.TransformerConfig(vocab_size=13, num_layers=3, model_dim=20, num_heads=4,
                                    num_kv_heads=2, hidden_dim=36, max_len=11)  # fmt: skip


def dot_flops(jaxpr) -> float:
    """2 · (product of the output's dims) · (contracted size) of every dot_general in a jaxpr
    and the jaxprs inside it."""
    total = 0.0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            (contract, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            total += 2 * np.prod(eqn.outvars[0].aval.shape) * np.prod([lhs[i] for i in contract])
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            total += dot_flops(sub)
    return total


def test_the_count_equals_the_gradients_matrix_products_with_full_attention():
    B, T = 3, 7
    params = jaxloops.init_transformer(jax.random.key(0), CONFIG)
    tokens = jax.random.randint(jax.random.key(1), (B, T + 1), 0, CONFIG.vocab_size)
    batch = jaxloops.Batch(tokens[:, :-1], tokens[:, 1:])
    jaxpr = jax.make_jaxpr(jax.grad(jaxloops.transformer_loss, has_aux=True))(params, batch).jaxpr
    # `attention` computes every score and masks half: the full count is what it does.
    assert dot_flops(jaxpr) == model_flops.train_flops(CONFIG, B, T, causal=False)
    # The causal count credits half of attention's products, and only those.
    full, causal = (model_flops.train_flops(CONFIG, B, T, causal=c) for c in (False, True))
    assert full - causal == 6 * CONFIG.num_layers * B * T**2 * CONFIG.model_dim
    # A count that forgets the unembedding, or counts the embedding tables, is caught.
    D, V = CONFIG.model_dim, CONFIG.vocab_size
    assert dot_flops(jaxpr) != full - 6 * D * V * B * T
    assert dot_flops(jaxpr) != full + 6 * (V + CONFIG.max_len) * D * B * T


def test_matmul_params_leave_out_the_embedding_tables_only():
    params = jaxloops.init_transformer(jax.random.key(0), CONFIG)
    matrices = sum(x.size for x in jax.tree.leaves(params) if x.ndim >= 2)
    embeddings = params["embed"]["tokens"].size + params["embed"]["positions"].size
    assert model_flops.matmul_params(CONFIG) == matrices - embeddings


def test_mfu_is_model_flops_per_second_over_the_peak_and_refuses_bad_input():
    assert model_flops.mfu(6e12, 0.1, 120e12) == pytest.approx(0.5)
    for bad in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="seconds"):
            model_flops.mfu(6e12, bad, 120e12)
    with pytest.raises(ValueError, match="length 12"):
        model_flops.train_flops(CONFIG, 2, 12)
    with pytest.raises(ValueError, match="batch"):
        model_flops.train_flops(CONFIG, 0, 4)
    assert jnp.isfinite(model_flops.train_flops(CONFIG, 1, 1))
