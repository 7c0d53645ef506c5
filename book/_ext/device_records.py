"""Recorded accelerator runs of the chapters (results/<device>/): their manifests, and the
dropdown that shows a record on its chapter's page.

A record is an executed notebook (results/tpu/NN_slug.ipynb) written by scripts/device_run.py
on the accelerator, and an entry of results/tpu/run.json: the device, JAX version, date, and a
manifest of SHA-256 hashes of the chapter's source and of every package file the chapter
imports (`manifest`). A build compares that manifest with today's files: a record whose
hashes no longer match is marked stale on its page, with the files that changed. Nothing here
edits a record's outputs; it only shows them.

In a chapter: ```{device-record}``` (no argument: the page's own chapter).
"""

import ast
import hashlib
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "code" / "jaxloops"
RESULTS = ROOT / "results"  # results/<backend>/: one folder per kind of device


def _module_file(name: str) -> pathlib.Path | None:
    parts = name.split(".")
    if parts[0] != "jaxloops":
        return None
    base = PACKAGE.joinpath(*parts[1:])
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _imported_modules(source: str, package: str) -> set[str]:
    """The jaxloops modules a piece of Python source imports (inside functions too)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the importing module's package
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))  # fmt: skip
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    # `import jaxloops.measure.timing` runs jaxloops and jaxloops.measure too
    return {".".join(n.split(".")[:i]) for n in names for i in range(1, n.count(".") + 2)}


def package_files(code: str) -> list[pathlib.Path]:
    """Every package file that `code` imports, directly or through the package's imports."""
    seen, todo = {}, [m for m in _imported_modules(code, "") if _module_file(m)]
    while todo:
        name = todo.pop()
        path = _module_file(name)
        if path is None or name in seen:
            continue
        seen[name] = path
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        todo.extend(_imported_modules(path.read_text(), package))
    return sorted(set(seen.values()))


def _sha256(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def chapter_code(chapter: pathlib.Path) -> str:
    """The Python of a MyST chapter's code cells."""
    text, cells, inside = chapter.read_text(), [], False
    for line in text.splitlines():
        if line.startswith("```{code-cell}"):
            inside = True
        elif inside and line.startswith("```"):
            inside = False
        elif inside and not line.startswith(":"):
            cells.append(line.lstrip("%!") if line.startswith(("%", "!")) else line)
    return "\n".join(line for line in cells if not line.startswith(("%", "!")))


def manifest(chapter: pathlib.Path) -> dict[str, str]:
    """{path relative to the repository: SHA-256} of a chapter and the package files it
    imports."""
    files = [chapter, *package_files(chapter_code(chapter))]
    return {str(p.relative_to(ROOT)): _sha256(p) for p in files}


def changed(recorded: dict[str, str]) -> list[str]:
    """The files of a recorded manifest that differ today (or are gone), and files the chapter
    imports today that the record did not."""
    chapter = next(ROOT / p for p in recorded if p.startswith("book/"))
    if not chapter.is_file():
        return sorted(recorded)
    today = manifest(chapter)
    return sorted(p for p in set(today) | set(recorded) if today.get(p) != recorded.get(p))


def load_run(device: str) -> dict:
    path = (RESULTS / device) / "run.json"
    return json.loads(path.read_text()) if path.is_file() else {}


# ---- the Sphinx side: a dropdown with the record's outputs on its chapter's page ----------


def _record_nodes(directive, device, chapter_stem):
    from docutils import nodes

    run = load_run(device)
    entry = run.get("chapters", {}).get(chapter_stem.split("_")[0])
    para = lambda text: nodes.paragraph(text=text)
    if not entry:
        return [para(f"No {device.upper()} run of this chapter is recorded yet.")]
    head = (f"Executed on {run['device']} with JAX {run['jax']} on {entry.get('date', '?')}, "
            f"in {entry['seconds']:.0f} s: {entry['status']}.")  # fmt: skip
    out = [para(head)]
    stale = changed(entry["manifest"])
    if stale:
        warn = nodes.warning()
        warn += para("Stale: these files changed since this run, so its outputs may no longer "
                     "match the code above: " + ", ".join(stale) + ".")  # fmt: skip
        out.append(warn)
    for failure in entry.get("failures", []):
        out.append(para(f"Cell {failure['index']} failed there: {failure['error']}"))
    notebook = json.loads(((RESULTS / device) / f"{chapter_stem}.ipynb").read_text())
    for cell in notebook["cells"]:
        for output in cell.get("outputs", []) if cell["cell_type"] == "code" else []:
            out.extend(_output_nodes(directive, output))
    return out


def _output_nodes(directive, output):
    from docutils import nodes
    from docutils.statemachine import StringList

    kind, data = output["output_type"], output.get("data", {})
    if kind == "stream":
        return [nodes.literal_block(text="".join(output["text"]))]
    if kind == "error":
        return [nodes.literal_block(text=f"{output['ename']}: {output['evalue']}")]
    if "scrapbook" in output.get("metadata", {}):
        return []  # a glued value: shown where the record's prose would use it, not here
    if "image/png" in data:  # inline, so the page needs no file beside it
        png = "".join(data["image/png"]).replace("\n", "")
        html = f'<img src="data:image/png;base64,{png}" alt="a figure of the recorded run">'
        return [nodes.raw("", html, format="html")]
    if "text/html" in data:
        return [nodes.raw("", "".join(data["text/html"]), format="html")]
    if "text/markdown" in data:
        container = nodes.container()
        lines = "".join(data["text/markdown"]).splitlines()
        directive.state.nested_parse(StringList(lines), directive.content_offset, container)
        return [container]
    if "text/plain" in data:
        return [nodes.literal_block(text="".join(data["text/plain"]))]
    return []


def setup(app):
    from docutils.parsers.rst import Directive, directives

    class DeviceRecord(Directive):
        optional_arguments = 1
        option_spec = {"device": directives.unchanged}

        def run(self):
            self.env = self.state.document.settings.env
            device = self.options.get("device", "tpu")
            stem = self.arguments[0] if self.arguments else pathlib.Path(self.env.docname).name
            for path in ((RESULTS / device) / "run.json", (RESULTS / device) / f"{stem}.ipynb"):
                self.env.note_dependency(str(path))
            return _record_nodes(self, device, stem)

    app.add_directive("device-record", DeviceRecord)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
