"""What a refusal to compile for want of memory says, read as a measurement."""

import jax
import jax.numpy as jnp
import pytest

from jaxloops.measure import refusals

# XLA:TPU's refusal to compile chapter 8b's plain jax.grad of the blockwise walk at T = 16384
# (a TPU v5e, 2026-12-06; the same from an ahead-of-time compile for a v5e topology).
TPU_REFUSAL = (
    "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
    "temporaries (18.13G) exceeds available HBM (15.75G)."
)


def test_a_refusal_for_memory_gives_the_compilers_count_and_other_errors_none():
    refused = refusals.refused_for_memory(jax.errors.JaxRuntimeError(TPU_REFUSAL))
    assert refused["temp_bytes"] == int(18.13 * 2**30)
    assert refused["available_bytes"] == int(15.75 * 2**30) and refused["memory"] == "HBM"
    assert refused["error"].startswith("RESOURCE_EXHAUSTED: Ran out of memory on HBM")
    assert refusals.refused_for_memory(jax.errors.JaxRuntimeError("INTERNAL: other")) is None
    # out of memory, but not a compile's refusal with its count: not read as one
    assert refusals.refused_for_memory(RuntimeError("RESOURCE_EXHAUSTED: oom")) is None


def test_scratch_or_refusal_counts_what_compiles_and_what_is_refused(monkeypatch):
    x = jnp.ones((64, 64), jnp.float32)
    fits = refusals.scratch_or_refusal(lambda a: jnp.exp(a @ a).sum(), x)
    assert fits["refused"] is None and fits["temp_bytes"] >= 0

    def refuse(fn, *args):
        raise jax.errors.JaxRuntimeError(TPU_REFUSAL)

    monkeypatch.setattr(refusals, "compiled_costs", refuse)
    refused = refusals.scratch_or_refusal(lambda a: a, x)
    assert refused["temp_bytes"] == int(18.13 * 2**30) and refused["refused"]["memory"] == "HBM"

    def fail(fn, *args):
        raise jax.errors.JaxRuntimeError("INTERNAL: not about memory")

    monkeypatch.setattr(refusals, "compiled_costs", fail)
    with pytest.raises(jax.errors.JaxRuntimeError, match="not about memory"):
        refusals.scratch_or_refusal(lambda a: a, x)
