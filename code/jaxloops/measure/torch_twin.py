"""The transformer's train step in PyTorch (CPU, eager, float32) beside the JAX one: the same
model, loss and optimizer, loaded from the same parameters, timed in turn (`make bench`).

The twin is chapter 11's model as a PyTorch user writes it: `F.embedding`, `F.rms_norm`,
`F.linear` with each weight stored (out, in) as `nn.Linear` stores it, causal
`F.scaled_dot_product_attention` with `enable_gqa` (query head n reads key/value head
n // G), tanh-approximated `F.gelu` (`jax.nn.gelu`'s default), `F.cross_entropy`, and
`torch.optim.AdamW` with the decay mask of `train.decay_mask` (matrices decay, norm scales do
not). Its weights are a flat dict of tensors, the JAX model's pytree under dotted names,
rather than an `nn.Module`: a module would add bookkeeping, not arithmetic.

torch is imported inside the functions: the package imports without it (CI does not
install it; `make bench` installs requirements-bench.txt).
"""

import dataclasses
import functools
import math
import os
import statistics

import jax
import jax.numpy as jnp
import numpy as np

from jaxloops import processes
from jaxloops.attention import attention
from jaxloops.blockwise import blockwise_attention
from jaxloops.data import Batch
from jaxloops.measure import step_speed
from jaxloops.measure.timing import interleaved_samples, paired_ratio, paired_wins, rounds_needed
from jaxloops.text import VOCAB_SIZE
from jaxloops.train import make_optimizer, make_train_step
from jaxloops.transformer import TransformerConfig, init_transformer, transformer_loss

# The weights every token's activations are multiplied by, with how many leading axes of the
# JAX weight are its input axes: stored (out, in) in the twin, as nn.Linear stores them.
_INPUT_AXES = {"query": 1, "key": 1, "value": 1, "out": 2, "w_in": 1, "w_out": 1, "w": 1}
# Variables that choose or tune a process's allocator: a plain process has none of them.
ALLOCATOR_VARIABLES = ("GLIBC_TUNABLES", "LD_PRELOAD")
ALLOCATOR_PREFIXES = ("MALLOC_",)


@dataclasses.dataclass(frozen=True)
class TorchTwin:
    """The PyTorch model: weights {dotted name: tensor} and the head counts N and K."""

    weights: dict
    num_heads: int  # N
    num_kv_heads: int  # K


def _flat(tree: dict, prefix: str = "") -> dict:
    """{"block_0.attention.query": array, ...} of a nested dict of arrays."""
    out = {}
    for name, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = value
    return out


def _input_axes(name: str) -> int | None:
    return _INPUT_AXES.get(name.rsplit(".", 1)[-1])


def torch_twin(params: dict) -> TorchTwin:
    """The twin of the JAX transformer `params` (`init_transformer`), its weights copied
    into float32 tensors that require gradients."""
    import torch

    weights = {}
    for name, array in _flat(params).items():
        array = np.array(array, np.float32)  # a copy: JAX's buffers stay JAX's
        axes = _input_axes(name)
        if axes is not None:  # (*in, *out) -> (in, out) -> (out, in), contiguous
            array = np.ascontiguousarray(array.reshape(math.prod(array.shape[:axes]), -1).T)
        weights[name] = torch.tensor(array, requires_grad=True)
    _, N, _ = params["block_0"]["attention"]["query"].shape  # (D, N, H)
    _, K, _ = params["block_0"]["attention"]["key"].shape  # (D, K, H)
    return TorchTwin(weights, N, K)


def in_jax_layout(tensors: dict, params: dict) -> dict:
    """Tensors of the twin's names (its weights, or their `.grad`) as NumPy arrays in the
    JAX tree and shapes of `params`: what to compare with JAX's params or gradients."""

    def back(tree, prefix=""):
        out = {}
        for name, value in tree.items():
            if isinstance(value, dict):
                out[name] = back(value, f"{prefix}{name}.")
                continue
            array = tensors[f"{prefix}{name}"].detach().numpy()
            if _input_axes(name) is not None:  # (out, in) -> (in, out) -> (*in, *out)
                array = array.T
            out[name] = array.reshape(value.shape)
        return out

    return back(params)


def _attention(twin: TorchTwin, w: dict, prefix: str, x):
    """Causal GQA attention of norm(x) (B, T, D), projected back to (B, T, D)."""
    import torch.nn.functional as F

    B, T, D = x.shape
    N, K = twin.num_heads, twin.num_kv_heads
    H = w[prefix + "query"].shape[0] // N
    h = F.rms_norm(x, (D,), w[prefix + "norm.scale"], eps=1e-6)
    q = F.linear(h, w[prefix + "query"]).view(B, T, N, H).transpose(1, 2)  # (B, N, T, H)
    k = F.linear(h, w[prefix + "key"]).view(B, T, K, H).transpose(1, 2)  # (B, K, T, H)
    v = F.linear(h, w[prefix + "value"]).view(B, T, K, H).transpose(1, 2)  # (B, K, T, H)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # (B,N,T,H)
    out = out.transpose(1, 2).reshape(B, T, N * H)  # (B, T, N H)
    return F.linear(out, w[prefix + "out"])  # (B, T, D)


def twin_loss(twin: TorchTwin, x, y):
    """Mean next-token cross-entropy of tokens x (B, T) against y (B, T), int64 tensors:
    `transformer_loss` in PyTorch."""
    import torch.nn.functional as F

    w, (B, T) = twin.weights, x.shape
    D = w["norm.scale"].shape[0]
    h = F.embedding(x, w["embed.tokens"]) + w["embed.positions"][:T]  # (B, T, D)
    blocks = sum(name.endswith(".attention.query") for name in w)
    for i in range(blocks):
        h = h + _attention(twin, w, f"block_{i}.attention.", h)
        m = f"block_{i}.mlp."
        inner = F.linear(F.rms_norm(h, (D,), w[m + "norm.scale"], eps=1e-6), w[m + "w_in"])
        h = h + F.linear(F.gelu(inner, approximate="tanh"), w[m + "w_out"])  # (B, T, D)
    logits = F.linear(F.rms_norm(h, (D,), w["norm.scale"], eps=1e-6), w["unembed.w"])
    return F.cross_entropy(logits.reshape(B * T, -1), y.reshape(B * T))  # (B T, V)


def twin_optimizer(twin: TorchTwin, learning_rate: float, weight_decay: float):
    """`torch.optim.AdamW` (its defaults otherwise: betas 0.9, 0.999, eps 1e-8, as optax's
    adamw) with `make_optimizer`'s mask: weight decay on matrices only."""
    import torch

    decay = [t for t in twin.weights.values() if t.ndim >= 2]
    rest = [t for t in twin.weights.values() if t.ndim < 2]
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": rest, "weight_decay": 0.0}]  # fmt: skip
    return torch.optim.AdamW(groups, lr=learning_rate)


def twin_step(twin: TorchTwin, optimizer, x, y):
    """One train step in place: loss, gradients, AdamW update. Returns the loss (detached)."""
    optimizer.zero_grad(set_to_none=True)
    loss = twin_loss(twin, x, y)
    loss.backward()
    optimizer.step()
    return loss.detach()


def _twin_batch(batch: Batch):
    import torch

    return tuple(torch.tensor(np.asarray(a), dtype=torch.int64) for a in (batch.x, batch.y))


def paired_rates(
    sizes: tuple[int, ...],
    key: jax.Array,
    rounds: int,
    learning_rate: float = 1e-3,
    weight_decay: float = 0.1,
    loop_steps: int = 8,
) -> dict:
    """Tokens/s of the JAX train step and of its PyTorch twin at `sizes` (L, D, N, K, F, T,
    B), from the same parameters on one batch of random tokens, timed in `rounds` paired
    rounds (`interleaved_samples`: one untimed call of a step before each timed one).

    The JAX step is chapter 11's: `make_train_step(transformer_loss, make_optimizer(...))`,
    jitted with its params and optimizer state donated, as `fit` donates them; each call
    advances the state, as the twin's step does in place. torch runs with its default
    number of threads (reported). A third step in the same rounds has chapter 8b's
    `blockwise_attention` (default blocks) in every block, the book's answer to the twin's
    flash-style `scaled_dot_product_attention`: how much of the gap is attention. A fourth
    runs the step `loop_steps` to a call in a `lax.scan` (chapter 6's device loop): how much
    is each call's fixed cost (XLA:CPU takes its temporaries from `malloc` every call).

    Returns:
      {"jax_tokens_per_s", "blockwise_tokens_per_s", "torch_tokens_per_s": B T / median
       seconds; "ratio": the median over rounds of torch's seconds over JAX's in the same
       round (JAX's speed over torch's); "blockwise_ratio", "loop_ratio" (and their tokens
       per second): the same for the blockwise and the looped step (its call / `loop_steps`);
       "jax_wins", "wins_needed" (`rounds_needed`), "rounds", "torch_threads",
       "torch_version", "loop_steps", "seconds": {"jax", "blockwise", "loop", "torch": every
       timed call}}.
    """
    import torch

    if len(sizes) != 7 or min(sizes) < 1:
        raise ValueError(f"sizes must be seven positive ints (L, D, N, K, F, T, B), got {sizes}")
    if loop_steps < 1:
        raise ValueError(f"loop_steps must be >= 1, got {loop_steps}")
    params, batch = _model_and_batch(sizes, key)
    twin = torch_twin(params)
    twin_opt = twin_optimizer(twin, learning_rate, weight_decay)
    x, y = _twin_batch(batch)
    optimizer = make_optimizer(learning_rate, weight_decay)
    looped = {"jax": (attention, 1), "blockwise": (blockwise_attention, 1),
              "loop": (attention, loop_steps)}  # fmt: skip
    runs = {
        name: _donating_step(
            functools.partial(transformer_loss, attend=attend), optimizer, params, batch, steps
        )
        for name, (attend, steps) in looped.items()
    }  # each donates its own copy of the parameters: the twin has one too
    runs["torch"] = lambda: twin_step(twin, twin_opt, x, y)
    seconds = interleaved_samples(runs, rounds)
    steps = {name: looped.get(name, (None, 1))[1] for name in seconds}
    return {
        **_paired_summary(seconds, steps, tokens=sizes[-1] * sizes[-2], rounds=rounds),
        "loop_steps": loop_steps,
        "torch_threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
    }


def _paired_summary(seconds: dict, steps: dict, tokens: int, rounds: int) -> dict:
    """`paired_rates`' figures from its samples: {name: every timed call} of calls that take
    `steps[name]` steps each, `tokens` tokens a step."""
    per_step = {n: [t / steps[n] for t in s] for n, s in seconds.items()}
    return {
        **{f"{n}_tokens_per_s": tokens / statistics.median(s) for n, s in per_step.items()},
        "ratio": paired_ratio(seconds["torch"], seconds["jax"]),
        **{
            f"{n}_ratio": paired_ratio(per_step["torch"], per_step[n])
            for n in ("blockwise", "loop")
        },
        "jax_wins": paired_wins(seconds["jax"], seconds["torch"]),
        # Fewer than 7 rounds cannot show a difference at the claim level (`rounds_needed`).
        "wins_needed": rounds_needed(rounds) if rounds >= 7 else None,
        "rounds": rounds,
        "seconds": seconds,
    }


def _model_and_batch(sizes: tuple[int, ...], key: jax.Array) -> tuple[dict, Batch]:
    """Chapter 11's model at `sizes` (L, D, N, K, F, T, B) and one batch of random tokens."""
    L, D, N, K, F, T, B = sizes
    init_key, data_key = jax.random.split(key)
    params = init_transformer(init_key, TransformerConfig(VOCAB_SIZE, L, D, N, K, F, T))
    tokens = jax.random.randint(data_key, (B, T + 1), 0, VOCAB_SIZE)  # (B, T + 1)
    return params, Batch(x=tokens[:, :-1], y=tokens[:, 1:])


def _donating_step(loss_fn, optimizer, params: dict, batch: Batch, steps: int = 1):
    """A call with no arguments that advances its own (params, optimizer state), from a copy
    of `params`, by `steps` jitted `make_train_step(loss_fn, optimizer)` steps on `batch` (more
    than one: in a `lax.scan`, in one call), with both donated, as `fit` donates them."""
    one = make_train_step(loss_fn, optimizer)

    def steps_on(params, state, batch):
        def body(carry, _):
            params, state, _ = one(*carry, batch)
            return (params, state), None

        (params, state), _ = jax.lax.scan(body, (params, state), None, length=steps)
        return params, state

    step = jax.jit(one if steps == 1 else steps_on, donate_argnums=(0, 1))
    own = jax.tree.map(jnp.copy, params)
    state = [own, optimizer.init(own)]

    def call():
        state[0], state[1], *metrics = step(state[0], state[1], batch)
        return state[0], state[1], *metrics

    return call


def plain_env(env: dict | None = None) -> dict:
    """The environment (default: this process's) of a plain process on the CPU: none of the
    variables that choose or tune an allocator (GLIBC_TUNABLES, LD_PRELOAD, MALLOC_*), JAX on
    the CPU with one device (`processes.cpu_env`)."""
    env = processes.cpu_env(1, dict(os.environ if env is None else env))
    return {
        name: value
        for name, value in env.items()
        if name not in ALLOCATOR_VARIABLES and not name.startswith(ALLOCATOR_PREFIXES)
    }


def rates_in_fresh_process(
    sizes: tuple[int, ...], rounds: int, env: dict | None = None, allocator: str | None = None
) -> dict:
    """`paired_rates` at `sizes`, measured in a new process (`jaxloops.workers.torch_twin`)
    with `plain_env(env)`: a plain process (`allocator` None), or one whose glibc is given
    the tunables of `allocator` (a name in `step_speed.ALLOCATORS`), which both steps then
    share; the gap that is left is not the allocator's. Returns the worker's JSON, plus
    "wall": its seconds."""
    process_env = plain_env(env)
    if allocator is not None:
        process_env = step_speed.allocator_env(allocator, process_env)
    return step_speed.run_sized_worker("torch_twin", sizes, rounds, process_env)
