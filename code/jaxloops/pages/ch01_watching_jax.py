"""Chapter 1's page: the traced clips run as its visible cell runs them, for its checks
(book/01_watching_jax.md)."""

from collections.abc import Callable, Sequence

import jax
import numpy as np

from jaxloops.measure.timing import count_compiles


def traced_clips(
    clips: Sequence[Callable], vectors: Sequence[jax.Array], max_norms: Sequence[float]
) -> dict[str, dict]:
    """Each clip jitted and called on every vector with every max_norm, in that order, after
    `jax.clear_caches()`: jit shares a function's compiled programs between its wrappers, so
    calls the page's visible cell already made would otherwise count no compilation.

    Returns:
      {clip's name: {"out": its outputs stacked, (len(vectors) * len(max_norms), ...),
      "compiles": how many times XLA compiled `jit(<clip's name>)` during the calls}}.
    """
    if not clips or not vectors or not max_norms:
        raise ValueError(
            f"need at least one clip, vector and max_norm, got {len(clips)}, {len(vectors)}, "
            f"{len(max_norms)}"
        )
    jax.clear_caches()
    runs = {}
    for clip in clips:
        jitted = jax.jit(clip)
        with count_compiles() as log:
            outs = [jitted(v, m) for v in vectors for m in max_norms]
        runs[clip.__name__] = {
            "out": np.stack([np.asarray(o) for o in outs]),
            "compiles": log.names.count(f"jit({clip.__name__})"),
        }
    return runs
