"""Chapter 1's traced clips, run for its checks: each counted afresh, whatever ran before."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxloops import tracing
from jaxloops.pages import ch01_watching_jax as page

CLIPS = (tracing.clip_where, tracing.clip_select, tracing.clip_cond)


def test_each_clip_compiles_once_and_agrees_with_the_eager_if_even_when_already_compiled():
    vectors = (jnp.array([3.0, 4.0, 12.0]), jnp.array([0.1, 0.2, 0.2]))  # norms 13 and 0.3
    max_norms = (1.0, 6.5)
    for clip in CLIPS:  # compiled before, as the page's visible cell compiles them
        jax.jit(clip)(vectors[0], 1.0)
    runs = page.traced_clips(CLIPS, vectors, max_norms)
    eager = np.stack([tracing.clip_python_if(v, m) for v in vectors for m in max_norms])
    assert list(runs) == ["clip_where", "clip_select", "clip_cond"]
    for name, run in runs.items():
        assert run["compiles"] == 1, name
        np.testing.assert_allclose(run["out"], eager, rtol=1e-6)
    # The first vector was scaled to each max_norm, in the order of the calls.
    np.testing.assert_allclose(np.linalg.norm(runs["clip_cond"]["out"][:2], axis=1), max_norms)


def test_a_new_dtype_among_the_vectors_counts_a_second_compilation():
    vectors = (jnp.ones(5), jnp.ones(5, jnp.float16), jnp.ones(5))
    runs = page.traced_clips(CLIPS, vectors, (1.0, 2.0))
    for name, run in runs.items():
        assert run["compiles"] == 2, name  # the page's check, "compiled once", rejects this
        assert run["out"].shape == (6, 5)


def test_traced_clips_refuses_empty_inputs():
    with pytest.raises(ValueError, match="got 0, 1, 1"):
        page.traced_clips((), (jnp.ones(3),), (1.0,))
