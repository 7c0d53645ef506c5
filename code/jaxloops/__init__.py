"""jaxloops: the tested code behind the book "JAX training loops, executed".

Notation, used in every einsum, shape comment and suffix:

  B batch, T query length, S key/value length, D model width, F hidden width,
  N query heads, K key/value heads, G = N // K, H head dim, V vocabulary,
  C classes, L layers.
"""

from jaxloops.backend import Sizes
from jaxloops.backend import describe_backend
from jaxloops.backend import experiment_sizes
from jaxloops.backend import versions
from jaxloops.timing import CompileLog
from jaxloops.timing import compiled_flops
from jaxloops.timing import compiled_temp_bytes
from jaxloops.timing import count_compiles
from jaxloops.timing import matmul_throughput
from jaxloops.timing import time_call

__all__ = (
    "CompileLog",
    "Sizes",
    "compiled_flops",
    "compiled_temp_bytes",
    "count_compiles",
    "describe_backend",
    "experiment_sizes",
    "matmul_throughput",
    "time_call",
    "versions",
)
