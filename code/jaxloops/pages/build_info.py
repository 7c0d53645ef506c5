"""The build-information page's goals: the values each recorded device run left, including
the goals chapter 17 judges from its kernel sweep's record (results/tpu/kernels.json), which
no chapter notes as measured because the sweep runs outside the book's build."""

import json
import pathlib

from jaxloops.pages import ch17_pallas, goals

_ROOT = pathlib.Path(__file__).resolve().parents[3]


def device_values(results=_ROOT / "results") -> dict[str, dict]:
    """`goals.device_measured`, with chapter 17's sweep goals added to the TPU run from its
    record (dated by the sweep): {backend: {"device", "values", "dates"}}."""
    runs = goals.device_measured(results)
    record = ch17_pallas.load_record(pathlib.Path(results) / "tpu" / "kernels.json")
    if record is None:
        return runs
    swept = {k: v for k, v in ch17_pallas.goal_values(record).items() if v is not None}
    if not swept:
        return runs
    tpu = runs.setdefault(
        "tpu", {"device": record["facts"].get("device_kind", "TPU"), "values": {}, "dates": {}}
    )
    date = record["facts"].get("date", "").split(" ")[0]
    for key, value in swept.items():
        tpu["values"][key], tpu["dates"][key] = value, date
    return runs


def kernel_step_line(results=_ROOT / "results") -> str:
    """A sentence for the goals table: chapter 11's step with chapter 17's kernel, as chapter
    17's TPU record measured it (the goals table keeps chapter 11's step, with XLA's
    attention); "" where that record lacks it."""
    path = pathlib.Path(results) / "tpu" / "17_pallas.ipynb"
    run_path = pathlib.Path(results) / "tpu" / "run.json"
    if not path.is_file() or not run_path.is_file():
        return ""
    run = json.loads(run_path.read_text())
    names = ["ch17_step_of_ceiling", "ch17_step_naive_of_ceiling"]
    found = {}
    for cell in json.loads(path.read_text()).get("cells", []):
        for output in cell.get("outputs", []):
            name = output.get("metadata", {}).get("scrapbook", {}).get("name")
            plain = output.get("data", {}).get("application/papermill.record/text/plain")
            if name in names and plain is not None:
                found[name] = float("".join(plain))
    if len(found) < len(names):
        return ""
    date = run.get("chapters", {}).get("17", {}).get("date", "?")
    return (
        f"The same step with chapter 17's Pallas kernel in place of XLA's attention reached "
        f"{found['ch17_step_of_ceiling']:.1%} of the bfloat16 matmul ceiling measured beside it "
        f"on {run.get('device', 'the TPU')} ({date}; with XLA's attention, in the same run, "
        f"{found['ch17_step_naive_of_ceiling']:.1%})."
    )
