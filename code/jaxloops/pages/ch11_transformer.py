"""Chapter 11's figures, derived from its corpus, its training run and its decoders."""

import lzma
import math

import numpy as np


def corpus_figures(corpus, unknown_id: int) -> dict:
    """The corpus's files, split and sizes, and the share of training characters that are
    the unknown character `unknown_id` (in %)."""
    train, validation = len(corpus.train), len(corpus.validation)
    return {
        "python": corpus.python_version,
        "modules": len(corpus.files),
        "first_file": corpus.files[0],
        "last_file": corpus.files[-1],
        "split_file": corpus.split_file,
        "split_offset": int(corpus.split_offset),
        "train_chars": int(train),
        "val_chars": int(validation),
        "val_share": 100 * validation / (train + validation),
        "unknown_share": float(100 * np.mean(corpus.train == unknown_id)),
    }


def model_figures(lm_sizes, config, parameters: int) -> dict:
    """The model's sizes as the page names them (from the sizes the config was built from)."""
    fields = {
        "layers": "num_layers",
        "model_dim": "model_dim",
        "heads": "num_heads",
        "kv_heads": "num_kv_heads",
        "hidden_dim": "hidden_dim",
        "seq_len": "max_len",
        "batch_size": "batch_size",
    }
    figures = {name: int(getattr(lm_sizes, field)) for name, field in fields.items()}
    return {
        **figures,
        "params": int(parameters),
        "head_dim": config.head_dim,
        "group": config.num_heads // config.num_kv_heads,
    }


def probe_curves(history, before: dict):
    """The hook's epochs (0 for `before`, the losses before training) and, per probe, its loss
    at each of them."""
    epochs = np.array([0] + [epoch for epoch, _ in history.hooks])
    curves = {
        name: np.array([float(before[name])] + [float(r[name]) for _, r in history.hooks])
        for name in before
    }
    return epochs, curves


def compressed_bits(text: str) -> float:
    """Bits per character that xz (LZMA, preset 9) needs for the ASCII `text`."""
    data = text.encode("ascii")
    if not data:
        raise ValueError("text is empty: no bits per character")
    return 8 * len(lzma.compress(data, preset=9)) / len(data)


def gap_words(seen_gap: float, module_gap: float) -> tuple[str, str]:
    """The page's words for the gap between seen and unseen windows, and between modules
    (a gap within 0.05 nats is no gap)."""
    module_word = (
        "the validation modules are easier for this model than the training modules"
        if module_gap < -0.05
        else "the validation modules are other code in another style"
        if module_gap > 0.05
        else "the validation modules are about as hard for this model as the training modules"
    )
    gap_word = (
        "the model fits windows it has trained on better than unseen windows of the same modules"
        if seen_gap > 0.05
        else "the model does no better on windows it has seen"
    )
    return gap_word, module_word


def training_figures(curves: dict, vocab_size: int) -> dict:
    """Initial and final losses of the three probes, their gaps, in nats and bits."""
    final = {name: float(curve[-1]) for name, curve in curves.items()}
    seen_gap = final["unseen train text"] - final["trained windows"]
    module_gap = final["validation"] - final["unseen train text"]
    seen_gap_word, module_gap_word = gap_words(seen_gap, module_gap)
    return {
        "initial_loss": float(curves["validation"][0]),
        "ln_v": math.log(vocab_size),
        "trained_loss": final["trained windows"],
        "unseen_loss": final["unseen train text"],
        "val_loss": final["validation"],
        "val_bits": final["validation"] / math.log(2),
        "seen_gap": seen_gap,
        "module_gap": module_gap,
        "uniform_bits": math.log2(vocab_size),
        "seen_gap_word": seen_gap_word,
        "module_gap_word": module_gap_word,
    }


def indent_verdict(trained_share: float, corpus_share: float) -> str:
    """Whether the samples indent in fours as often as the corpus, within 10 points."""
    if trained_share >= corpus_share - 0.1:
        return "within 10 points of the corpus: the model has learned to indent in fours"
    return "far below the corpus: the model writes indented lines, but not yet in steps of four"


def map_figures(reads: dict) -> dict:
    """The head's shares of strongest reads (symbol, then local) against chance, in %."""
    (symbol_share, symbol_chance), (local_share, local_chance) = reads.values()
    return {
        "map_symbol_share": float(100 * symbol_share),
        "map_symbol_chance": float(100 * symbol_chance),
        "map_symbol_lift": float(symbol_share / symbol_chance),
        "map_local_share": float(100 * local_share),
        "map_local_chance": float(100 * local_chance),
        "map_local_lift": float(local_share / local_chance),
    }


def decode_speed_figures(
    cached_rate: float, recompute_rate: float, flops_decode: float, flops_full: float, batch: int
) -> dict:
    """The two decoders' token rates, the speed-up against the FLOP ratio, and the rate
    (GFLOP/s) each decoder's step computes at: speed-up = FLOP ratio x ratio of the rates."""
    speedup, flops_ratio = cached_rate / recompute_rate, flops_full / flops_decode
    cached_gflops = flops_decode * cached_rate / batch / 1e9  # FLOPs per step x steps per s
    recompute_gflops = flops_full * recompute_rate / batch / 1e9
    why = (
        f"Per step, the cached decoder computed at {cached_gflops:.2f} GFLOP/s and the "
        f"recomputing one at {recompute_gflops:.2f} GFLOP/s: the speed-up is the FLOP ratio "
        f"times the ratio of those rates, {cached_gflops / recompute_gflops:.2f}. This page "
        f"does not measure what sets either rate."
    )
    return {
        "cached_rate": float(cached_rate),
        "recompute_rate": float(recompute_rate),
        "speedup": float(speedup),
        "flops_ratio": float(flops_ratio),
        "below_above": "below" if speedup < flops_ratio else "above",
        "below_above_why": why,
    }


def entropy_bits(probs) -> float:
    """Mean entropy in bits of rows of probabilities (..., V); 0 log 0 counts as 0."""
    p = np.asarray(probs)
    logs = np.log2(np.where(p > 0, p, 1.0))
    return float(-(p * logs).sum(-1).mean())


def exercise_figures(
    initial_loss: float, final_loss: float, vocab_size: int, xz_bits: float
) -> dict:
    """Exercise 11's perplexities and ratios, from losses in nats per character."""
    return {
        "ex_perplexity": math.exp(final_loss),
        "ex_initial_perplexity": math.exp(initial_loss),
        "ex_initial_ratio": math.exp(initial_loss) / vocab_size,
        "ex_xz_nats": xz_bits * math.log(2),
        "ex_ascii_ratio": 8 / (final_loss / math.log(2)),
    }
