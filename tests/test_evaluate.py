import jax
import numpy as np
import pytest

import jaxloops
from jaxloops import measure

# Jitted once for the module: one compiled program per shape (and batch size or class count)
# instead of one per eager operation and shape.
pad_batches = jax.jit(jaxloops.pad_batches, static_argnums=1)
confusion_matrix = jax.jit(jaxloops.confusion_matrix, static_argnums=2)
mlp_logits = jax.jit(jaxloops.mlp_logits)


def test_padded_batches_count_every_example_exactly_once(digits):
    n = digits.test.x.shape[0]
    batches = pad_batches(digits.test, 97)
    assert n % 97 != 0
    assert batches.x.shape == (-(-n // 97), 97, 64)
    assert int(np.asarray(batches.mask).sum()) == n
    kept = np.asarray(batches.y)[np.asarray(batches.mask)]
    np.testing.assert_array_equal(kept, np.asarray(digits.test.y))


def sk_confusion_matrix(*args, **kwargs):
    # scikit-learn imported here, not at the top: it takes about 1 s, which every test worker
    # would pay while collecting.
    from sklearn.metrics import confusion_matrix

    return confusion_matrix(*args, **kwargs)


def test_jax_confusion_matrix_equals_sklearn():
    rng = np.random.default_rng(7)
    labels, predictions = rng.integers(0, 7, (2, 211), dtype=np.int32)
    ours = confusion_matrix(labels, predictions, 7)
    np.testing.assert_array_equal(ours, sk_confusion_matrix(labels, predictions, labels=range(7)))


def test_evaluate_ignores_padding_and_matches_sklearn(digits, key):
    params = jaxloops.init_mlp(key, (64, 9, 10))
    batches = pad_batches(digits.test, 128)
    predictions, counts = jaxloops.evaluate(jaxloops.mlp_logits, params, batches, 10)
    direct = np.asarray(mlp_logits(params, digits.test.x)).argmax(-1)
    assert int(np.asarray(counts).sum()) == digits.test.x.shape[0]
    np.testing.assert_array_equal(
        counts, sk_confusion_matrix(digits.test.y, direct, labels=range(10))
    )
    np.testing.assert_array_equal(np.asarray(predictions)[np.asarray(batches.mask)], direct)


def test_summaries_of_a_confusion_matrix():
    counts = np.array([[5, 2, 0], [3, 6, 1], [0, 0, 4]])
    assert jaxloops.accuracy_from_confusion(counts) == pytest.approx(15 / 21)
    np.testing.assert_allclose(jaxloops.per_class_accuracy(counts), [5 / 7, 6 / 10, 1.0])
    assert jaxloops.most_confused(counts, 2) == [(1, 0, 3), (0, 1, 2)]
    assert jaxloops.most_confused(np.eye(3, dtype=int), 2) == []


def test_evaluate_compiles_once_across_calls(digits, key):
    batches = pad_batches(digits.test, 113)
    with measure.count_compiles() as log:
        for seed in range(3):
            params = jaxloops.init_mlp(jax.random.fold_in(key, seed), (64, 9, 10))
            jaxloops.evaluate(jaxloops.mlp_logits, params, batches, 10)
    assert log.names.count("jit(evaluate)") == 1


def test_unchecked_confusion_matrix_drops_and_wraps_out_of_range_labels():
    counts = np.asarray(
        confusion_matrix(np.array([0, 3, -1], np.int32), np.array([0, 0, 1], np.int32), 3)
    )
    assert int(counts.sum()) == 2  # label 3 dropped
    assert int(counts[2, 1]) == 1  # label -1 counted as class 2


@pytest.mark.parametrize("labels, match", [([0, 3, 1], "labels .* max 3"), ([0, -1, 1], "min -1")])
def test_checked_confusion_matrix_raises_naming_the_bad_label(labels, match):
    predictions = np.array([0, 1, 2], np.int32)
    with pytest.raises(ValueError, match=match):
        jaxloops.checked_confusion_matrix(np.array(labels, np.int32), predictions, 3)
    good = jaxloops.checked_confusion_matrix(np.array([0, 2, 1], np.int32), predictions, 3)
    np.testing.assert_array_equal(
        good, confusion_matrix(np.array([0, 2, 1], np.int32), predictions, 3)
    )


def test_a_negative_k_is_refused_not_sliced_from_the_end():
    with pytest.raises(ValueError, match="k must be >= 0, got -1"):
        jaxloops.most_confused(np.ones((3, 3), dtype=int), -1)


def test_evaluate_refuses_a_class_count_other_than_the_logits(digits, key):
    # num_classes 7 for 10 logits: predictions 7, 8, 9 would drop out of the counts, and the
    # accuracy would be computed over fewer examples than were evaluated.
    params = jaxloops.init_mlp(key, (64, 5, 10))
    batches = pad_batches(digits.test, 97)
    with pytest.raises(ValueError, match="logits_fn gives 10 classes, num_classes is 7"):
        jaxloops.evaluate(jaxloops.mlp_logits, params, batches, 7)
    _, counts = jaxloops.evaluate(jaxloops.mlp_logits, params, batches, 10)
    assert int(np.asarray(counts).sum()) == digits.test.x.shape[0]


def test_summaries_refuse_an_empty_or_non_square_confusion_matrix():
    with pytest.raises(ValueError, match="counts 0 examples"):
        jaxloops.accuracy_from_confusion(np.zeros((3, 3), np.int32))
    with pytest.raises(ValueError, match=r"square \(C, C\), got shape \(3, 4\)"):
        jaxloops.per_class_accuracy(np.ones((3, 4), np.int32))
    # A class with no examples has no recall: NaN, and the others are still right.
    counts = np.array([[3, 1, 0], [0, 0, 0], [0, 2, 2]])
    np.testing.assert_array_equal(jaxloops.per_class_accuracy(counts), [0.75, np.nan, 0.5])


def test_pad_batches_refuses_labels_of_another_length(digits):
    short = jaxloops.Batch(digits.test.x, digits.test.y[:-3])
    with pytest.raises(ValueError, match="same leading"):
        jaxloops.pad_batches(short, 97)
