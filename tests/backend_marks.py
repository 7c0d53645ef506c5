"""Marks for tests of what XLA's CPU compiler does, which another backend's compiler need not.

Each reason names what the GPU run of 2026-12-04 (one H200, JAX 0.11.2) measured instead, so
a skip says what is known there rather than hiding it.
"""

import jax
import pytest


def xla_cpu_only(seen_on_gpu: str):
    """Skips the test off the CPU backend: it checks XLA:CPU's choices (layouts, copies, host
    page faults); `seen_on_gpu` is what the H200 run found instead."""
    return pytest.mark.skipif(
        jax.default_backend() != "cpu",
        reason=f"checks XLA:CPU's choice; on an H200 (JAX 0.11.2): {seen_on_gpu}",
    )
