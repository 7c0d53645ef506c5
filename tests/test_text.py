import jax
import numpy as np
import pytest

from jaxloops.text import (
    ALPHABET,
    UNKNOWN,
    VOCAB_SIZE,
    ids_to_text,
    load_stdlib_corpus,
    sample_windows,
    spaced_windows,
    stdlib_files,
    text_to_ids,
)


def test_vocabulary_is_newline_and_printable_ascii():
    assert VOCAB_SIZE == 96
    assert ALPHABET[0] == "\n" and ALPHABET[1:] == "".join(map(chr, range(32, 127)))


def test_encode_decode_round_trip_and_unknown_characters():
    text = "def f(x):\n    return x ** 2  # ~ok"
    ids = text_to_ids(text)
    assert ids.dtype == np.int32 and ids.shape == (len(text),)
    assert ids_to_text(ids) == text
    assert ids_to_text(text_to_ids("a\tb\u00e9\u2192c")) == f"a{UNKNOWN}b{UNKNOWN}{UNKNOWN}c"


def test_decode_rejects_ids_outside_the_vocabulary():
    with pytest.raises(ValueError, match=r"expected \[0, 95\]"):
        ids_to_text([3, VOCAB_SIZE])


def test_corpus_is_a_deterministic_sorted_selection():
    files = stdlib_files()
    names = [f.name for f in files]
    assert names == sorted(names) and not any(n.startswith("_") for n in names)
    num_bytes = 5_000
    first, second = load_stdlib_corpus(num_bytes, 0.2), load_stdlib_corpus(num_bytes, 0.2)
    np.testing.assert_array_equal(first.train, second.train)
    np.testing.assert_array_equal(first.validation, second.validation)
    expected = text_to_ids(files[0].read_bytes()[:num_bytes].decode("utf-8", errors="replace"))
    joined = np.concatenate([first.train, first.validation])
    np.testing.assert_array_equal(joined, expected[: len(joined)])
    assert first.files == tuple(names[: len(first.files)])
    assert len(first.validation) == len(joined) - int(len(joined) * 0.8)


def test_corpus_rejects_bad_arguments():
    with pytest.raises(ValueError, match="validation_fraction"):
        load_stdlib_corpus(1_000, validation_fraction=1.0)
    with pytest.raises(ValueError, match="asked for"):
        load_stdlib_corpus(10**12)


def test_sample_windows_targets_are_the_next_tokens():
    tokens = np.arange(53, dtype=np.int32)  # token i is i, so windows are easy to read
    batch = sample_windows(jax.random.key(3), tokens, steps=5, batch_size=3, seq_len=7)
    x, y = np.asarray(batch.x), np.asarray(batch.y)  # checked in NumPy: nothing to compile
    assert x.shape == y.shape == (5, 3, 7)
    np.testing.assert_array_equal(y, x + 1)
    np.testing.assert_array_equal(np.diff(x, axis=-1), 1)  # contiguous windows
    assert int(y.max()) <= 52


def test_sample_windows_rejects_short_text():
    with pytest.raises(ValueError, match="too short"):
        sample_windows(
            jax.random.key(0), np.arange(7, dtype=np.int32), steps=1, batch_size=1, seq_len=7
        )


def test_spaced_windows_cover_the_text_from_start_to_end():
    tokens = np.arange(101, dtype=np.int32)
    batch = spaced_windows(tokens, seq_len=9, count=5)
    x, y = np.asarray(batch.x), np.asarray(batch.y)  # checked in NumPy: nothing to compile
    assert x.shape == (5, 9)
    assert int(x[0, 0]) == 0 and int(y[-1, -1]) == 100
    np.testing.assert_array_equal(y, x + 1)
    with pytest.raises(ValueError, match="cannot cut"):
        spaced_windows(tokens[:9], seq_len=9, count=1)


def test_the_split_is_named_with_the_module_it_cuts():
    corpus = load_stdlib_corpus(2**15, 0.25)
    path = next(p for p in stdlib_files() if p.name == corpus.split_file)
    module = text_to_ids(path.read_bytes().decode("utf-8", errors="replace"))
    head = corpus.split_offset  # characters of the module that went to training
    assert 0 < head < len(module)  # mid-module for this budget
    np.testing.assert_array_equal(corpus.train[-head:], module[:head])
    np.testing.assert_array_equal(corpus.validation[:50], module[head : head + 50])


def test_empty_windows_are_refused_by_value():
    tokens = np.arange(50, dtype=np.int32)
    with pytest.raises(ValueError, match="got 3, 0, 5"):
        sample_windows(jax.random.key(0), tokens, 3, 0, 5)
    with pytest.raises(ValueError, match="cannot cut 2 windows of 0"):
        spaced_windows(tokens, 0, 2)


def test_windows_refuse_tokens_that_are_not_one_stream():
    rows = np.zeros((3, 50), np.int32)  # (B, n): its rows would be cut as tokens
    with pytest.raises(ValueError, match=r"one stream \(n,\), got shape \(3, 50\)"):
        sample_windows(jax.random.key(0), rows, 2, 3, 5)
    with pytest.raises(ValueError, match=r"one stream \(n,\), got shape \(3, 50\)"):
        spaced_windows(rows, 5, 3)
