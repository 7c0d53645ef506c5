"""Chapter 6's page: what the fetch experiment's rounds say against their predictions, and
what its matmul ceiling measured on each backend (book/06_device_loop.md)."""

import dataclasses
import statistics

from jaxloops.measure.throughput import predicted_step_seconds, turns_verdict
from jaxloops.measure.timing import paired_ratio

# The runs of `measure.overlap_drivers`, by name.
EVERY, NEVER, SCAN = "fetch every step", "never fetch", "scan, data on device"
HOST, FED = "host work alone", "steps alone, never fetch"
FED_FETCH = "steps alone, fetch every step"


def every_k(k: int) -> str:
    """The name `overlap_drivers` gives the driver that fetches every k steps."""
    return f"fetch every {k} steps"


@dataclasses.dataclass(frozen=True)
class FetchFigures:
    """What the rounds of the fetch experiment measured, per step, and what its parts predict.

    measured: {run: median seconds per step}; predicted: {fed driver: seconds per step}
    (`predicted_step_seconds`); ratios: {name: (measured, predicted)}, each measured ratio the
    median over rounds of the two runs' ratio in the same round; turns: fetching every step
    over h + d_f, the same way; h, d, d_f: the controls (host work alone; steps alone, never
    fetched; fetched every step); c: the call that dispatches a step.
    """

    k: int
    measured: dict
    predicted: dict
    ratios: dict
    turns: float
    shares: tuple
    c: float

    @property
    def h(self) -> float:
        return self.measured[HOST]

    @property
    def d(self) -> float:
        return self.measured[FED]

    @property
    def d_f(self) -> float:
        return self.measured[FED_FETCH]

    def glued(self) -> dict[str, float]:
        """The figures the page quotes, by glue name (without the chapter's prefix): times in
        ms per step, shares as fractions, `gain_pred` in %; `k_way` says where fetching every
        k steps sits between never (0) and every step (1), measured and predicted."""
        times = dict(zip(("every", "every_k", "never", "scan"), self.measured.values()))
        predicted = dict(zip(("every", "every_k", "never"), self.predicted.values()))
        gap = lambda t: t["every"] - t["never"]
        way = lambda t: (t["every_k"] - t["never"]) / gap(t) if gap(t) > 0 else float("nan")
        values = {
            "h_ms": 1e3 * self.h, "d_ms": 1e3 * self.d, "df_ms": 1e3 * self.d_f,
            "c_ms": 1e3 * self.c, "fetch_ms": 1e3 * (self.d_f - self.d),
            "h_over_d": self.h / self.d, "fed_over_scan": self.d / times["scan"],
            "host_share": self.shares[0], "device_share": self.shares[1],
            "gain_pred": 100 * (1 - predicted["never"] / predicted["every"]),
            "every_over_turns": self.turns,
            "k_way": way(times), "k_way_pred": way(predicted),
        }  # fmt: skip
        values |= {f"{name}_ms": 1e3 * t for name, t in times.items()}
        values |= {f"{name}_pred_ms": 1e3 * t for name, t in predicted.items()}
        for name, (got, want) in self.ratios.items():
            values |= {name: got, f"{name}_pred": want}
        return {name: float(value) for name, value in values.items()}


def fetch_figures(
    samples: dict[str, list[float]], steps: int, k: int, shares: tuple, dispatch: float
) -> FetchFigures:
    """The fetch experiment's figures from `interleaved_with_core_shares`' samples (seconds
    per call of `steps` steps, in round order), the core shares it returned (each floored at
    0.01) and the dispatch call's seconds."""
    names = (EVERY, every_k(k), NEVER, SCAN, FED_FETCH, FED, HOST)
    missing = [name for name in names if name not in samples]
    if missing or steps < 1:
        raise ValueError(f"need steps >= 1 and the runs {missing} too; got steps {steps}")
    measured = {name: statistics.median(samples[name]) / steps for name in names}
    shares = tuple(max(share, 0.01) for share in shares)
    predicted = predicted_step_seconds(
        measured[HOST], measured[FED], k, *shares, fetched=measured[FED_FETCH], dispatch=dispatch
    )
    pair = lambda a, b: (paired_ratio(samples[a], samples[b]), predicted[a] / predicted[b])
    ratios = {
        "every_over_never": pair(EVERY, NEVER),
        "every_k_over_never": pair(every_k(k), NEVER),
        "every_over_every_k": pair(EVERY, every_k(k)),
    }
    return FetchFigures(k, measured, predicted, ratios, turns_ratio(samples), shares, dispatch)


def turns_ratio(samples: dict[str, list[float]]) -> float:
    """Fetching every step over host work plus a fetched step, h + d_f: the median over rounds
    of the ratio within a round, so that a slow stretch of a shared machine, which slows the
    three runs of a round alike, divides out (as the page's other ratios do)."""
    parts = [h + f for h, f in zip(samples[HOST], samples[FED_FETCH], strict=True)]
    return paired_ratio(samples[EVERY], parts)


def turns_check(figures: FetchFigures, cores: float, band: float) -> tuple[list[str], str]:
    """`measure.turns_verdict`'s rule applied to the paired `figures.turns`: (the claims it
    contradicts, the sentence saying what was checked). Overlap would take `figures`'
    predicted never-fetch step."""
    h, d_f = figures.h, figures.d_f
    overlapped = figures.predicted[NEVER]
    failed, sentence = turns_verdict(figures.turns * (h + d_f), h, d_f, cores, band, overlapped)
    return failed, sentence


def over_host(samples: dict[str, list[float]], k: int) -> list[float]:
    """Each fed driver's time over the host work alone, paired by round: a driver that does
    the host's work and more cannot take less."""
    return [paired_ratio(samples[name], samples[HOST]) for name in (EVERY, every_k(k), NEVER)]


# What a float32 matmul computes on each backend at each of JAX's matmul precisions (its
# aliases: "fastest" and "bfloat16" are the default, "bfloat16_3x" high, "float32" highest).
_COMPUTES = {
    "default": {"cpu": "float32 on a CPU", "gpu": "TF32 on a recent NVIDIA GPU",
                "tpu": "one bfloat16 pass on a TPU"},
    "high": {"cpu": "float32 on a CPU", "gpu": "TF32 on a recent NVIDIA GPU",
             "tpu": "three bfloat16 passes on a TPU"},
    "highest": {"cpu": "float32 on a CPU", "gpu": "float32 on a GPU",
                "tpu": "float32 accuracy, in several bfloat16 passes, on a TPU"},
}  # fmt: skip
_ALIASES = {
    "fastest": "default", "bfloat16": "default", "bfloat16_3x": "high", "float32": "highest"
}  # fmt: skip


def ceiling_label(backend: str, precision: str) -> str:
    """What the build's matmul ceiling measured, in words: a float32 matmul at `precision`
    (`Roofline.precision`: "default", "high", "highest" or an alias) on `backend` ("cpu",
    "gpu" or "tpu"), e.g. "float32 matmul at default precision (one bfloat16 pass on a TPU)"."""
    kind = _ALIASES.get(precision, precision)
    if kind not in _COMPUTES:
        raise ValueError(f"unknown matmul precision {precision!r}")
    if backend not in _COMPUTES[kind]:
        raise ValueError(f"backend must be one of {sorted(_COMPUTES[kind])}, got {backend!r}")
    return f"float32 matmul at {kind} precision ({_COMPUTES[kind][backend]})"


def label_ceiling(ax, label: str) -> None:
    """Names the dashed ceiling line that `render.draw_throughput` draws on `ax` by what the
    ceiling measured (`ceiling_label`), and redraws the legend."""
    dashed = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    if len(dashed) != 1:
        raise ValueError(f"expected one dashed ceiling line on the axis, found {len(dashed)}")
    dashed[0].set_label(label)
    ax.legend(loc="lower right", fontsize=8)
