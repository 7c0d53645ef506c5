"""Published peak figures of accelerators: the roofline a GPU run's goals are computed from,
and the interconnects chapter 12's critical batch is computed from. The one table of them.

The vendor's datasheet figures for dense work (the datasheets quote tensor-core FLOP/s with
2:4 structured sparsity; these are half of that), for the board named. They are labelled
"published" wherever they appear and never mixed with a build's measured ceilings.

Matmul precision on these GPUs: float32 at HIGHEST runs on the CUDA cores (the "f32" figure);
float32 at JAX's DEFAULT precision runs in TF32 on the tensor cores (10-bit mantissa); bfloat16
inputs run on the tensor cores with float32 accumulation.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class PublishedPeaks:
    """One board's published dense peaks: FLOP/s per precision, HBM bytes/s and, where the
    board has one, its interconnect's bytes/s per chip in one direction (None: not published
    here; a TPU publishes no float32 matmul figure)."""

    board: str
    f32_flops_per_s: float | None
    tf32_flops_per_s: float | None
    bf16_flops_per_s: float
    hbm_bytes_per_s: float
    source: str
    interconnect: str | None = None
    interconnect_bytes_per_s: float | None = None
    # What one ring over one mesh axis gets of it, per chip and direction: all of NVLink
    # (a switch links every pair of GPUs), 2 of a TPU v5p's 6 torus links.
    ring_bytes_per_s: float | None = None
    memory_bytes: float | None = None  # the board's published HBM capacity (None: not listed)

    def flops_per_s(self, precision: str) -> float:
        """Peak FLOP/s of "f32", "tf32" or "bf16"."""
        peaks = {
            "f32": self.f32_flops_per_s,
            "tf32": self.tf32_flops_per_s,
            "bf16": self.bf16_flops_per_s,
        }
        if precision not in peaks:
            raise ValueError(f"precision is {precision!r}; expected one of {sorted(peaks)}")
        if peaks[precision] is None:
            raise ValueError(f"{self.board} publishes no {precision} figure")
        return peaks[precision]

    def predict(self, flops: float, bytes_moved: float, precision: str = "bf16") -> float:
        """Seconds the published roofline allows: the slower of computing and moving."""
        if flops < 0 or bytes_moved < 0:
            raise ValueError(f"need flops >= 0 and bytes >= 0, got {flops}, {bytes_moved}")
        return max(flops / self.flops_per_s(precision), bytes_moved / self.hbm_bytes_per_s)


# NVLink 4: 900 GB/s per GPU, both directions together.
_H100_SXM = dict(
    f32_flops_per_s=67e12,
    tf32_flops_per_s=494.5e12,
    bf16_flops_per_s=989.5e12,
    interconnect="NVLink 4",
    interconnect_bytes_per_s=450e9,
    ring_bytes_per_s=450e9,
)

# (substrings of JAX's device_kind, peaks); the first entry whose substrings all match wins.
PUBLISHED = (
    (
        ("H200",),
        PublishedPeaks(
            "NVIDIA H200 SXM",
            **_H100_SXM,
            hbm_bytes_per_s=4.8e12,
            source="NVIDIA H200 datasheet",
            memory_bytes=141e9,
        ),
    ),
    (
        ("H100", "PCIe"),
        PublishedPeaks(
            "NVIDIA H100 PCIe",
            f32_flops_per_s=51e12,
            tf32_flops_per_s=378e12,
            bf16_flops_per_s=756e12,
            hbm_bytes_per_s=2.0e12,
            source="NVIDIA H100 datasheet",
            memory_bytes=80e9,
        ),
    ),
    (
        ("H100",),
        PublishedPeaks(
            "NVIDIA H100 SXM",
            **_H100_SXM,
            hbm_bytes_per_s=3.35e12,
            source="NVIDIA H100 datasheet",
            memory_bytes=80e9,
        ),
    ),
    (
        ("TPU v5 lite",),  # how JAX names a TPU v5e
        PublishedPeaks(
            "TPU v5e",
            f32_flops_per_s=None,
            tf32_flops_per_s=None,
            bf16_flops_per_s=197e12,
            hbm_bytes_per_s=819e9,
            source="Google Cloud TPU v5e documentation",
            memory_bytes=16e9,
        ),
    ),
    (
        ("TPU v5p",),
        PublishedPeaks(
            "TPU v5p",
            f32_flops_per_s=None,
            tf32_flops_per_s=None,
            bf16_flops_per_s=459e12,
            hbm_bytes_per_s=2.765e12,
            source="Google Cloud TPU v5p documentation",
            interconnect="ICI",  # 4,800 Gbit/s per chip, both directions, all links together
            interconnect_bytes_per_s=300e9,
            ring_bytes_per_s=100e9,  # 2 of the 6 links of its 3-D torus: one axis
        ),
    ),
    (
        ("A100", "80GB"),
        PublishedPeaks(
            "NVIDIA A100 80GB SXM",
            f32_flops_per_s=19.5e12,
            tf32_flops_per_s=156e12,
            bf16_flops_per_s=312e12,
            hbm_bytes_per_s=2.039e12,
            source="NVIDIA A100 datasheet",
        ),
    ),
    (
        ("A100",),
        PublishedPeaks(
            "NVIDIA A100 40GB",
            f32_flops_per_s=19.5e12,
            tf32_flops_per_s=156e12,
            bf16_flops_per_s=312e12,
            hbm_bytes_per_s=1.555e12,
            source="NVIDIA A100 datasheet",
        ),
    ),
)


def published_peaks(device_kind: str) -> PublishedPeaks | None:
    """The published peaks of the board JAX calls `device_kind` (e.g. "NVIDIA H200"), or None
    for a device without figures here (a CPU, an unlisted GPU)."""
    for substrings, peaks in PUBLISHED:
        if all(s in device_kind for s in substrings):
            return peaks
    return None


def _board_figures(field: str) -> dict[str, tuple[float, float]]:
    """{"<board>, <interconnect>": (bf16 FLOP/s, the board's `field`)} where it is published."""
    return {
        f"{peaks.board.removeprefix('NVIDIA ')}, {peaks.interconnect}": (
            peaks.bf16_flops_per_s,
            getattr(peaks, field),
        )
        for _, peaks in PUBLISHED
        if getattr(peaks, field) is not None
    }


def interconnect_peaks() -> dict[str, tuple[float, float]]:
    """{"<board>, <interconnect>": (bf16 FLOP/s, interconnect bytes/s one way)} of every board
    whose interconnect is published here (chapter 12's critical batch)."""
    return _board_figures("interconnect_bytes_per_s")


def ring_peaks() -> dict[str, tuple[float, float]]:
    """{"<board>, <interconnect>": (bf16 FLOP/s, bytes/s one way of a ring over one mesh
    axis)}: the W of chapter 12's critical batch C / W."""
    return _board_figures("ring_bytes_per_s")
