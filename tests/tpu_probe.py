"""Facts about a backend's compiler and arithmetic that the test suite relies on (issue 41).

Prints one JSON object on stdout: for a few small programs (a float32 matmul, naive attention
and its gradient, a softmax and its control, the kv-cache decode loop, an MLP train step,
chapter 14's transformer gradient scanned and unrolled, chapter 11's train step at a tiny
size) what
`lowered.cost_analysis()`, `compiled.cost_analysis()` and `compiled.memory_analysis()` say,
at the default compiler options and at XLA's backend optimisation level 0 (what the suite's
XLA_FLAGS set), and the compiled HLO text; the on-device sizes and layouts of a few arrays; and
the error of float32 transcendentals, divisions, powers and matmuls against float64, at the
matmul precisions "default" and "highest".

    python tests/tpu_probe.py > out.json      # < 60 s on a TPU v5e, the chip's start included
    python tests/tpu_probe.py scratch > out2.json   # only the scratch section (v2)

Each item is measured on its own: one that raises records its error and the rest still run.
"""

import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "code"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

START = time.time()
TEXT_LIMIT = 400_000  # characters of HLO text kept per program


def jsonable(value):
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return repr(value)


def attempt(fn):
    """fn()'s result, or {"error": ...} if it raised."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 (a probe records every failure and goes on)
        return {"error": f"{type(e).__name__}: {e}"[:2000], "trace": traceback.format_exc()[-3000:]}


def cost(program):
    c = program.cost_analysis()
    if isinstance(c, (list, tuple)):
        c = c[0] if c else None
    return {k: float(v) for k, v in (c or {}).items()} if c is not None else None


def memory(compiled):
    stats = compiled.memory_analysis()
    if stats is None:
        return None
    out = {}
    for name in dir(stats):
        if name.startswith("_"):
            continue
        value = getattr(stats, name)
        if isinstance(value, bytes):
            out[name] = f"{len(value)} bytes"
        elif not callable(value):
            out[name] = jsonable(value)
    return out


def layouts(compiled):
    out = {}
    for name in ("input_formats", "output_formats"):
        out[name] = attempt(lambda name=name: repr(getattr(compiled, name))[:4000])
    return out


def describe(fn, *args, text=True, static=None, variants=True):
    """Costs, memory and HLO text of jax.jit(fn)(*args), at default options and at level 0."""
    row = {}
    t = time.time()
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn, static_argnums=static)
    lowered = jitted.lower(*args)
    row["lowered_cost"] = attempt(lambda: cost(lowered))
    compiled = lowered.compile()
    row["compiled_cost"] = attempt(lambda: cost(compiled))
    row["memory"] = attempt(lambda: memory(compiled))
    row["layouts"] = attempt(lambda: layouts(compiled))
    hlo = compiled.as_text()
    row["text_chars"] = len(hlo)
    row["instructions"] = sum(" = " in line for line in hlo.splitlines())
    if text:
        row["text"] = hlo[:TEXT_LIMIT]

    def level0():
        c0 = lowered.compile(compiler_options={"xla_backend_optimization_level": 0})
        h0 = c0.as_text()
        return {
            "compiled_cost": attempt(lambda: cost(c0)),
            "memory": attempt(lambda: memory(c0)),
            "instructions": sum(" = " in line for line in h0.splitlines()),
            "text_same_as_default": h0 == hlo,
        }

    if not variants:
        row["seconds"] = round(time.time() - t, 2)
        return row
    row["opt_level_0"] = attempt(level0)

    def compile_only():  # jaxloops.measure.step_memory.COMPILE_ONLY
        options = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
        c1 = lowered.compile(compiler_options=options)
        return {"memory": attempt(lambda: memory(c1)), "compiled_cost": attempt(lambda: cost(c1))}

    row["compile_only_options"] = attempt(compile_only)
    row["seconds"] = round(time.time() - t, 2)
    return row


def random_qkv(batch, length, heads, head_dim):
    """(B, T, N, H) standard-normal float32 query, key and value from NumPy."""
    rng = np.random.default_rng(0)
    return tuple(
        rng.standard_normal((batch, length, heads, head_dim)).astype(np.float32) for _ in range(3)
    )


def softmax_without_exp(scores, axis=-1):
    """jaxloops.measure.sweeps.softmax_without_exp, copied here: the probe imports only the
    package's concept modules (the measuring modules are being moved)."""
    shifted = scores - scores.max(axis=axis, keepdims=True)
    weights = 1.0 / (1.0 - shifted)
    return weights / weights.sum(axis=axis, keepdims=True)


def programs():
    from jaxloops.attention import attention
    from jaxloops.blockwise import blockwise_attention

    out = {}
    ones = lambda *s: np.ones(s, np.float32)  # noqa: E731
    out["matmul_7x11x13"] = attempt(lambda: describe(jnp.matmul, ones(7, 11), ones(11, 13)))
    out["matmul_64x32x16"] = attempt(lambda: describe(jnp.matmul, ones(64, 32), ones(32, 16)))
    out["x_at_w_3x5x7"] = attempt(lambda: describe(lambda x, w: x @ w, ones(3, 5), ones(5, 7)))
    out["sin_then_matmul_3x5x7"] = attempt(
        lambda: describe(lambda a, b: (jnp.sin(a) * 2 + 1) @ b, ones(3, 5), ones(5, 7))
    )
    qkv = random_qkv(1, 24, 3, 8)
    out["naive_attention_T24"] = attempt(lambda: describe(attention, *qkv))
    out["blockwise_attention_T24"] = attempt(
        lambda: describe(
            lambda q, k, v: blockwise_attention(q, k, v, block_size=8, parallel_blocks=1), *qkv
        )
    )
    spec = jax.ShapeDtypeStruct((1, 512, 2, 16), jnp.float32)

    def grad_of(fn):
        return jax.grad(lambda q, k, v: fn(q, k, v).sum(), argnums=(0, 1, 2))

    out["naive_attention_grad_T512"] = attempt(
        lambda: describe(grad_of(attention), spec, spec, spec, text=False)
    )
    scores = np.random.default_rng(0).standard_normal((2, 3, 16, 128)).astype(np.float32)
    out["softmax_2x3x16x128"] = attempt(lambda: describe(jax.nn.softmax, scores))
    out["softmax_without_exp_2x3x16x128"] = attempt(lambda: describe(softmax_without_exp, scores))
    q = np.ones((1, 257, 3, 7), np.float32)
    k = np.ones((1, 263, 3, 7), np.float32)
    out["dot_product_attention_257x263"] = attempt(
        lambda: describe(jax.nn.dot_product_attention, q, k, k, text=False)
    )
    out["decode_tokens_B3_K6"] = attempt(_decode)
    out["mlp_train_step_64_128_128_10_B256"] = attempt(_mlp_step)
    return out


def _decode():
    from jaxloops.kvcache import decode_tokens

    b, kv, heads, hd, slots, steps = 3, 6, 6, 33, 512, 7
    queries = jax.ShapeDtypeStruct((b, steps, heads, hd), jnp.float32)
    new = jax.ShapeDtypeStruct((b, steps, kv, hd), jnp.float32)
    cache = jax.ShapeDtypeStruct((b, kv, slots, hd), jnp.float32)
    compiled = decode_tokens.lower(queries, new, new, cache, cache, 0).compile()
    return {"memory": memory(compiled), "cache_shape": [b, kv, slots, hd],
            "layouts": layouts(compiled)}  # fmt: skip


def _mlp_step():
    from jaxloops.data import Batch
    from jaxloops.mlp import init_mlp, mlp_loss
    from jaxloops.train import make_optimizer, make_train_step

    params = jax.eval_shape(lambda k: init_mlp(k, (64, 128, 128, 10)), jax.random.key(0))
    optimizer = make_optimizer(3e-3, 1e-2)
    step = jax.jit(make_train_step(mlp_loss, optimizer))
    batch = Batch(
        jax.ShapeDtypeStruct((256, 64), jnp.float32), jax.ShapeDtypeStruct((256,), jnp.int32)
    )
    return describe(step, params, jax.eval_shape(optimizer.init, params), batch, text=False)


def transformer_programs():
    from jaxloops import memory as concept
    from jaxloops.data import Batch
    from jaxloops.train import make_optimizer, make_train_step
    from jaxloops.transformer import TransformerConfig, init_transformer, transformer_loss

    sizes = dict(vocab_size=13, num_layers=2, model_dim=30, num_heads=10, num_kv_heads=5,
                 hidden_dim=21, max_len=11)  # fmt: skip  # tests/conftest.py's small transformer
    config = TransformerConfig(**sizes)
    out = {}
    B, T = 4, 11
    tokens = jax.ShapeDtypeStruct((B, T), jnp.int32)
    for layers in (2, 3):
        c = TransformerConfig(**{**sizes, "num_layers": layers})
        for scanned in (False, True):
            name = f"grad_{'scanned' if scanned else 'unrolled'}_L{layers}"

            def one(c=c, scanned=scanned):  # jaxloops.measure's grad_program, written out
                params = jax.eval_shape(lambda key: init_transformer(key, c), jax.random.key(0))
                if scanned:
                    params = jax.eval_shape(concept.stack_blocks, params)
                loss = concept.scanned_loss if scanned else concept.remat_loss
                grad = jax.value_and_grad(lambda p, b: loss(p, b, None)[0])
                first = c.num_layers == 2 and not scanned
                return describe(grad, params, Batch(tokens, tokens), text=scanned, variants=first)

            out[name] = attempt(one)

    def step():
        params = init_transformer(jax.random.key(0), config)
        batch = np.random.default_rng(0).integers(0, 13, (7, 9)).astype(np.int32)
        optimizer = make_optimizer(1e-3, 0.1)
        fn = jax.jit(make_train_step(transformer_loss, optimizer))
        return describe(fn, params, jax.eval_shape(optimizer.init, params), Batch(batch, batch))

    out["train_step_small_B7_T9"] = attempt(step)
    return out


def arrays():
    """On-device sizes and layouts of a few arrays (the kv-cache test's among them)."""
    out = {}
    for shape in [(5, 7, 11, 9), (5, 3, 11, 9), (5, 1, 11, 9), (3, 5), (7,), (), (16, 128),
                  (3, 6, 512, 33)]:  # fmt: skip
        for dtype in (jnp.float32, jnp.bfloat16, jnp.float16, jnp.int8, jnp.int32):
            name = f"{jnp.dtype(dtype).name}{list(shape)}"

            def one(shape=shape, dtype=dtype):
                x = jnp.zeros(shape, dtype)
                row = {"nbytes": int(x.nbytes)}
                row["on_device_size_in_bytes"] = attempt(lambda: int(x.on_device_size_in_bytes()))
                row["format"] = attempt(lambda: repr(x.format))
                return row

            out[name] = attempt(one)
    return out


def ulps(got, ref):
    got64 = np.asarray(got, np.float64)
    spacing = np.abs(np.spacing(np.asarray(ref, np.float32))).astype(np.float64)
    finite = np.isfinite(ref) & (spacing > 0)
    err = np.abs(got64 - ref)[finite]
    return {
        "max_ulp": float((err / spacing[finite]).max()),
        "max_rel": float((err / np.maximum(np.abs(ref[finite]), 1e-300)).max()),
        "max_abs": float(err.max()),
    }


def _grid() -> dict:
    """name -> (inputs, the float32 function, its float64 reference or None)."""
    points = 200_001
    lin = lambda a, b: np.linspace(a, b, points, dtype=np.float32)  # noqa: E731
    geo = lambda a, b: np.geomspace(a, b, points, dtype=np.float32)  # noqa: E731
    return {
        "exp": (lin(-20, 5), jnp.exp, np.exp),
        "exp_small": (lin(-1, 1), jnp.exp, np.exp),
        "log": (geo(1e-3, 1e3), jnp.log, np.log),
        "log_near_1": (lin(0.5, 2), jnp.log, np.log),
        "log1p": (lin(-0.5, 2), jnp.log1p, np.log1p),
        "tanh": (lin(-5, 5), jnp.tanh, np.tanh),
        "sqrt": (geo(1e-8, 1e3), jnp.sqrt, np.sqrt),
        "rsqrt": (geo(1e-8, 1e3), jax.lax.rsqrt, lambda x: 1 / np.sqrt(x)),
        "reciprocal": (geo(1e-3, 1e3), lambda x: 1.0 / x, lambda x: 1.0 / x),
        "divide_by_3": (geo(1e-3, 1e3), lambda x: x / 3.0, lambda x: x / 3.0),
        "sin": (lin(-10, 10), jnp.sin, np.sin),
        "cos": (lin(-10, 10), jnp.cos, np.cos),
        "erf": (lin(-4, 4), jax.scipy.special.erf, None),
    }


def _elementwise(name, x, f, ref) -> dict:
    rows = {}

    def one():
        got = np.asarray(jax.jit(f)(x))
        if ref is None:
            import math

            return ulps(got[::50], np.array([math.erf(float(v)) for v in x[::50]]))
        return ulps(got, ref(x.astype(np.float64)))

    def level0():  # compiled as the suite's XLA_FLAGS compile
        options = {"xla_backend_optimization_level": 0}
        got = np.asarray(jax.jit(f).lower(x).compile(compiler_options=options)(x))
        return ulps(got, ref(x.astype(np.float64)))

    rows[name] = attempt(one)
    if ref is not None:
        rows[f"{name}_opt_level_0"] = attempt(level0)
    return rows


def _power():  # AdamW's bias correction: b ** t for an int32 step count
    t = np.arange(1, 201, dtype=np.int32)
    res = {}
    for b in (0.9, 0.999):
        got = np.asarray(jax.jit(lambda t, b=b: b ** t.astype(jnp.float32))(t))
        got_int = np.asarray(jax.jit(lambda t, b=b: jnp.float32(b) ** t)(t))
        ref = np.float64(np.float32(b)) ** t.astype(np.float64)
        res[f"{b}**float(t)"] = ulps(got, ref)
        res[f"{b}**int(t)"] = ulps(got_int, ref)
        res[f"1-{b}**float(t)"] = ulps(1 - got.astype(np.float32), 1 - ref)
    return res


def _reductions(rng):
    z = rng.standard_normal((64, 13)).astype(np.float32) * 3
    z64 = z.astype(np.float64)
    lse = np.log(np.exp(z64 - z64.max(1, keepdims=True)).sum(1)) + z64.max(1)
    sm = np.exp(z64 - lse[:, None])
    long = z.repeat(120, 0).ravel()[:100_000]
    return {
        "logsumexp": ulps(np.asarray(jax.jit(lambda z: jax.nn.logsumexp(z, 1))(z)), lse),
        "log_softmax": ulps(np.asarray(jax.jit(jax.nn.log_softmax)(z)), z64 - lse[:, None]),
        "softmax": ulps(np.asarray(jax.jit(jax.nn.softmax)(z)), sm),
        "log_of_5": float(jax.jit(jnp.log)(jnp.float32(5.0))) - np.log(5.0),
        "sum_1e5": float(jax.jit(jnp.sum)(long)) - float(long.astype(np.float64).sum()),
    }


def _matmuls(rng):
    res = {}
    for m, k, n in ((64, 96, 80), (7, 11, 13), (5, 300, 3)):
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        exact = a.astype(np.float64) @ b.astype(np.float64)
        scale = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)
        got = np.asarray(jax.jit(jnp.matmul)(a, b), np.float64)
        # err_ij / (|a| |b|)_ij: the unit roundoff the product behaves as (f32: ~k u)
        res[f"{m}x{k}x{n}"] = {
            "max_err_over_abs_product": float((np.abs(got - exact) / scale).max()),
            "max_abs": float(np.abs(got - exact).max()),
        }
    return res


def numerics():
    out = {"float32_eps": float(np.finfo(np.float32).eps)}
    rng = np.random.default_rng(0)
    grid = _grid()
    for precision in ("default", "highest"):
        rows = {}
        with jax.default_matmul_precision(precision):
            for name, (x, f, ref) in grid.items():
                rows.update(_elementwise(name, x, f, ref))
            rows["power"] = attempt(_power)
            rows["reductions"] = attempt(lambda: _reductions(rng))
            rows["matmul"] = attempt(lambda: _matmuls(rng))
        out[precision] = rows
    return out


def mem(compiled) -> dict:
    stats = compiled.memory_analysis()
    names = ("temp", "argument", "output", "alias", "peak_memory")
    return {n: int(getattr(stats, f"{n}_size_in_bytes" if n != "peak_memory" else n + "_in_bytes"))
            for n in names}  # fmt: skip


def scratch():
    """The memory the suite's scratch tests compare (v2 of this probe), per program."""
    import functools

    from jaxloops.attention import attention
    from jaxloops.blockwise import blockwise_attention

    out = {}
    spec = jax.ShapeDtypeStruct((1, 512, 2, 16), jnp.float32)

    def grad_mem(fn, *args):
        loss = lambda q, k, v: fn(q, k, v).sum()  # noqa: E731
        return mem(jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(*args).compile())

    out["grad_naive_T512"] = attempt(lambda: grad_mem(attention, spec, spec, spec))
    out["grad_blockwise_T512_b32_p2"] = attempt(
        lambda: grad_mem(
            functools.partial(blockwise_attention, block_size=32, parallel_blocks=2),
            spec,
            spec,
            spec,
        )  # fmt: skip
    )
    small = jax.ShapeDtypeStruct((1, 24, 2, 3), jnp.float32)
    for custom in (True, False):
        out[f"grad_blockwise_T24_custom_vjp_{custom}"] = attempt(
            lambda custom=custom: grad_mem(
                functools.partial(
                    blockwise_attention, block_size=8, parallel_blocks=1, custom_vjp=custom
                ),
                small,
                small,
                small,
            )  # fmt: skip
        )
    for t in (16, 32):
        q = jax.ShapeDtypeStruct((3, t, 5, 7), jnp.float32)
        out[f"naive_forward_B3_N5_H7_T{t}"] = attempt(
            lambda q=q: mem(jax.jit(attention).lower(q, q, q).compile())
        )
    return {**out, **_transformer_scratch(), **_controls(), **_decode_and_library()}


def _controls():
    """Bytes of softmax and of candidate controls without an exponential (chapter 8's
    `softmax_without_exp` divides by 1 - x; XLA:TPU reassociated its w / sum(w) and split it
    in two fusions in v1: twice the bytes)."""
    scores = np.random.default_rng(0).standard_normal((2, 3, 16, 128)).astype(np.float32)

    def norm(w):
        return w / w.sum(-1, keepdims=True)

    def shifted(x):
        return x - x.max(-1, keepdims=True)

    candidates = {
        "softmax": jax.nn.softmax,
        "divide": lambda x: norm(1.0 / (1.0 - shifted(x))),
        "times_reciprocal_sum": lambda x: (
            (w := 1.0 / (1.0 - shifted(x))) * (1.0 / w.sum(-1, keepdims=True))
        ),
        "reciprocal": lambda x: norm(jnp.reciprocal(1.0 - shifted(x))),
        "linear": lambda x: norm(1.0 - shifted(x)),
        "square": lambda x: norm(1.0 + shifted(x) ** 2),
        "abs": lambda x: norm(1.0 + jnp.abs(shifted(x))),
    }
    out = {}
    for name, fn in candidates.items():
        out[f"control_{name}"] = attempt(lambda fn=fn: cost(jax.jit(fn).lower(scores).compile()))
    return out


def _decode_and_library():
    """The decode loop's whole text (its live peak was 12 caches in v1) and jax.nn's
    attention's scratch, at the precision the suite sets."""
    from jaxloops.kvcache import decode_tokens

    b, kv, heads, hd, slots, steps = 3, 6, 6, 33, 512, 7
    queries = jax.ShapeDtypeStruct((b, steps, heads, hd), jnp.float32)
    new = jax.ShapeDtypeStruct((b, steps, kv, hd), jnp.float32)
    cache = jax.ShapeDtypeStruct((b, kv, slots, hd), jnp.float32)

    def decode():
        compiled = decode_tokens.lower(queries, new, new, cache, cache, 0).compile()
        return {**mem(compiled), "text": compiled.as_text()}

    def library():
        q, k = (jax.ShapeDtypeStruct((1, t, 3, 7), jnp.float32) for t in (257, 263))
        compiled = jax.jit(jax.nn.dot_product_attention).lower(q, k, k).compile()
        return {**mem(compiled), "text": compiled.as_text()[:100_000]}

    return {"decode_tokens_B3_K6": attempt(decode), "dot_product_attention": attempt(library)}


def _transformer_scratch():
    import dataclasses

    from jaxloops.measure import step_memory as measured
    from jaxloops.transformer import TransformerConfig

    out = {}
    config = TransformerConfig(13, 2, 30, 10, 5, 21, 11)
    B, T = 6, 7

    def grad_row(c, **kw):
        m = measured.grad_program(c, B, T, **kw)
        return {**mem(m.program), "flops": m.flops, "instructions": m.instructions}

    out["transformer_grad_B6_T7_L2"] = attempt(lambda: grad_row(config))
    out["transformer_grad_B6_T7_L2_micro3"] = attempt(lambda: grad_row(config, micro=3))
    c3 = dataclasses.replace(config, num_layers=3)
    out["transformer_grad_scanned_L3"] = attempt(lambda: grad_row(c3, scanned=True))
    out["transformer_grad_scanned_L3_nothing"] = attempt(
        lambda: grad_row(c3, scanned=True, policy="nothing")
    )
    out["formula_sweep_B6_T7_L2"] = attempt(lambda: measured.formula_sweep(config, [(B, T, 2)]))
    out["library_scratch_bytes"] = attempt(lambda: measured.library_scratch_bytes())

    out["train_step_small_B7_T9"] = attempt(lambda: _step_text(config))
    return out


def _step_text(config):  # the whole text (v1 cut it at TEXT_LIMIT, before its ENTRY ended)
    from jaxloops.data import Batch
    from jaxloops.train import make_optimizer, make_train_step
    from jaxloops.transformer import init_transformer, transformer_loss

    params = init_transformer(jax.random.key(0), config)
    batch = np.random.default_rng(0).integers(0, 13, (7, 9)).astype(np.int32)
    optimizer = make_optimizer(1e-3, 0.1)
    fn = jax.jit(make_train_step(transformer_loss, optimizer))
    state = jax.eval_shape(optimizer.init, params)
    program = fn.lower(params, state, Batch(batch, batch)).compile()
    return {"text": program.as_text(), "cost": cost(program)}


def main():
    report = {"jax": jax.__version__, "backend": jax.default_backend()}
    report["devices"] = [f"{d.platform}:{d.device_kind}" for d in jax.devices()]
    report["cpu_devices"] = attempt(lambda: [str(d) for d in jax.devices("cpu")])
    report["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "")
    report["default_matmul_precision"] = str(jax.config.jax_default_matmul_precision)
    report["start_seconds"] = round(time.time() - START, 2)
    sections = (arrays, numerics, programs, transformer_programs, scratch)
    if sys.argv[1:] == ["scratch"]:  # v2: only the section added after the first run
        sections = (scratch,)
    for section in sections:
        t = time.time()
        if section is scratch:  # at the precision the suite sets (tests/conftest.py)
            with jax.default_matmul_precision("highest"):
                report[section.__name__] = attempt(section)
        else:
            report[section.__name__] = attempt(section)
        report[f"{section.__name__}_seconds"] = round(time.time() - t, 2)
    report["seconds"] = round(time.time() - START, 2)
    json.dump(jsonable(report), sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
