"""Chapter 17's page: the kernel's VMEM and block counts as tables, its agreement with naive
attention, and the TPU run `measure.kernel_sweep` recorded (results/tpu/kernels.json): read,
compared with today's kernel source, and turned into the chapter's tables and goals."""

import json
import pathlib

import jax
import numpy as np
from jax.experimental.pallas import tpu as pltpu

from jaxloops import model_flops
from jaxloops import pallas_attention as pa
from jaxloops.attention import rounding_magnitudes
from jaxloops.measure import kernel_sweep, published
from jaxloops.measure.roofline import CEILING_MARGIN
from jaxloops.pages import goals
from jaxloops.pages.common import MiB
from jaxloops.pages.render import markdown_table
from jaxloops.text import VOCAB_SIZE
from jaxloops.transformer import TransformerConfig

RECORD = pathlib.Path(__file__).resolve().parents[3] / "results" / "tpu" / "kernels.json"
# The implementations of the summary, in its columns' order.
SHOWN = ("pallas", "flash_attention", "splash", "blockwise", "xla", "pallas, B T N H")
LIBRARIES = ("flash_attention", "splash")


def v5e_facts() -> dict:
    """The TPU v5e's per-core facts as JAX's Pallas TPU backend tabulates them
    (`pltpu.get_tpu_info_for_chip`, jax/_src/pallas/mosaic/tpu_info.py)."""
    info = pltpu.get_tpu_info_for_chip(pltpu.ChipVersion.TPU_V5E, 1)
    return {
        "vmem_mib": info.vmem_capacity_bytes / MiB,
        "mxu": info.mxu_column_size,
        "mxus": info.num_mxus,
        "lanes": info.num_lanes,
        "sublanes": info.num_sublanes,
        "bf16_tflops": info.bf16_ops_per_second / 1e12,
    }


def vmem_rows(blocks, head_dims, dtype, vmem_mib: float) -> list[dict]:
    """The forward kernel's VMEM at Tb = Sb = each of `blocks`, for each head dim
    (`pa.forward_vmem_bytes`), in MiB and as a share of `vmem_mib`."""
    rows = []
    for block in blocks:
        for H in head_dims:
            parts = pa.forward_vmem_bytes(pa.Blocks(block, block, False, True), H, dtype)
            row = {"block": block, "H": H, **{k: v / MiB for k, v in parts.items()}}
            row["total"] = sum(parts.values()) / MiB
            row["share"] = f"{row['total'] / vmem_mib:.1%}"
            rows.append(row)
    return rows


def count_rows(lengths, block: int) -> list[dict]:
    """Per (batch element, head), what the causal forward grid computes, masks and fetches at
    T = S = each length in blocks of `block`, against full attention, and the speed-up the
    computed blocks predict beside 2n / (n + 1)."""
    rows = []
    for T in lengths:
        full = pa.block_counts(T, T, pa.Blocks(block, block, False, True))
        causal = pa.block_counts(T, T, pa.Blocks(block, block, True, True))
        n = T // block
        rows.append({
            "T": T, "n": n, "steps": causal["steps"], "full": full["computed"],
            "computed": causal["computed"], "masked": causal["masked"],
            "fetched": causal["fetched"], "predicted": full["computed"] / causal["computed"],
            "ideal": 2 * n / (n + 1),
        })  # fmt: skip
    return rows


def agreement_rows(got, expected, query, key, value, d_out, *, is_causal, interpret=None):
    """Each of the output and dQ, dK, dV (`got` against `expected`, in that order): the
    largest difference, the bound rounding explains (`pa.agreement_bound`, with the
    magnitudes of `rounding_magnitudes`) and their ratio (above 1: not rounding)."""
    magnitude = rounding_magnitudes(query, key, value, d_out, is_causal=is_causal)
    rows = []
    for i, name in enumerate(("out", "dq", "dk", "dv")):
        g, e = (np.asarray(x, np.float64) for x in (got[i], expected[i]))
        if g.shape != e.shape:
            raise ValueError(f"{name}: shapes differ, {g.shape} and {e.shape}")
        bound = pa.agreement_bound(
            query, key, np.abs(e).max(), magnitude[name], grad=i > 0, interpret=interpret
        )
        error = float(np.abs(g - e).max())
        rows.append({"result": name, "error": error, "bound": bound, "ratio": error / bound})
    return rows


def vmem_table(rows: list[dict]) -> str:
    columns = {"block": "Tb = Sb", "H": "H", "tiles": "tiles, two buffers (MiB)",
               "scratch": "scratch (MiB)", "temporaries": "score temporaries (MiB)",
               "total": "total (MiB)", "share": "share of VMEM"}  # fmt: skip
    return markdown_table(rows, columns)


def count_table(rows: list[dict]) -> str:
    columns = {"T": "T = S", "n": "n key blocks", "steps": "grid steps", "full": "full: computed",
               "computed": "causal: computed", "masked": "masked", "fetched": "key blocks fetched",
               "predicted": "predicted speed-up", "ideal": "2n / (n + 1)"}  # fmt: skip
    return markdown_table(rows, columns)


def agreement_table(rows: list[dict]) -> str:
    columns = {"result": "result", "error": "largest difference", "bound": "rounding bound",
               "ratio": "difference / bound"}  # fmt: skip
    return markdown_table(rows, columns)


def kernel_operand_shapes(fn, *args) -> list[list[tuple]]:
    """The shapes of the operands of each `pallas_call` in fn(*args)'s program, in order."""
    found = []

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "pallas_call":
                found.append([tuple(v.aval.shape) for v in eqn.invars])
            for param in eqn.params.values():
                for sub in param if isinstance(param, tuple | list) else (param,):
                    inner = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr's, or a Jaxpr
                    if hasattr(inner, "eqns"):
                        walk(inner)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return found


def backend_note(backend: str) -> str:
    """What ran the kernels on this page, in words."""
    if backend == "tpu":
        return "compiled by Mosaic for the TPU, at the TPU's sizes"
    where = "a GPU, where Pallas's TPU kernels do not compile" if backend == "gpu" else "a CPU"
    return (
        f"interpreted: this build runs on {where}, so the kernels run in Pallas's TPU "
        "interpreter, a grid step at a time, at small sizes"
    )


def load_record(path=RECORD) -> dict | None:
    """The recorded TPU run, or None where none has been recorded."""
    path = pathlib.Path(path)
    return json.loads(path.read_text()) if path.is_file() else None


def changed_sources(record: dict, current: dict | None = None) -> list[str]:
    """The kernel's source files that changed since the record was made (empty: current)."""
    current = kernel_sweep.source_hashes() if current is None else current
    return sorted(name for name, digest in current.items() if record["sources"].get(name) != digest)


def _where(rows, **where) -> list[dict]:
    return [r for r in rows if all(r[k] == v for k, v in where.items())]


def fastest(rows, implementation: str, **where) -> dict | None:
    """The fastest row of `implementation` that ran (over its block sizes) at `where`."""
    ran = [r for r in _where(rows, implementation=implementation, **where) if not r["error"]]
    return min(ran, key=lambda r: r["seconds"], default=None)


# Of the FLOPs, the share in products H deep: forward, QK^T of QK^T and PV; forward +
# backward counted as FlashAttention-2's 7 products, QK^T twice and dO V^T H deep, PV, dV, dQ
# and dK Tb or Sb deep. The goals were set against this estimate (`ceiling`).
SHALLOW = {"forward": 1 / 2, "forward+backward": 3 / 7}
# What this kernel computes: (products H deep, products a block deep), against the products'
# worth of FLOPs the count credits (forward 2; forward + backward 3.5 times that, 7). Its
# backward is two kernels that each recompute QK^T and dO V^T: dK/dV (QK^T, dO V^T H deep; dV,
# dK a query block deep) and dQ (QK^T, dO V^T; dQ a key block deep).
KERNEL_PRODUCTS = {"forward": (1, 1), "forward+backward": (5, 4)}
COUNTED_PRODUCTS = {"forward": 2, "forward+backward": 7}


def instrument(rows, name: str, **where) -> float | None:
    """The best rate (TFLOP/s) of the instrument `name` ("ceiling: depth H" over its tiles,
    or "ceiling: square") measured beside the configuration `where`."""
    rates = [r["tflops"] for r in _where(rows, implementation=name, **where) if not r["error"]]
    return max(rates, default=None)


def ceiling(rows, **where) -> float | None:
    """The estimate (TFLOP/s) the goals were set against, beside the configuration `where`:
    products H deep (a share SHALLOW of the FLOPs, as FlashAttention-2 computes them) at the
    depth-H matmul's rate, the rest, Tb or Sb deep, at the square matmul's; the time of each
    summed. Not a ceiling: the kernel can run faster (`kernel_estimate` counts the products
    this kernel computes). None without both instruments."""
    depth = instrument(rows, "ceiling: depth H", **where)
    square = instrument(rows, "ceiling: square", **where)
    if not depth or not square:
        return None
    shallow = SHALLOW[where["mode"]]
    return 1 / (shallow / depth + (1 - shallow) / square)


def kernel_estimate(rows, **where) -> float | None:
    """The rate (TFLOP/s, of the counted FLOPs) the two instruments beside `where` predict
    for the products this kernel computes (`KERNEL_PRODUCTS`): an estimate, not a ceiling (the
    kernel can run its products faster than either instrument). None without both."""
    depth = instrument(rows, "ceiling: depth H", **where)
    square = instrument(rows, "ceiling: square", **where)
    if not depth or not square:
        return None
    deep, shallow = KERNEL_PRODUCTS[where["mode"]]
    return COUNTED_PRODUCTS[where["mode"]] / (deep / depth + shallow / square)


def peak_tflops(record: dict) -> float | None:
    """The published bfloat16 peak (TFLOP/s) of the record's device (`measure.published`),
    None where it is not listed."""
    peaks = published.published_peaks(record.get("facts", {}).get("device_kind", ""))
    return peaks.bf16_flops_per_s / 1e12 if peaks else None


def above_peak(record: dict) -> list[str]:
    """The runs whose rate exceeds the device's published bfloat16 peak: the one rate no
    kernel can beat, so such a row is a counting error."""
    top = peak_tflops(record)
    return [
        f"{r['config']}, {r['implementation']}: {r['tflops']:.3g} > {top:.3g}"
        for r in record["rows"]
        if top and not r["error"] and not r["is_causal"] and r["tflops"] > top
    ]


def configurations(rows) -> list[dict]:
    """The configurations of the rows, forward first, then by H (128 first), T, causality."""
    keys = {(r["mode"], -r["H"], r["T"], r["is_causal"]) for r in rows}
    return [dict(mode=m, H=-h, T=t, is_causal=c) for m, h, t, c in sorted(keys)]


def share(rows, implementation: str, **where) -> float | None:
    """The fastest run's rate over the ceiling beside it."""
    best, top = fastest(rows, implementation, **where), ceiling(rows, **where)
    return best["tflops"] / top if best and top else None


def _cell(rows, implementation: str, top: float | None, **where) -> str:
    """Full attention: TFLOP/s and share of `top`; causal (its FLOPs are counted as full
    attention's): milliseconds and the speed-up over full; then the blocks."""
    best = fastest(rows, implementation, **where)
    if best is None:
        failed = _where(rows, implementation=implementation, **where)
        return f"failed: {failed[0]['error'][:48]}" if failed else "—"
    blocks = f", {best['block_q']}/{best['block_k']}" if best["block_q"] else ""
    if where["is_causal"]:
        full = fastest(rows, implementation, **{**where, "is_causal": False})
        gain = f" (×{full['seconds'] / best['seconds']:.2f})" if full else ""
        return f"{1e3 * best['seconds']:.2f} ms{gain}{blocks}"
    of = f" ({best['tflops'] / top:.0%})" if top else ""
    return f"{best['tflops']:.3g}{of}{blocks}"


def _shares(rows, peak: float | None, **where) -> str:
    """The kernel's fastest full run against the square matmul and the published peak."""
    best = fastest(rows, "pallas", **where)
    square = instrument(rows, "ceiling: square", **where)
    if where["is_causal"] or best is None:
        return "—"
    parts = [f"{best['tflops'] / square:.0%} of the square" if square else ""]
    parts.append(f"{best['tflops'] / peak:.0%} of the peak" if peak else "")
    return ", ".join(p for p in parts if p) or "—"


def summary_table(record: dict) -> str:
    """Markdown: each configuration's instruments and the rate they predict for this kernel's
    products (TFLOP/s; `kernel_estimate`), and each implementation's fastest run (over its
    block sizes): full attention in TFLOP/s and its share of that estimate, causal in
    milliseconds and its speed-up over full; then its blocks, Tb/Sb; and the kernel's fastest
    full run as a share of the square matmul and of the published bfloat16 peak."""
    rows, lines, peak = record["rows"], [], peak_tflops(record)
    for where in configurations(rows):
        top = kernel_estimate(rows, **where)
        rates = {
            key: instrument(rows, name, **where)
            for key, name in (("depth", "ceiling: depth H"), ("square", "ceiling: square"))
        }
        line = {"mode": where["mode"], "H": where["H"], "T": where["T"],
                "causal": "causal" if where["is_causal"] else "full",
                **{key: f"{rate:.3g}" if rate else "—" for key, rate in rates.items()},
                "estimate": f"{top:.3g}" if top else "—"}  # fmt: skip
        line.update({name: _cell(rows, name, top, **where) for name in SHOWN})
        line["shares"] = _shares(rows, peak, **where)
        lines.append(line)
    columns = {"mode": "mode", "H": "H", "T": "T = S", "causal": "mask",
               "depth": "matmul H deep", "square": "square matmul",
               "estimate": "estimate for this kernel's products"}  # fmt: skip
    shares = {"shares": "pallas: of the square matmul, of the published peak"}
    return markdown_table(lines, {**columns, **{name: name for name in SHOWN}, **shares})


def sweep_table(record: dict, **where) -> str:
    """Markdown: the block sizes tried at one configuration, each kernel's milliseconds."""
    rows = _where(record["rows"], **where)
    pairs = sorted({(r["block_q"], r["block_k"]) for r in rows if r["layout"] == "BNTH"})
    lines = []
    for Tb, Sb in pairs:
        line = {"blocks": f"{Tb} / {Sb}"}
        for name in ("pallas", *LIBRARIES):
            found = _where(rows, implementation=name, block_q=Tb, block_k=Sb)
            ok = [r for r in found if not r["error"]]
            line[name] = f"{1e3 * ok[0]['seconds']:.2f}" if ok else "failed" if found else "—"
        lines.append(line)
    columns = {"blocks": "Tb / Sb", **{name: f"{name} (ms)" for name in ("pallas", *LIBRARIES)}}
    return markdown_table(lines, columns)


def causal_speedups(rows, mode: str = "forward") -> list[dict]:
    """Per (H, T): full time / causal time of the kernel's fastest runs, and the ideal the
    causal run's blocks predict (computed blocks, full over causal: 2n / (n + 1) at Tb = Sb)."""
    found = []
    for where in configurations(rows):
        if where["mode"] != mode or where["is_causal"]:
            continue
        full = fastest(rows, "pallas", **where)
        causal = fastest(rows, "pallas", **{**where, "is_causal": True})
        if full is None or causal is None:
            continue
        blocks = pa.Blocks(causal["block_q"], causal["block_k"], True, True)
        counts = pa.block_counts(where["T"], where["T"], blocks)
        ideal = counts["steps"] / counts["computed"]
        speedup = full["seconds"] / causal["seconds"]
        found.append({"H": where["H"], "T": where["T"], "speedup": speedup, "ideal": ideal,
                      "of_ideal": speedup / ideal, "blocks": (causal["block_q"], causal["block_k"]),
                      "n": where["T"] // causal["block_k"]})  # fmt: skip
    return found


def library_margins(rows) -> list[dict]:
    """Per configuration: the best tuned library kernel's time over the Pallas kernel's
    (`ratio`, below 1: the library is faster) and which library that is."""
    found = []
    for where in configurations(rows):
        ours = fastest(rows, "pallas", **where)
        library = [r for r in (fastest(rows, name, **where) for name in LIBRARIES) if r]
        if ours and library:
            best = min(library, key=lambda r: r["seconds"])
            found.append({**where, "library": best["implementation"],
                          "ratio": best["seconds"] / ours["seconds"]})  # fmt: skip
    return found


def goal_values(record: dict | None) -> dict[str, float | None]:
    """Each of chapter 17's goals (`pages.goals`, backend "tpu") as the record measured it;
    None where the record lacks what it needs, or where there is no record."""
    rows = record["rows"] if record else []
    at = dict(T=8192, is_causal=False)
    speedups = causal_speedups(rows)
    over_library = [m["ratio"] for m in library_margins(rows) if m["T"] >= 2048]
    of_ideal = [s["of_ideal"] for s in speedups if s["T"] >= 4096]
    long = [s["speedup"] for s in speedups if s["T"] >= 8192]
    return {
        "pallas_forward_h128": share(rows, "pallas", mode="forward", H=128, **at),
        "pallas_forward_h64": share(rows, "pallas", mode="forward", H=64, **at),
        "pallas_causal_of_ideal": min(of_ideal, default=None),
        "pallas_causal_speedup": min(long, default=None),
        "pallas_forward_backward_h128": share(rows, "pallas", mode="forward+backward", H=128, **at),
        "pallas_over_library": min(over_library, default=None),
    }


def goal_lines(values: dict[str, float | None], recorded: bool) -> str:
    """Markdown: each goal as set, and the recorded run's verdict (met, or missed by how
    much), or that no run has measured it."""
    lines = []
    for key, value in values.items():
        g = goals.goal(key)
        if not recorded or value is None:
            result = "not measured yet: no TPU run has recorded it"
        else:
            result = goals.verdict(g, value, "tpu")
        lines.append(f"- {g.what}: {g.stated}. Recorded: {result}.")
    return "\n".join(lines)


def depth_only(rows, **where) -> float | None:
    """The depth-H matmul's rate alone, as if it were attention's ceiling (it is not)."""
    return instrument(rows, "ceiling: depth H", **where)


def depth_shares(rows, implementation: str = "pallas") -> list[float]:
    """The fastest full-attention runs' rates over the depth-H matmul's alone, one per
    configuration that has both."""
    found = []
    for where in configurations(rows):
        best, depth = fastest(rows, implementation, **where), depth_only(rows, **where)
        if not where["is_causal"] and best and depth:
            found.append(best["tflops"] / depth)
    return found


def record_note(record: dict | None, current: dict | None = None) -> str:
    """Markdown: where and when the TPU run was recorded and whether its kernel source is
    today's; or, without a record, that none has been made and what the run will measure."""
    if record is None:
        return (
            "**No TPU run has been recorded yet.** `scripts/device_run.py` runs the sweep above "
            "on the chip as its `kernels` stage, resumably, over as many device commands as it "
            "takes, and records its rows in `results/tpu/kernels.json`, which this page reads. "
            "Until then the goals below are unmeasured."
        )
    facts, changed = record["facts"], changed_sources(record, current)
    configs = len(configurations(record["rows"]))
    when = f"Recorded on {facts['device']} on {facts['date']} with JAX {facts['jax']}: "
    when += f"{len(record['rows'])} rows, {configs} configurations."
    if changed:
        return when + (
            f" **Stale:** the kernel's source changed since ({', '.join(changed)}); these "
            "numbers are the earlier kernel's until the device run measures again."
        )
    return when + " The kernel's source is today's (SHA-256 of each file matches)."


def findings(record: dict) -> dict[str, float | str]:
    """The recorded run's figures the page's prose states: the depth-H matmul against the
    kernel, attention's ceiling at T = 8192 against the kernel, the causal ideal at the
    fastest causal blocks, and where a library kernel was faster."""
    rows = record["rows"]
    at = dict(mode="forward", T=8192, is_causal=False)
    out: dict[str, float | str] = {}
    shares = depth_shares(rows)
    full = [w for w in configurations(rows) if not w["is_causal"]]
    out |= {"depth_max": 100 * max(shares, default=0.0), "full_configs": len(full),
            "depth_above": sum(s > 1 + CEILING_MARGIN for s in shares)}  # fmt: skip
    for H in (128, 64):
        best, top = fastest(rows, "pallas", H=H, **at), ceiling(rows, H=H, **at)
        depth, square = (instrument(rows, name, H=H, **at)
                         for name in ("ceiling: depth H", "ceiling: square"))  # fmt: skip
        if best and top:
            figures = {"depth": depth, "square": square, "ceiling": top,
                       "kernel": best["tflops"], "of": 100 * best["tflops"] / top}  # fmt: skip
            out |= {f"h{H}_{key}": value for key, value in figures.items()}
    speedups = [s for s in causal_speedups(rows) if s["H"] == 128]
    for s in speedups:
        figures = {"causal": s["speedup"], "ideal": s["ideal"], "n": s["n"],
                   "blocks": "/".join(map(str, s["blocks"]))}  # fmt: skip
        out |= {f"{key}_{s['T']}": value for key, value in figures.items()}
    slower = [m for m in library_margins(rows) if m["ratio"] < 1]
    out["library_wins"] = len(slower)
    out["library_configs"] = len(library_margins(rows))
    out["library_causal"] = sum(m["is_causal"] for m in slower)
    if slower:
        worst = min(slower, key=lambda m: m["ratio"])
        out["library_worst"] = 100 * (1 / worst["ratio"] - 1)
        out["library_worst_at"] = (
            f"{worst['mode']}, {'causal' if worst['is_causal'] else 'full'}, H {worst['H']}, "
            f"T = {worst['T']}, {worst['library']}"
        )
    return out


def findings_markdown(record: dict | None) -> str:
    """Markdown: what the recorded run says about the ceiling, causal skipping and the
    libraries, its figures from `findings`."""
    if record is None:
        return "*No TPU run recorded: nothing measured yet.*"
    f = findings(record)
    lines = [
        f"- **The matmul H deep alone is not attention's ceiling.** The kernel's fastest full "
        f"run exceeded it in {f['depth_above']} of {f['full_configs']} configurations by more "
        f"than {CEILING_MARGIN:.0%}, at most at {f['depth_max']:.0f} % of it.",
    ]
    for H in (128, 64):
        if f"h{H}_ceiling" in f:
            lines.append(
                f"- **T = 8192, H {H}, forward, predicted then measured.** The matmul {H} deep "
                f"ran at {f[f'h{H}_depth']:.1f} TFLOP/s and the square one at "
                f"{f[f'h{H}_square']:.1f}; half of the FLOPs at each rate predict "
                f"{f[f'h{H}_ceiling']:.1f}. The kernel ran at {f[f'h{H}_kernel']:.1f}, "
                f"{f[f'h{H}_of']:.0f} % of the prediction."
            )
    if "h64_ceiling" in f:  # PV's output 64 wide: half the MXU's columns, if it runs as QK^T
        half = 1 / (0.5 / f["h64_depth"] + 0.5 / (f["h64_square"] / 2))
        lines.append(
            f"- **Why H 64 falls short of it.** PV's output is 64 wide and fills half of the "
            f"MXU's columns, which the square matmul does not measure. If PV ran at half the "
            f"square matmul's rate, the prediction would be {half:.1f} TFLOP/s and the kernel "
            f"{100 * f['h64_kernel'] / half:.0f} % of it: a hypothesis until a matmul 64 wide "
            "is measured beside it."
        )
    lengths = sorted(int(k.split("_")[1]) for k in f if k.startswith("causal_"))
    if 8192 in lengths:
        said = lambda key: ", ".join(f"{f[f'{key}_{T}']:.2f}" for T in lengths)  # noqa: E731
        lines.append(
            f"- **Causal, H 128, forward.** Full time over causal time was {said('causal')} at "
            f"T = {', '.join(map(str, lengths))}, against the {said('ideal')} that the fastest "
            f"causal run's blocks predict. At T = 8192 its blocks were {f['blocks_8192']}: n is "
            f"{f['n_8192']} and 2n/(n + 1) is {f['ideal_8192']:.2f}"
            + (", below the goal's 1.8 before any cost is paid" if f["ideal_8192"] < 1.8 else "")
            + ". Smaller blocks raise the ideal, and the sweep above shows what each step then "
            "costs."
        )
    if f["library_wins"]:
        lines.append(
            f"- **The libraries.** A tuned library kernel was faster in {f['library_wins']} of "
            f"{f['library_configs']} configurations, {f['library_causal']} of them causal; at "
            f"most by {f['library_worst']:.1f} % ({f['library_worst_at']}). In every "
            "configuration of full attention this kernel was the fastest."
            if f["library_causal"] == f["library_wins"] else
            f"- **The libraries.** A tuned library kernel was faster in {f['library_wins']} of "
            f"{f['library_configs']} configurations; at most by {f['library_worst']:.1f} % "
            f"({f['library_worst_at']})."
        )  # fmt: skip
    return "\n".join(lines)


def _plain(labels: dict[str, str]) -> dict[str, str]:
    """Labels without their backticks: glued text is not Markdown."""
    return {name: label.replace("`", "") for name, label in labels.items()}


def breakdown_rows(traced: dict[str, dict], labels: dict[str, str]) -> tuple[list[dict], str]:
    """Two steps' breakdowns (`step_speed.step_breakdown`, {name: {group: row}}) side by side:
    one row per group, the first step's order, each step's traced ms and its kernels' MB (None
    where it has no such group), and a last row of all traced ms; a step whose trace held
    none of its kernels is left out. Returns the rows and the sentence that goes with them."""
    total = {
        name: sum(row["seconds"] for row in groups.values()) for name, groups in traced.items()
    }
    shown = [name for name in traced if total[name] > 0]
    order = list(dict.fromkeys(group for groups in traced.values() for group in groups))
    cell = lambda name, group, key, scale: (
        scale * traced[name][group][key] if group in traced[name] else None
    )
    units = (("ms", "seconds", 1e3), ("MB", "bytes", 1e-6))
    rows = [{"group": group, **{f"{labels[name]}, {unit}": cell(name, group, key, scale)
                                for name in shown for unit, key, scale in units}}
            for group in order]  # fmt: skip
    rows.append(
        {"group": "all traced", **{f"{labels[name]}, ms": 1e3 * total[name] for name in shown}}
    )
    plain = _plain(labels)
    attention = [
        f"{1e3 * traced[name].get('attention', {'seconds': 0.0})['seconds']:.2f} ms traced "
        f"{plain[name]}"
        for name in shown
    ]
    said = [
        f"The attention row is what the prediction above assumed moves: {', '.join(attention)}."
    ] * bool(attention) + [
        f"The trace of the step {plain[name]} held none of its kernels, so the table leaves it "
        f"out (the kernel ran in Pallas's TPU interpreter, and the profiler's trace of that "
        f"program held only its dispatch)."
        for name in traced
        if name not in shown
    ]
    return rows, " ".join(said)


def what_changed(traced: dict[str, dict], labels: dict[str, str]) -> str:
    """What moved between two traced steps (`attention_swap.traced_step`, {name: traced}, the
    first the reference): the group besides attention whose traced time changed most, and each
    step's copies and transposes by the file whose line made them (the three largest). "" where
    a trace held none of its kernels (Pallas's interpreter on a CPU)."""
    if len(traced) != 2:
        raise ValueError(f"traced must hold two steps, got {list(traced)}")
    ms = lambda name, group: 1e3 * traced[name]["groups"].get(group, {"seconds": 0.0})["seconds"]
    groups = sorted({group for t in traced.values() for group in t["groups"]})
    if not all(sum(ms(name, g) for g in groups) > 0 for name in traced):
        return ""
    first, second = traced
    plain = _plain(labels)
    moved = max((g for g in groups if g != "attention"),
                key=lambda g: abs(ms(second, g) - ms(first, g)))  # fmt: skip
    said = [
        f"Besides attention, the group that moved most is {moved}: {ms(first, moved):.2f} ms "
        f"{plain[first]}, {ms(second, moved):.2f} ms {plain[second]} "
        f"({ms(second, moved) - ms(first, moved):+.2f} ms)."
    ]
    for name in traced:
        files = [(f, r) for f, r in traced[name]["copies by file"].items() if r["seconds"] >= 5e-6]
        parts = [f"{1e3 * row['seconds']:.2f} ms made in {file or 'no source line'} "
                 f"({row['kernels']} kernel{'s' * (row['kernels'] != 1)})"
                 for file, row in files[:3]]  # fmt: skip
        if parts:
            said.append(f"The copies and transposes {plain[name]}, by the file whose line made "
                        f"them: {', '.join(parts)}.")  # fmt: skip
    return " ".join(said)


def step_mfu(step_sizes: tuple[int, ...], seconds: float, device_kind: str) -> str:
    """The step's MFU, as the field counts it (`model_flops.train_flops`, causal, over the
    device's published bfloat16 peak), in words: "64.9 %", or why there is none."""
    L, D, N, K, F, T, B = step_sizes
    peaks = published.published_peaks(device_kind)
    if peaks is None:
        return f"none: no published peak for {device_kind}"
    config = TransformerConfig(VOCAB_SIZE, L, D, N, K, F, T)
    flops = model_flops.train_flops(config, B, T, causal=True)
    return f"{model_flops.mfu(flops, seconds, peaks.bf16_flops_per_s):.1%}"
