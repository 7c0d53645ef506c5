"""jaxloops.pages.build_info: the goals table's device values include chapter 17's sweep."""

import json
import shutil

from jaxloops.pages import build_info, ch17_pallas, goals


def test_the_tpu_column_holds_the_sweeps_goals_beside_the_chapters(tmp_path):
    (tmp_path / "tpu").mkdir()
    run = {"backend": "tpu", "device": "TPU v5 lite", "chapters": {
        "07": {"date": "2026-12-07", "goals": {"fit_over_python_loop": 5.25}},
    }}  # fmt: skip
    (tmp_path / "tpu" / "run.json").write_text(json.dumps(run))
    without = build_info.device_values(tmp_path)
    assert set(without["tpu"]["values"]) == {"fit_over_python_loop"}  # no sweep record yet
    shutil.copy(ch17_pallas.RECORD, tmp_path / "tpu" / "kernels.json")
    values = build_info.device_values(tmp_path)["tpu"]
    swept = {k for k, v in ch17_pallas.goal_values(ch17_pallas.load_record()).items() if v}
    assert swept and swept <= set(values["values"])
    assert values["values"]["fit_over_python_loop"] == 5.25
    assert all(values["dates"][k] for k in swept)
    # every key is a goal of the table, so each lands in a row
    assert set(values["values"]) <= {g.key for g in goals.GOALS}


def test_the_kernel_step_line_reads_chapter_17s_record_and_is_empty_without_it(tmp_path):
    assert build_info.kernel_step_line(tmp_path) == ""
    (tmp_path / "tpu").mkdir()
    (tmp_path / "tpu" / "run.json").write_text(
        json.dumps({"device": "TPU v5 lite", "chapters": {"17": {"date": "2026-12-07"}}})
    )

    def glued(name, plain):
        meta = {"scrapbook": {"name": name}}
        return {"metadata": meta, "data": {"application/papermill.record/text/plain": plain}}

    cells = [{"outputs": [glued("ch17_step_of_ceiling", "0.6487")]}]
    (tmp_path / "tpu" / "17_pallas.ipynb").write_text(json.dumps({"cells": cells}))
    assert build_info.kernel_step_line(tmp_path) == ""  # one of the two values is missing
    cells[0]["outputs"].append(glued("ch17_step_naive_of_ceiling", "0.3978"))
    (tmp_path / "tpu" / "17_pallas.ipynb").write_text(json.dumps({"cells": cells}))
    line = build_info.kernel_step_line(tmp_path)
    assert "64.9%" in line and "39.8%" in line and "2026-12-07" in line
