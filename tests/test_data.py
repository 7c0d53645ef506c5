import jax
import numpy as np
import pytest

import jaxloops
from jaxloops.data import check_examples


def test_split_is_stratified_and_normalised_with_train_statistics_only():
    split = jaxloops.load_digits_split(seed=0)
    x_train, y_train = np.asarray(split.train.x), np.asarray(split.train.y)
    x_test, y_test = np.asarray(split.test.x), np.asarray(split.test.y)
    assert x_train.shape[1] == x_test.shape[1] == 64
    assert x_train.shape[0] + x_test.shape[0] == 1797
    # Every class keeps (nearly) the same share in both parts.
    np.testing.assert_allclose(
        np.bincount(y_train) / len(y_train), np.bincount(y_test) / len(y_test), atol=0.01
    )
    # Train features are centred; test features are not exactly (other statistics).
    np.testing.assert_allclose(x_train.mean(axis=0), 0.0, atol=1e-5)
    assert np.abs(x_test.mean(axis=0)).max() > 1e-3
    assert np.all(np.isfinite(x_train)) and np.all(np.isfinite(x_test))


def test_epoch_batches_have_fixed_shapes_and_no_repeats(digits, key):
    batches = jaxloops.epoch_batches(key, digits.train, 97)
    steps = digits.train.x.shape[0] // 97
    assert batches.x.shape == (steps, 97, 64) and batches.y.shape == (steps, 97)
    # Each example appears at most once: rows are distinct.
    rows = np.asarray(batches.x).reshape(-1, 64)
    assert len(np.unique(rows, axis=0)) == steps * 97


def test_epoch_batches_reshuffle_with_the_key(digits):
    # the batch size of the test above: one compiled program for both
    a = jaxloops.epoch_batches(jax.random.key(1), digits.train, 97)
    b = jaxloops.epoch_batches(jax.random.key(2), digits.train, 97)
    c = jaxloops.epoch_batches(jax.random.key(1), digits.train, 97)
    assert not np.array_equal(a.y, b.y)
    np.testing.assert_array_equal(a.y, c.y)


def test_ragged_batches_keep_every_example_with_a_shorter_last_batch(digits):
    batches = jaxloops.ragged_batches(digits.test, 100)
    sizes = [b.x.shape[0] for b in batches]
    assert sum(sizes) == digits.test.x.shape[0]
    assert sizes[-1] == digits.test.x.shape[0] % 100 and set(sizes[:-1]) == {100}


@pytest.mark.parametrize("batch_size", [0, -3, 100_000])
def test_bad_batch_size_is_rejected(digits, key, batch_size):
    with pytest.raises(ValueError, match="batch size"):
        jaxloops.epoch_batches(key, digits.train, batch_size)


def test_bad_examples_are_rejected_with_what_was_wrong():
    x, y = np.zeros((5, 64), np.float32), np.arange(5, dtype=np.int32)
    with pytest.raises(ValueError, match="expected \\(examples, 64\\)"):
        check_examples(x[:, :63], y, 64, 10)
    with pytest.raises(ValueError, match="labels span \\[0, 11\\]"):
        check_examples(x, np.array([0, 1, 2, 3, 11], np.int32), 64, 10)
    with pytest.raises(ValueError, match="labels span \\[-1, 3\\]"):
        check_examples(x, np.array([0, 1, 2, 3, -1], np.int32), 64, 10)
    bad = x.copy()
    bad[2, 7] = np.nan
    with pytest.raises(ValueError, match="1 non-finite"):
        check_examples(bad, y, 64, 10)
    with pytest.raises(ValueError, match="integer dtype"):
        check_examples(x, y.astype(np.float32), 64, 10)
    check_examples(x, y, 64, 10)  # and good input passes


def test_to_device_checks_before_copying():
    x, y = np.ones((3, 64), np.float32), np.array([0, 1, 12], np.int32)
    with pytest.raises(ValueError, match="labels span"):
        jaxloops.to_device(jaxloops.Batch(x, y), 64, 10)
    batch = jaxloops.to_device(jaxloops.Batch(x, y % 10), 64, 10)
    assert isinstance(batch.x, jax.Array) and batch.x.shape == (3, 64)


def test_by_default_examples_are_checked_as_the_digits_and_the_mlp_spans_them():
    x, y = np.ones((3, 64), np.float32), np.array([0, 9, 10], np.int32)
    with pytest.raises(ValueError, match="labels span \\[0, 10\\]"):  # class 10: no digit
        jaxloops.to_device(jaxloops.Batch(x, y))
    with pytest.raises(ValueError, match="expected \\(examples, 64\\)"):
        jaxloops.to_device(jaxloops.Batch(np.ones((3, 63), np.float32), y % 10))
    split = jaxloops.load_digits_split(seed=0)
    assert split.train.x.shape[1] == jaxloops.data.NUM_FEATURES == 64
    assert set(np.unique(split.train.y)) == set(range(jaxloops.data.NUM_CLASSES))
    sizes = jaxloops.experiment_sizes("cpu")
    for part in (sizes.loop, sizes.sharding):
        assert part.widths == (64, *part.hidden, 10)


def test_an_empty_training_set_is_named_as_such(key):
    empty = jaxloops.Batch(np.zeros((0, 64), np.float32), np.zeros((0,), np.int32))
    with pytest.raises(ValueError, match="empty"):
        jaxloops.to_device(empty, 64, 10)
    with pytest.raises(ValueError, match="empty"):
        jaxloops.epoch_batches(key, empty, 8)
    with pytest.raises(ValueError, match="empty"):
        jaxloops.pad_batches(empty, 8)


def test_a_validation_split_is_held_out_of_training_apart_from_the_test_set():
    plain = jaxloops.load_digits_split(seed=0)
    split = jaxloops.load_digits_split(seed=0, validation_fraction=0.1)
    sets = {name: np.asarray(getattr(split, name).x) for name in ("train", "validation", "test")}
    assert {name: len(x) for name, x in sets.items()} == {
        "train": 1797 - 450 - 180,
        "validation": 180,
        "test": 450,
    }
    # The same test examples as without validation, and the validation examples come out of
    # the training ones. The 1797 images are distinct, and the three sets are normalised
    # alike, so no row may appear in two of them.
    np.testing.assert_array_equal(split.test.y, plain.test.y)
    np.testing.assert_array_equal(
        np.bincount(split.train.y) + np.bincount(split.validation.y), np.bincount(plain.train.y)
    )
    rows = np.concatenate(list(sets.values()))
    assert len(np.unique(rows, axis=0)) == len(rows) == 1797
    # Stratified; normalised with the remaining training examples' statistics only.
    shares = [np.bincount(getattr(split, n).y) / len(getattr(split, n).y) for n in sets]
    np.testing.assert_allclose(shares[0], shares[1], atol=0.02)
    np.testing.assert_allclose(sets["train"].mean(axis=0), 0.0, atol=1e-5)
    assert np.abs(sets["validation"].mean(axis=0)).max() > 1e-3
    assert plain.validation is None


@pytest.mark.parametrize(
    "test_fraction, validation_fraction, match",
    [
        (0.25, 0.75, "leaves 0 of 1797 examples for training"),
        (0.5, 0.495, "leaves 8 of 1797 examples for training"),
        (0.25, 0.002, "holds out 4 examples, fewer than the 10 classes"),
        (0.25, 1.0, "validation_fraction in \\[0, 1\\)"),
        (0.25, float("nan"), "nan"),
    ],
)
def test_a_validation_split_that_leaves_no_training_data_is_rejected(
    test_fraction, validation_fraction, match
):
    with pytest.raises(ValueError, match=match):
        jaxloops.load_digits_split(0, test_fraction, validation_fraction)


def test_a_kept_split_is_read_back_equal_and_nothing_is_kept_unless_asked(tmp_path, monkeypatch):
    monkeypatch.delenv("JAXLOOPS_DATA_CACHE", raising=False)
    made = jaxloops.load_digits_split(seed=3, validation_fraction=0.1)
    assert not any(tmp_path.iterdir())
    monkeypatch.setenv("JAXLOOPS_DATA_CACHE", str(tmp_path))
    written = jaxloops.load_digits_split(3, validation_fraction=0.1)  # made, then kept
    kept = sorted(p.name for p in tmp_path.iterdir())
    assert len(kept) == 1 and kept[0].startswith("load_digits_split-3-0.25-0.1-sklearn")
    read = jaxloops.load_digits_split(seed=3, validation_fraction=0.1)  # read back
    for split in (written, read):
        for name in ("train", "test", "validation"):
            for axis in ("x", "y"):
                mine, want = getattr(getattr(split, name), axis), getattr(getattr(made, name), axis)
                assert mine.dtype == want.dtype
                np.testing.assert_array_equal(mine, want)
    # Other arguments are another file; a split without validation reads back without one.
    other = jaxloops.load_digits_split(seed=4)
    assert len(list(tmp_path.iterdir())) == 2
    again = jaxloops.load_digits_split(seed=4)
    assert again.validation is None is other.validation
    np.testing.assert_array_equal(again.test.y, other.test.y)
    assert not np.array_equal(other.test.y, made.test.y)  # another seed, another split


def test_a_kept_split_is_made_again_when_its_function_changes(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXLOOPS_DATA_CACHE", str(tmp_path))
    ones = jaxloops.Batch(np.ones((2, 3), np.float32), np.ones(2, np.int32))

    def make(seed):
        return jaxloops.data.Split(ones, ones)

    first = jaxloops.data.kept_in_data_cache(make)(0)

    def make(seed):  # noqa: F811 - the same name and arguments, another body
        return jaxloops.data.Split(ones, jaxloops.Batch(ones.x * 2, ones.y))

    second = jaxloops.data.kept_in_data_cache(make)(0)
    assert len(list(tmp_path.iterdir())) == 2
    np.testing.assert_array_equal(first.test.x, ones.x)
    np.testing.assert_array_equal(second.test.x, 2 * ones.x)


def test_batches_refuse_labels_of_another_length_instead_of_clamping(digits, key):
    # Indexed on the device, labels 3 shorter than the features would be read out of
    # bounds, which JAX clamps: the last examples would get the last label, silently.
    short = jaxloops.Batch(digits.train.x, digits.train.y[:-3])
    n = digits.train.x.shape[0]
    with pytest.raises(
        ValueError, match=rf"same leading \(examples\) axis, got \[\({n}, 64\), \({n - 3},\)\]"
    ):
        jaxloops.epoch_batches(key, short, 97)
    with pytest.raises(ValueError, match="same leading"):
        jaxloops.ragged_batches(short, 100)
