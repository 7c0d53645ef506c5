"""Recorded accelerator runs of the chapters (results/<device>/): their manifests, and the
dropdown that shows a record on its chapter's page.

A record is an executed notebook (results/tpu/NN_slug.ipynb) written by scripts/device_run.py
on the accelerator, and an entry of results/tpu/run.json: the device, JAX version, date, and a
manifest of SHA-256 hashes of the chapter's code cells and of every package file the chapter
imports (`manifest`). A build compares that manifest with today's files: a record whose
hashes no longer match is marked stale on its page, with the files that changed. Nothing here
edits a record's outputs; it only shows them.

In a chapter: ```{device-record}``` (no argument: the page's own chapter), with `:glued:` the
names of values the page's prose glues whose recorded text the dropdown should show (the
prose itself shows this build's); its outputs are labelled by the section of the page they
belong to. In a sentence or a table, {chip}`NAME:.2f` shows the value the page's record glued
as NAME (formatted as {glue:text} formats), beside this build's {glue:text}`NAME:.2f`. On the page of the device runs: ```{device-run}```, a table
of every chapter's record and the test suite's run.
"""

import ast
import hashlib
import json
import pathlib
import re

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


def _absolute(node: ast.ImportFrom, package: str) -> str:
    """The module an `ImportFrom` names, a relative one resolved from the importing package."""
    base = node.module or ""
    if not node.level:
        return base
    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join(parts + ([base] if base else []))


def _is_package(name: str) -> bool:
    path = _module_file(name)
    return path is not None and path.name == "__init__.py"


def _definer(module: str, name: str, depth: int = 0) -> str | None:
    """The module whose code defines what `module` exposes as `name`: a submodule itself, or,
    through a package's re-exports (`from jaxloops import fit` is jaxloops.loop's `fit`), the
    module it comes from."""
    if _module_file(f"{module}.{name}"):
        return f"{module}.{name}"
    path = _module_file(module)
    if path is None or path.name != "__init__.py" or depth > 8:
        return module if path else None
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    return _definer(_absolute(node, module), alias.name, depth + 1)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname == name:
                    return alias.name
    return module  # defined in the package's own code (a lazy `__getattr__`, say)


def _dotted(node: ast.Attribute) -> list[str]:
    """`measure.compiled.fusions_of` as ["measure", "compiled", "fusions_of"]; [] when the
    chain does not start at a plain name."""
    chain = []
    while isinstance(node, ast.Attribute):
        chain.append(node.attr)
        node = node.value
    return [node.id, *reversed(chain)] if isinstance(node, ast.Name) else []


def _used_modules(source: str, package: str) -> set[str]:
    """The jaxloops modules whose code a piece of Python source uses (inside functions too):
    each imported name traced to the module that defines it, and each attribute of an
    imported package (`measure.compiled.fusions_of`, `jaxloops.fit`) likewise. Importing a
    package runs its `__init__`, whose re-exports compute nothing a chapter sees, so a
    package's other modules count only where the source reaches them."""
    tree, used, packages = ast.parse(source), set(), {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != "jaxloops" or not _module_file(alias.name):
                    continue
                if alias.asname is None:  # `import jaxloops.measure.timing` binds `jaxloops`
                    packages["jaxloops"] = "jaxloops"
                elif _is_package(alias.name):
                    packages[alias.asname] = alias.name
                if not _is_package(alias.name):
                    used.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, package)
            if base.split(".")[0] != "jaxloops":
                continue
            for alias in node.names:
                found = _definer(base, alias.name)
                if found is None:
                    continue
                if found == f"{base}.{alias.name}" and _is_package(found):
                    packages[alias.asname or alias.name] = found
                else:
                    used.add(found)
    for node in ast.walk(tree):
        chain = _dotted(node) if isinstance(node, ast.Attribute) else []
        if not chain or chain[0] not in packages:
            continue
        current = packages[chain[0]]
        for attribute in chain[1:]:
            found = _definer(current, attribute)
            if found is None or found == current or not _is_package(found):
                used.add(found or current)
                break
            current = found
    return used


def _named(source: str) -> list[str]:
    """Modules a source names in a string: a lazy import ("jaxloops.checkpoint"), or a worker
    it starts by name (`processes.command("cache_probe")` runs jaxloops.workers.cache_probe)."""
    strings = [
        node.value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value
    ]
    named = [s for s in strings if s.startswith("jaxloops.")]
    workers = [f"jaxloops.workers.{s}" for s in strings if s.isidentifier()]
    return [m for m in named + workers if _module_file(m)]


def package_files(code: str) -> list[pathlib.Path]:
    """Every package file whose code `code` runs, directly or through the modules it uses: not
    the rest of a package whose `__init__` it passes through (`from jaxloops import fit` is
    loop.py and what loop.py uses, not every module that jaxloops/__init__.py re-exports), so
    an edit to one chapter's module stales only the records that use it. A package's own code
    counts where a name is defined there; any module named in a string counts too
    (`_named`)."""
    seen, todo = {}, [*_used_modules(code, ""), *_named(code)]
    while todo:
        name = todo.pop()
        path = _module_file(name)
        if path is None or name in seen:
            continue
        seen[name] = path
        text = path.read_text()
        if name != "jaxloops.processes":  # it names every worker; a worker counts where started
            todo.extend(_named(text))
        if path.name != "__init__.py":
            todo.extend(_used_modules(text, name.rsplit(".", 1)[0]))
    return sorted(set(seen.values()))


def code_cells(chapter: pathlib.Path) -> str:
    """The source of a MyST chapter's code cells, in order: what executing it runs (its prose
    and cell options do not change what a run computes)."""
    text, cells, inside = chapter.read_text(), [], False
    for line in text.splitlines():
        if line.startswith("```{code-cell}"):
            inside = True
        elif inside and line.startswith("```"):
            inside = False
        elif inside and not line.startswith(":"):  # `:tags:` and other cell options
            cells.append(line)
    return "\n".join(cells)


def code_hash(source: str) -> str:
    """SHA-256 of what a Python module runs: its syntax tree without docstrings, so an edit
    to a comment, a docstring or the layout leaves a record current, and any other does not."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return hashlib.sha256(ast.dump(tree).encode()).hexdigest()


def manifest(chapter: pathlib.Path) -> dict[str, str]:
    """{path relative to the repository: SHA-256} of a chapter's code cells and of the package
    files whose code it runs (`code_hash`). A prose edit leaves a record current, and so does
    an edit to a module's comments or docstrings; an edit to the code it ran does not."""
    chapter, code = chapter.resolve(), code_cells(chapter)
    python = "\n".join(line for line in code.splitlines() if not line.startswith(("%", "!")))
    entries = {str(chapter.relative_to(ROOT)): hashlib.sha256(code.encode()).hexdigest()}
    for path in package_files(python) + scripts_run(python, chapter.parent):
        entries[str(path.relative_to(ROOT))] = code_hash(path.read_text())
    return entries


def scripts_run(source: str, folder: pathlib.Path) -> list[pathlib.Path]:
    """Python files of the repository outside the package that a chapter names by path in a
    string (`runpy.run_path("../code/examples/whole_loop.py")`), relative to its folder."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value.endswith(".py") and "\n" not in node.value:
                path = (folder / node.value).resolve()
                if path.is_file() and ROOT in path.parents and PACKAGE not in path.parents:
                    found.append(path)
    return sorted(set(found))


def suite_manifest() -> dict[str, str]:
    """{path: `code_hash`} of what a run of the test suite runs: every Python file under
    tests/ and the package. A suite record whose manifest differs is marked stale."""
    files = sorted([*(ROOT / "tests").rglob("*.py"), *PACKAGE.rglob("*.py")])
    return {str(p.relative_to(ROOT)): code_hash(p.read_text()) for p in files}


def suite_changed(recorded: dict[str, str]) -> list[str]:
    """The suite's files that differ today from a recorded `suite_manifest`, or are new or gone."""
    today = suite_manifest()
    return sorted(p for p in today.keys() | recorded.keys() if today.get(p) != recorded.get(p))


def changed(recorded: dict[str, str]) -> list[str]:
    """The files of a recorded manifest that differ today (or are gone), and files the chapter
    imports today that the record did not."""
    chapter = next(ROOT / p for p in recorded if p.startswith("book/"))
    if not chapter.is_file():
        return sorted(recorded)
    # A file the record hashed that the chapter no longer uses does not matter: the chapter's
    # own code, or a module it uses, changed to drop it, and that shows
    today = manifest(chapter)
    return sorted(p for p in today if today[p] != recorded.get(p))


def load_run(device: str) -> dict:
    path = RESULTS / device / "run.json"
    return json.loads(path.read_text()) if path.is_file() else {}


# ---- the Sphinx side: a dropdown with the record's outputs on its chapter's page ----------


def glued_values(notebook: dict, names: list[str]) -> list[tuple[str, str]]:
    """(name, text) of each value glued under `names` in an executed notebook, in that order:
    a glued string as its text, anything else as its plain-text form. Raises ValueError naming
    a name the notebook did not glue."""
    found = {}
    for cell in notebook.get("cells", []):
        for output in cell.get("outputs", []):
            name = output.get("metadata", {}).get("scrapbook", {}).get("name")
            plain = output.get("data", {}).get("application/papermill.record/text/plain")
            if name is not None and plain is not None:
                found[name] = "".join(plain)
    missing = [n for n in names if n not in found]
    if missing:
        raise ValueError(f"glued values {missing} are not in this record (it has {sorted(found)})")
    text = lambda plain: ast.literal_eval(plain) if plain[:1] in "'\"" else plain
    return [(n, text(found[n])) for n in names]


def _record_nodes(directive, device, chapter_stem):
    from docutils import nodes

    run = load_run(device)
    entry = run.get("chapters", {}).get(chapter_stem.split("_")[0])
    para = lambda text: nodes.paragraph(text=text)
    if not entry:
        return [para(f"No {device.upper()} run of this chapter is recorded yet.")]
    took = f", in {entry['seconds']:.0f} s" if entry["seconds"] else ""
    head = (
        f"Executed on {run['device']} with JAX {run['jax']} on {entry.get('date', '?')}"
        f"{took}: {entry['status']}."
    )
    out = [para(head)]
    stale = changed(entry["manifest"])
    if stale:
        warn = nodes.warning()
        named = ", ".join(stale[:4]) + (f" and {len(stale) - 4} more" if len(stale) > 4 else "")
        warn += para(
            f"Stale: {len(stale)} of the files this run executed have changed since "
            f"({named}), so its outputs may no longer match the code above."
        )
        out.append(warn)
    for failure in entry.get("failures", []):
        where = "A cell" if failure["index"] is None else f"Cell {failure['index']}"
        out.append(para(f"{where} failed there:"))
        out.append(nodes.literal_block(text=failure["error"]))
    path = RESULTS / device / f"{chapter_stem}.ipynb"
    if not path.is_file():  # stopped before its notebook was written
        return out
    notebook = json.loads(path.read_text())
    names = [n.strip() for n in directive.options.get("glued", "").split(",") if n.strip()]
    if names:
        out.append(para("The sentences this page's prose glues, as this run computed them:"))
        items = nodes.bullet_list()
        for name in names:  # a sentence reads alone: no glue key before it
            text = chip_text(notebook, name, "", stale=False)  # "not yet recorded" if absent
            items += nodes.list_item("", nodes.paragraph(text=text))
        out.append(items)
    labelled = None
    for section, cell in zip(cell_sections(notebook), notebook["cells"]):
        shown = [n for o in cell.get("outputs", []) for n in _output_nodes(directive, o)]
        if shown:  # labelled by the section of the page the cell belongs to, once per section
            if section != labelled:
                out.append(nodes.rubric(text=section))
                labelled = section
            out.extend(shown)
    return out


def cell_sections(notebook: dict) -> list[str]:
    """The title of the section each cell of an executed chapter belongs to: the last `##`
    (or `#`) heading of the markdown cells before it, "Opening" before the first `##`."""
    sections, current = [], "Opening"
    for cell in notebook.get("cells", []):
        if cell.get("cell_type") == "markdown":
            source = "".join(cell.get("source", ""))
            for line in source.splitlines():
                match = re.match(r"##\s+(.+?)\s*$", line)
                if match:
                    current = match[1]
        sections.append(current)
    return sections


def chip_text(notebook: dict | None, name: str, spec: str, stale: bool) -> str:
    """What the {chip} role shows for a value a record glued under `name`: formatted with the
    format spec `spec` (as {glue:text} formats), "(stale record)" after it where the record's
    files have changed, "not yet recorded" where the record has no such value."""
    try:
        if notebook is None:
            raise ValueError(name)
        ((_, text),) = glued_values(notebook, [name])
    except ValueError:
        return "not yet recorded"
    if spec:
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = text
        try:
            text = format(value, spec)
        except (ValueError, TypeError) as err:
            raise ValueError(f"{name}: format {spec!r} does not apply to {text!r}") from err
    return f"{text} (stale record)" if stale else text


_RECORDS: dict[tuple[str, str], tuple[dict | None, bool]] = {}


def _record_of(device: str, stem: str) -> tuple[dict | None, bool]:
    """(the executed notebook or None, whether the record is stale) of a chapter, read once."""
    if (device, stem) not in _RECORDS:
        entry = load_run(device).get("chapters", {}).get(stem.split("_")[0])
        path = RESULTS / device / f"{stem}.ipynb"
        notebook = json.loads(path.read_text()) if entry and path.is_file() else None
        stale = bool(entry) and bool(changed(entry["manifest"]))
        _RECORDS[(device, stem)] = (notebook, stale)
    return _RECORDS[(device, stem)]


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


# Issue 41: each chapter should take at most this long on the chip (scripts/device_run.py
# stops one later, at its CHAPTER_LIMIT, so that one chapter cannot spend a whole command)
TARGET_SECONDS = 90


def _seconds(seconds: float | None) -> str:
    """A record's seconds, and whether they are over the target."""
    if not seconds:
        return ""
    over = f" (over the {TARGET_SECONDS} s target)" if seconds > TARGET_SECONDS else ""
    return f"{seconds:.0f}{over}"


def _run_nodes(directive, device):
    from docutils import nodes

    run = load_run(device)
    if not run:
        return [nodes.paragraph(text=f"No {device.upper()} run is recorded yet.")]
    chapters = sorted((ROOT / "book").glob("[0-9][0-9]*_*.md"))
    rows = [("chapter", "status there", "seconds", "date", "record")]
    for chapter in chapters:
        entry = run["chapters"].get(chapter.stem.split("_")[0])
        if entry is None:
            rows.append((chapter.stem, "not run yet", "", "", ""))
            continue
        stale = changed(entry["manifest"])
        failed = [str(f["index"]) for f in entry["failures"] if f["index"] is not None]
        cells = ("cell " if len(failed) == 1 else "cells ") + ", ".join(failed) if failed else ""
        rows.append(
            (
                chapter.stem,
                entry["status"] + (f" ({cells})" if cells else ""),
                _seconds(entry["seconds"]),
                entry.get("date", ""),
                f"stale: {len(stale)} file{'s' * (len(stale) > 1)} changed" if stale else "current",
            )
        )
    out = [nodes.paragraph(text=f"Device: {run['device']}, JAX {run['jax']}.")]
    out.append(_table(rows))
    tests = run.get("tests")
    if tests and "tests" in tests:
        text = (
            f"The test suite there ({tests['date']}, one process): {tests['tests']} tests, "
            f"{tests['failures']} failed, {tests['errors']} errors, {tests['skipped']} "
            f"skipped, in {tests['seconds']:.0f} s."
        )
    elif tests:  # stopped by the run's budget
        counts = ", ".join(f"{len(tests.get(f'{k} list', []))} {k}" for k in OUTCOME_WORDS)
        text = (
            f"The test suite there ({tests['date']}, one process) was stopped by the run's "
            f"budget ({tests['detail']}); of the tests that ended: {counts or 'none listed'}."
        )
    if tests:
        stale = suite_changed(tests["manifest"]) if "manifest" in tests else None
        if stale is None:
            text += " Its files were not hashed (a run before suite manifests)."
        elif stale:
            text += f" Stale: {len(stale)} of its files changed since ({', '.join(stale[:6])}"
            text += ", ...)." if len(stale) > 6 else ")."
        else:
            text += " Current: no test or package file has changed since."
        out.append(nodes.paragraph(text=text))
        listed = [
            (kind, *_test_and_reason(line))
            for kind in ("failure", "error", "skipped")
            for line in tests.get(f"{kind} list", [])
        ]
        if listed:
            # Test ids are long words: the table's class lets them wrap anywhere (the CSS)
            out.append(_table([("kind", "test", "reason"), *listed], classes=["device-tests"]))
    return out


def _test_and_reason(line: str) -> tuple[str, str]:
    """A listed test's id and its reason, from "id: reason", where the id's parameters
    ("name[a-b: c]") may hold a colon themselves."""
    match = re.match(r"(\S*?(?:\[.*?\])?): (.*)", line, re.S)
    return (match[1], match[2]) if match else (line, "")


OUTCOME_WORDS = ("passed", "failure", "error", "skipped")


def _table(rows, classes=()):
    from docutils import nodes

    table, group = nodes.table(classes=list(classes)), nodes.tgroup(cols=len(rows[0]))
    table += group
    group.extend(nodes.colspec(colwidth=1) for _ in rows[0])
    for part, part_rows in ((nodes.thead(), rows[:1]), (nodes.tbody(), rows[1:])):
        for row in part_rows:
            line = nodes.row()
            for cell in row:
                entry = nodes.entry()
                entry += nodes.paragraph(text=str(cell))
                line += entry
            part += line
        group += part
    return table


def setup(app):
    from docutils.parsers.rst import Directive, directives

    class DeviceRun(Directive):
        option_spec = {"device": directives.unchanged}

        def run(self):
            self.env = self.state.document.settings.env
            device = self.options.get("device", "tpu")
            self.env.note_dependency(str(RESULTS / device / "run.json"))
            return _run_nodes(self, device)

    app.add_directive("device-run", DeviceRun)

    class DeviceRecord(Directive):
        optional_arguments = 1
        option_spec = {"device": directives.unchanged, "glued": directives.unchanged}

        def run(self):
            self.env = self.state.document.settings.env
            device = self.options.get("device", "tpu")
            stem = self.arguments[0] if self.arguments else pathlib.Path(self.env.docname).name
            for path in (RESULTS / device / "run.json", RESULTS / device / f"{stem}.ipynb"):
                self.env.note_dependency(str(path))
            return _record_nodes(self, device, stem)

    app.add_directive("device-record", DeviceRecord)

    def chip_role(name, rawtext, text, lineno, inliner, options=None, content=None):
        """{chip}`NAME` or {chip}`NAME:.2f`: the value this page's TPU record glued as NAME."""
        from docutils import nodes

        env = inliner.document.settings.env
        key, _, spec = text.partition(":")
        stem = pathlib.Path(env.docname).name
        env.note_dependency(str(RESULTS / "tpu" / "run.json"))
        env.note_dependency(str(RESULTS / "tpu" / f"{stem}.ipynb"))
        notebook, stale = _record_of("tpu", stem)
        try:
            shown = chip_text(notebook, key.strip(), spec.strip(), stale)
        except ValueError as err:
            message = inliner.reporter.error(str(err), line=lineno)
            return [inliner.problematic(rawtext, rawtext, message)], [message]
        return [nodes.inline(rawtext, shown, classes=["chip-value"])], []

    app.add_role("chip", chip_role)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
