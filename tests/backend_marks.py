"""Marks for tests of what XLA's CPU compiler does, which another backend's compiler need not.

Each reason names what was measured instead on the other backend: the GPU run of 2026-12-04
(one H200, JAX 0.11.2) or the TPU run of 2026-12-06 (one TPU v5e, JAX 0.10.2), so a skip says
what is known there rather than hiding it.
"""

import jax
import pytest


def xla_cpu_only(seen_on_gpu: str):
    """Skips the test off the CPU backend: it checks XLA:CPU's choices (layouts, copies, host
    page faults); `seen_on_gpu` is what the H200 run found instead."""
    return pytest.mark.skipif(
        jax.default_backend() != "cpu",
        reason=f"checks XLA:CPU's choice, not {jax.default_backend()}'s; on an H200 (JAX 0.11.2): "
        f"{seen_on_gpu}",
    )


def not_xla_tpus_choice(seen_on_tpu: str):
    """Skips the test on a TPU: it checks a choice XLA:CPU makes (which buffers a compiled
    program keeps) that XLA:TPU makes otherwise; `seen_on_tpu` is what the TPU v5e run found
    instead."""
    return pytest.mark.skipif(
        jax.default_backend() == "tpu",
        reason=f"checks XLA:CPU's choice; on a TPU v5e (JAX 0.10.2): {seen_on_tpu}",
    )
