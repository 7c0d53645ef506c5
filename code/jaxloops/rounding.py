"""How much this process's default backend rounds float32 operations, measured against float64.

Bounds on float32 rounding (`jaxloops.equivalence`, `attention.attention_rounding_bound`)
multiply a relative error per operation. Correct rounding commits at most float32's epsilon,
and a CPU does; a TPU computes exp and log less accurately, and multiplies float32 matrices in
bfloat16 passes (one at the default precision; several, still not exact float32, at
"highest"). `backend_eps` measures, in this process, what its default backend commits, so a
bound built on it holds for the arithmetic actually done.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np


def backend_errors() -> dict[str, float]:
    """The largest relative errors of float32 operations on this process's default backend,
    at the matmul precision in force, measured against float64 (cached per backend and
    precision):

      exp     of `jnp.exp(x - max x)` over rows of 128 scores in [-40, 10]: a softmax's
              exponentials, fused as attention fuses them;
      log     the absolute error of `jnp.log` on [1, e]: the log of a softmax's sum (>= 1),
              whose absolute error is the relative error of each exp(x - log-sum-exp);
      divide  of x / y, and `sqrt`, on random normal data;
      matmul  |fl(A B) - A B| / (|A| |B|) elementwise for 16-term dots, the length of a
              head's scores: a correctly rounded float32 dot of n terms stays below n u
              (Higham §3.1), in practice below u for 16 random terms.
    """
    return dict(
        _backend_errors(jax.default_backend(), str(jax.config.jax_default_matmul_precision))
    )


# The operations of an attention (its scores, exponentials, sums and division) and of a
# log-sum-exp (an attention's residual for its backward pass, a cross-entropy).
ATTENTION = ("exp", "divide", "matmul")
LOG_SUM_EXP = ("exp", "log")


def backend_eps(ops=None) -> float:
    """Float32's machine epsilon (2 u), or this backend's largest relative error of one of
    the operations `ops` (names of `backend_errors`; None: all of them) where it is larger:
    what a rounding bound multiplies, for a computation made of those operations.

    On a CPU every measured error is below epsilon, so bounds are float32's. A TPU v5e
    (JAX 0.10.2) measured: log 1.1e-4 (absolute, on [0.5, 2]), exp 5.2e-6, a matmul 3e-3 at the
    default precision (one bfloat16 pass) and 6e-8 at "highest"."""
    errors = backend_errors()
    unknown = set(ops or ()) - set(errors)
    if unknown:
        raise ValueError(f"no measured error for {sorted(unknown)}; measured: {sorted(errors)}")
    return max(float(np.finfo(np.float32).eps), *(errors[op] for op in ops or errors))


@functools.lru_cache(maxsize=8)
def _backend_errors(backend: str, precision: str) -> tuple[tuple[str, float], ...]:
    del backend, precision  # the cache's key: each is measured where it is in force
    rng = np.random.default_rng(0)

    def relative(got, exact, floor=0.0):
        got, exact = np.asarray(got, np.float64), np.asarray(exact, np.float64)
        return float((np.abs(got - exact) / np.maximum(np.abs(exact), floor)).max())

    scores = np.linspace(-40, 10, 256 * 128, dtype=np.float32).reshape(256, 128)
    shifted = scores.astype(np.float64) - scores.max(-1, keepdims=True)
    exp = jax.jit(lambda x: jnp.exp(x - x.max(-1, keepdims=True)))(scores)
    x = np.linspace(1, np.e, 2**15, dtype=np.float32)
    a, b = rng.standard_normal((2, 4096), np.float32)
    b = np.where(np.abs(b) < 1e-3, 1.0, b).astype(np.float32)
    m, n = rng.standard_normal((64, 16), np.float32), rng.standard_normal((16, 48), np.float32)
    product = np.asarray(jax.jit(jnp.matmul)(m, n), np.float64)
    m64, n64 = m.astype(np.float64), n.astype(np.float64)
    errors = {
        "exp": relative(exp, np.exp(shifted)),
        "log": relative(jax.jit(jnp.log)(x), np.log(x.astype(np.float64)), floor=1.0),
        "divide": relative(jax.jit(jnp.divide)(a, b), a.astype(np.float64) / b),
        "sqrt": relative(jax.jit(jnp.sqrt)(np.abs(a)), np.sqrt(np.abs(a).astype(np.float64))),
        "matmul": float((np.abs(product - m64 @ n64) / (np.abs(m64) @ np.abs(n64))).max()),
    }
    return tuple(errors.items())
