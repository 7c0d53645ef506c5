"""The PyTorch twin of chapter 11's transformer computes the JAX model's loss, gradients and
AdamW step from the same parameters, within float32 rounding; a wrong twin is rejected."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="torch is installed for `make bench` only (requirements-bench.txt); CI has none"
)

from jaxloops.data import Batch  # noqa: E402
from jaxloops.measure import step_speed, torch_twin  # noqa: E402
from jaxloops.memory import close_within, rounding_terms  # noqa: E402
from jaxloops.text import VOCAB_SIZE  # noqa: E402
from jaxloops.train import make_optimizer, make_train_step  # noqa: E402
from jaxloops.transformer import TransformerConfig, init_transformer, transformer_loss  # noqa: E402
from jaxloops.workers import torch_twin as worker  # noqa: E402

SIZES = (2, 12, 6, 2, 20, 7, 5)  # L, D, N, K (G = 3), F, T, B
L, D, N, K, F, T, B = SIZES
CONFIG = TransformerConfig(VOCAB_SIZE, L, D, N, K, F, T)
# n of the bound n eps max|reference| between two float32 evaluations that round differently:
# the contraction lengths the loss and its gradient pass through (`memory.rounding_terms`).
TERMS = rounding_terms(CONFIG, T)
LEARNING_RATE, WEIGHT_DECAY = 1e-3, 0.1  # `step_speed.step_programs`'s AdamW


@pytest.fixture(scope="module")
def setup():
    init_key, data_key = jax.random.split(jax.random.key(7))
    params = init_transformer(init_key, CONFIG)
    tokens = jax.random.randint(data_key, (B, T + 1), 0, VOCAB_SIZE)  # (B, T + 1)
    batch = Batch(x=tokens[:, :-1], y=tokens[:, 1:])
    x, y = (torch.tensor(np.asarray(a), dtype=torch.int64) for a in batch)
    return params, batch, x, y


def loss_and_grads(params, x, y):
    twin = torch_twin.torch_twin(params)
    loss = torch_twin.twin_loss(twin, x, y)
    loss.backward()
    grads = {name: w.grad for name, w in twin.weights.items()}
    return loss.item(), torch_twin.in_jax_layout(grads, params)


def test_the_twin_has_the_jax_models_loss_and_gradients(setup):
    params, batch, x, y = setup
    (want, _), want_grads = jax.jit(jax.value_and_grad(transformer_loss, has_aux=True))(
        params, batch
    )
    loss, grads = loss_and_grads(params, x, y)
    assert close_within(want, loss, TERMS)["ok"]
    assert close_within(want_grads, grads, TERMS)["ok"]
    # The twin's layout round-trips exactly to the JAX tree.
    back = torch_twin.in_jax_layout(torch_twin.torch_twin(params).weights, params)
    assert jax.tree.all(jax.tree.map(np.array_equal, back, jax.device_get(params)))
    # A known-wrong twin: block 1's output projection transposed (its (N H, D) is square).
    wrong = jax.tree.map(lambda a: a, params)
    out = np.asarray(params["block_1"]["attention"]["out"])  # (N, H, D)
    wrong["block_1"]["attention"]["out"] = jnp.asarray(out.reshape(D, D).T.reshape(out.shape))
    wrong_loss, _ = loss_and_grads(wrong, x, y)
    assert not close_within(want, wrong_loss, TERMS)["ok"]


def test_one_adamw_step_gives_the_jax_steps_new_loss(setup):
    params, batch, x, y = setup
    optimizer = make_optimizer(LEARNING_RATE, WEIGHT_DECAY)

    @jax.jit
    def losses(params, opt_state, batch):  # one program: the loss before and after a step
        stepped, _, metrics = make_train_step(transformer_loss, optimizer)(params, opt_state, batch)
        return metrics["loss"], transformer_loss(stepped, batch)[0]

    def twin_new_loss(learning_rate):
        twin = torch_twin.torch_twin(params)
        twin_optimizer = torch_twin.twin_optimizer(twin, learning_rate, WEIGHT_DECAY)
        torch_twin.twin_step(twin, twin_optimizer, x, y)
        with torch.no_grad():
            return torch_twin.twin_loss(twin, x, y).item()

    before, want = losses(params, optimizer.init(params), batch)
    assert want < before  # the step moved the loss, which a wrong step can get wrong
    assert close_within(want, twin_new_loss(LEARNING_RATE), TERMS)["ok"]
    # A known-wrong step: twice the learning rate.
    assert not close_within(want, twin_new_loss(2 * LEARNING_RATE), TERMS)["ok"]


def test_the_worker_prints_paired_rates_from_their_own_samples(capsys):
    with pytest.raises(ValueError, match="seven positive ints"):
        torch_twin.paired_rates((1, 8, 2), jax.random.key(0), rounds=1)
    with pytest.raises(ValueError, match="loop_steps must be >= 1, got 0"):
        torch_twin.paired_rates((1, 8, 2, 1, 12, 5, 3), jax.random.key(0), 1, loop_steps=0)
    worker.main(["--sizes", "1,8,2,1,12,5,3", "--rounds", "3"])  # B T = 15 tokens a step
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    jax_s, torch_s = r["seconds"]["jax"], r["seconds"]["torch"]
    blockwise_s = r["seconds"]["blockwise"]
    assert len(jax_s) == len(torch_s) == len(blockwise_s) == r["rounds"] == 3
    assert r["jax_tokens_per_s"] == pytest.approx(15 / np.median(jax_s))
    assert r["blockwise_tokens_per_s"] == pytest.approx(15 / np.median(blockwise_s))
    assert r["torch_tokens_per_s"] == pytest.approx(15 / np.median(torch_s))
    assert r["ratio"] == pytest.approx(np.median(np.array(torch_s) / np.array(jax_s)))
    assert r["blockwise_ratio"] == pytest.approx(
        np.median(np.array(torch_s) / np.array(blockwise_s))
    )
    # The looped step: a call of loop_steps steps, reported a step
    loop_s = np.array(r["seconds"]["loop"]) / r["loop_steps"]
    assert len(loop_s) == 3 and r["loop_steps"] == 8
    assert r["loop_tokens_per_s"] == pytest.approx(15 / np.median(loop_s))
    assert r["loop_ratio"] == pytest.approx(np.median(np.array(torch_s) / loop_s))
    assert r["loop_ratio"] != pytest.approx(np.median(np.array(torch_s) / (8 * loop_s)))
    assert r["jax_wins"] == sum(j < t for j, t in zip(jax_s, torch_s))
    assert r["wins_needed"] is None  # 3 rounds cannot show a difference at the claim level
    assert r["torch_threads"] == torch.get_num_threads()


def test_a_plain_process_has_no_allocator_variables():
    parent = {"PATH": "/bin", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1", "LD_PRELOAD": "x.so",
              "MALLOC_ARENA_MAX": "1", "MALLOC_TRIM_THRESHOLD_": "0",
              "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}  # fmt: skip
    env = torch_twin.plain_env(parent)
    assert env == {"PATH": "/bin", "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu"}
    assert parent["MALLOC_ARENA_MAX"] == "1"  # the parent's environment is left alone


def test_the_kept_memory_run_sets_only_its_tunables(monkeypatch):
    seen = {}

    def fake_run(command, env, **kwargs):
        seen["env"] = env
        return type("Done", (), {"returncode": 0, "stdout": '{"ratio": 1.0}\n', "stderr": ""})()

    monkeypatch.setattr(step_speed.subprocess, "run", fake_run)  # its workers run there
    parent = {"PATH": "/bin", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    plain = torch_twin.rates_in_fresh_process((1, 8, 2, 1, 12, 5, 3), 3, env=parent)
    assert plain["ratio"] == 1.0 and "GLIBC_TUNABLES" not in seen["env"]
    torch_twin.rates_in_fresh_process(
        (1, 8, 2, 1, 12, 5, 3), 3, env=parent, allocator="memory kept"
    )
    set_ = dict(t.split("=") for t in seen["env"]["GLIBC_TUNABLES"].split(":"))
    assert set_ == step_speed.ALLOCATORS["memory kept"]  # the parent's hugetlb=1 is not kept
    with pytest.raises(ValueError, match="'kept'"):
        torch_twin.rates_in_fresh_process((1, 8, 2, 1, 12, 5, 3), 3, allocator="kept")
