import functools

import jax
import numpy as np
import pytest

import jaxloops
from jaxloops import checkpoint, validation


def replay(values, patience):
    """early_stopping's records for a hook that returns these validation losses in turn."""
    losses = iter(values)
    hook = validation.early_stopping(
        lambda e, p, s: {"val_loss": next(losses)}, "val_loss", patience
    )
    records = []
    for epoch in range(1, len(values) + 1):
        records.append(hook(epoch, None, None))
        if records[-1].get("stop"):
            break
    return records


def test_early_stopping_stops_after_patience_calls_without_a_new_best():
    records = replay([3.0, 2.0, 2.5, 2.0, 2.4, 1.0, 0.5], patience=3)
    # 2.0 at epoch 2; epochs 3, 4 (a tie is no improvement) and 5 do not beat it: stop at 5.
    assert len(records) == 5 and records[-1]["stop"] is True
    assert [r["best_epoch"] for r in records] == [1, 2, 2, 2, 2]
    assert not any(r.get("stop") for r in records[:-1])
    # One step later to stop, or one earlier, would be a different record.
    assert len(replay([3.0, 2.0, 2.5, 2.0, 2.4, 1.0, 0.5], patience=4)) == 7
    assert len(replay([3.0, 2.0, 2.5, 2.0, 2.4, 1.0, 0.5], patience=2)) == 4


def test_early_stopping_rejects_a_bad_patience_and_a_missing_metric():
    with pytest.raises(ValueError, match="patience must be >= 1 call, got 0"):
        validation.early_stopping(lambda e, p, s: {}, "val_loss", 0)
    hook = validation.early_stopping(lambda e, p, s: {"loss": 1.0}, "val_loss", 2)
    with pytest.raises(ValueError, match="not 'val_loss'"):
        hook(1, None, None)


def test_validation_runs_without_dropout(digits, key):
    params = jaxloops.init_mlp(key, (64, 13, 10))
    dropped = functools.partial(jaxloops.mlp_loss, dropout_rate=0.5)
    metrics = validation.validation_metrics(dropped, digits.test)
    first = metrics(params)
    assert (
        metrics(params)
        == first
        == validation.validation_metrics(jaxloops.mlp_loss, digits.test)(params)
    )
    assert set(first) == {"val_loss", "val_accuracy"}
    # With a key the same loss does drop units: the equality above is not vacuous.
    assert float(jax.jit(dropped)(params, digits.test, jax.random.key(0))[0]) != first["val_loss"]


def test_fit_stops_early_and_the_best_checkpoint_is_kept_and_restored(digits, key, tmp_path):
    init = jaxloops.init_mlp(key, (64, 13, 10))
    optimizer = jaxloops.make_optimizer(3e-2, 0.0)  # fast enough to overfit in a few epochs
    train_step = jaxloops.make_train_step(jaxloops.mlp_loss, optimizer)
    # Sliced on the host: an eager slice would compile one program per shape.
    small = jaxloops.Batch(*(jax.device_put(np.asarray(a)[:200]) for a in digits.train))
    metrics = validation.validation_metrics(jaxloops.mlp_loss, digits.test)
    manager = checkpoint.checkpoint_manager(tmp_path, keep_last=1, best_metric="val_loss")
    hook = validation.early_stopping(
        checkpoint.checkpoint_hook(manager, key, evaluate=metrics), "val_loss", patience=2
    )
    params, opt_state, history = jaxloops.fit(
        key, init, optimizer.init(init), train_step, small, batch_size=50, epochs=40,
        epochs_per_call=1, hook=hook,
    )  # fmt: skip
    epochs_run = len(history.train["loss"])
    losses = {epoch: record["val_loss"] for epoch, record in history.hooks}
    best = min(losses, key=losses.get)
    assert epochs_run < 40 and history.hooks[-1][1]["stop"] and history.hooks[-1][0] == epochs_run
    assert history.hooks[-1][1]["best_epoch"] == best == epochs_run - 2
    manager.wait_until_finished()
    assert sorted(manager.all_steps()) == [best, epochs_run]  # the last and the best
    restored = validation.restore_step(manager, best, key, params, opt_state)
    assert metrics(restored["params"]) == {
        k: losses[best] if k == "val_loss" else v
        for k, v in history.hooks[best - 1][1].items()
        if k.startswith("val_")
    }
    assert metrics(params)["val_loss"] != losses[best]  # the last is not the best
    with pytest.raises(ValueError, match=f"no checkpoint of step {best - 1}"):
        validation.restore_step(manager, best - 1, key, params, opt_state)


def test_seeds_separate_only_when_their_ranges_do_not_overlap():
    assert validation.seeds_separate([1.0, 1.2, 1.1], [1.3, 1.5])
    assert validation.seeds_separate([1.3, 1.5], [1.0, 1.2, 1.1])
    assert not validation.seeds_separate([1.0, 1.4, 1.1], [1.3, 1.5])  # one run overlaps
    assert not validation.seeds_separate([1.0, 1.3], [1.3, 1.5])  # a tie is no separation
    with pytest.raises(ValueError, match="at least 2 runs"):
        validation.seeds_separate([1.0], [2.0, 3.0])
    # Five against five: 2 of the 252 orderings; checked by counting every ordering.
    import itertools

    orders = list(itertools.combinations(range(10), 5))
    apart = sum(1 for c in orders if set(c) in ({0, 1, 2, 3, 4}, {5, 6, 7, 8, 9}))
    assert validation.chance_of_separation(5, 5) == apart / len(orders) == 2 / 252
