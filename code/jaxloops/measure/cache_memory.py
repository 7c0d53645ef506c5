"""Chapter 10's harness for the cache in place: each decode loop compiled at each (B, K),
with the bytes it aliases, the scratch it allocates and the cache-sized copies in its loops."""

import jax
import numpy as np

from jaxloops.kvcache import attention_kind
from jaxloops.measure.compiled import MiB, loop_copies, scratch_bytes


def loop_memory_rows(
    loops: dict,
    *,
    heads: int,
    head_dim: int,
    length: int,
    steps: int,
    batches,
    kv_choices,
    dtype,
) -> list[dict]:
    """Compile each decode loop for each (B, K) and read its aliased bytes, its scratch, and
    the cache-sized copies inside its loop bodies (`loop_copies`).

    Args:
      loops: name -> a jitted loop `(queries, keys, values, cache_key, cache_value, start)`.
    """
    rows = []
    for B in batches:
        for K in kv_choices:
            queries = jax.ShapeDtypeStruct((B, steps, heads, head_dim), dtype)  # (B, T, N, H)
            new = jax.ShapeDtypeStruct((B, steps, K, head_dim), dtype)  # (B, T, K, H)
            cache = jax.ShapeDtypeStruct((B, K, length, head_dim), dtype)  # (B, K, S, H)
            elements = B * K * length * head_dim
            row = {
                "kind": attention_kind(heads, K),
                "B": B,
                "K": K,
                "cache MiB (K and V)": 2 * elements * np.dtype(dtype).itemsize / MiB,
            }
            for name, loop in loops.items():
                compiled = loop.lower(queries, new, new, cache, cache, 0).compile()
                memory = compiled.memory_analysis()
                row["aliased MiB"] = memory.alias_size_in_bytes / MiB  # same for each loop
                row[f"scratch MiB, {name}"] = scratch_bytes(memory) / MiB  # a TPU reports no temp
                row[f"copies, {name}"] = loop_copies(compiled, elements)
            rows.append(row)
    return rows
