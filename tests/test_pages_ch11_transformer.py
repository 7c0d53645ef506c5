"""Chapter 11's figures: each derived from known inputs, and each wrong input rejected."""

import math

import numpy as np
import pytest

import jaxloops
from jaxloops.loop import History
from jaxloops.measure import lm_figures
from jaxloops.text import Corpus

PROBES = ("trained windows", "unseen train text", "validation")


def test_corpus_figures_count_the_split_and_the_unknown_characters():
    corpus = Corpus(
        train=np.array([5, 0, 5, 5, 0, 5, 5, 5]),
        validation=np.array([5, 5]),
        files=["a.py", "b.py", "c.py"],
        split_file="c.py",
        split_offset=7,
        python_version="3.11.9",
    )
    figures = lm_figures.corpus_figures(corpus, unknown_id=0)
    assert figures["modules"] == 3 and figures["last_file"] == "c.py"
    assert (figures["train_chars"], figures["val_chars"], figures["val_share"]) == (8, 2, 20.0)
    assert figures["unknown_share"] == 25.0  # 2 of 8, not of all 10 characters


def test_model_figures_name_the_config_s_sizes():
    sizes = jaxloops.experiment_sizes().lm
    config = jaxloops.TransformerConfig.from_sizes(sizes, 11)
    figures = lm_figures.model_figures(sizes, config, 1234)
    assert figures["layers"] == config.num_layers and figures["seq_len"] == config.max_len
    assert figures["group"] * config.num_kv_heads == config.num_heads
    assert figures["params"] == 1234


def test_probe_curves_put_the_loss_before_training_first():
    history = History(train={}, hooks=[(1, {"a": 2.0}), (2, {"a": 1.0})])
    epochs, curves = lm_figures.probe_curves(history, {"a": 3.0})
    assert list(epochs) == [0, 1, 2] and list(curves["a"]) == [3.0, 2.0, 1.0]


def test_training_figures_take_gaps_in_the_right_order():
    curves = {
        "trained windows": [4.0, 1.0],
        "unseen train text": [4.0, 1.5],
        "validation": [4.2, 1.2],
    }
    figures = lm_figures.training_figures(curves, 64)
    assert figures["seen_gap"] == 0.5 and figures["module_gap"] == pytest.approx(-0.3)
    assert figures["initial_loss"] == 4.2 and figures["val_bits"] == 1.2 / math.log(2)
    assert "better than unseen" in figures["seen_gap_word"]
    assert "easier" in figures["module_gap_word"]
    assert lm_figures.gap_words(0.0, 0.0) == (
        "the model does no better on windows it has seen",
        "the validation modules are about as hard for this model as the training modules",
    )
    assert "another style" in lm_figures.gap_words(0.0, 0.1)[1]


def test_compressed_bits_find_repetition_and_refuse_empty_text():
    assert (
        lm_figures.compressed_bits("ab" * 5000)
        < 0.1
        < lm_figures.compressed_bits("".join(chr(33 + (i * 7919) % 90) for i in range(10000)))
    )
    with pytest.raises(ValueError, match="empty"):
        lm_figures.compressed_bits("")


def test_indent_verdict_allows_ten_points():
    assert "learned" in lm_figures.indent_verdict(0.85, 0.94)
    assert "far below" in lm_figures.indent_verdict(0.83, 0.94)


def test_map_figures_keep_symbol_and_local_apart():
    figures = lm_figures.map_figures({"symbol": (0.5, 0.25), "local": (0.3, 0.1)})
    assert figures["map_symbol_share"] == 50.0 and figures["map_symbol_lift"] == 2.0
    assert figures["map_local_chance"] == 10.0 and figures["map_local_lift"] == pytest.approx(3)


def test_decode_speed_figures_split_the_speedup():
    figures = lm_figures.decode_speed_figures(300.0, 100.0, 1e6, 5e6, batch=2)
    assert figures["speedup"] == 3.0 and figures["flops_ratio"] == 5.0
    assert figures["below_above"] == "below"
    assert "0.15 GFLOP/s and the recomputing one at 0.25" in figures["below_above_why"]
    assert "0.60" in figures["below_above_why"]  # 3 = 5 x 0.6
    assert lm_figures.decode_speed_figures(600.0, 100.0, 1e6, 5e6, 2)["below_above"] == "above"


def test_entropy_and_exercise_figures():
    assert lm_figures.entropy_bits([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]]) == 0.5
    figures = lm_figures.exercise_figures(math.log(64), 2 * math.log(2), 64, xz_bits=2.0)
    assert figures["ex_initial_ratio"] == pytest.approx(1.0)
    assert figures["ex_perplexity"] == pytest.approx(4.0) and figures["ex_ascii_ratio"] == 4.0
    assert figures["ex_xz_nats"] == 2 * math.log(2)
