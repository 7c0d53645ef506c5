"""Every listing the book includes exists: the file, and the function or class it names."""

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
# Files a chapter may show whole, without :pyobject:, each for its reason. A script that stands
# alone (it imports nothing from the package) is shown to be read and copied as one file, and a
# whole file cannot drift from itself as a range of lines can.
WHOLE_FILES = {
    "code/examples/whole_loop.py",  # chapter 7: the whole loop on one screen
}
INCLUDE = re.compile(r"```\{literalinclude\}\s+(?P<path>\S+)\s*\n(?P<options>(?::[^\n]*\n)*)")


def _includes():
    for chapter in sorted(BOOK.glob("*.md")):
        for match in INCLUDE.finditer(chapter.read_text()):
            options = dict(re.findall(r":(\w+):\s*(.*)", match["options"]))
            yield chapter.name, match["path"], options


def _top_level_names(path: pathlib.Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            if isinstance(node, ast.ClassDef):
                names |= {
                    f"{node.name}.{item.name}"
                    for item in node.body
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                }
    return names


INCLUDES = list(_includes())


def test_every_numbered_chapter_includes_listings_from_the_package():
    chapters = {chapter for chapter, _, _ in INCLUDES}
    numbered = {p.name for p in BOOK.glob("[0-9][0-9]*_*.md")}
    assert numbered and numbered <= chapters


@pytest.mark.parametrize(
    "chapter,path,options", INCLUDES, ids=[f"{c}:{o.get('pyobject')}" for c, _, o in INCLUDES]
)
def test_each_listing_names_an_existing_object_by_pyobject(chapter, path, options):
    assert listing_problem(chapter, path, options) is None


def listing_problem(chapter: str, path: str, options: dict[str, str]) -> str | None:
    """What is wrong with a listing `chapter` includes from `path` (relative to book/), or None."""
    source = (BOOK / path).resolve()
    if not source.is_file():
        return f"{chapter} includes {path}, which does not exist"
    if "lines" in options:
        return f"{chapter} includes {path} by :lines:, which drifts; use :pyobject:"
    if "pyobject" not in options:
        whole = source.is_relative_to(ROOT) and source.relative_to(ROOT).as_posix() in WHOLE_FILES
        return None if whole else f"{chapter} includes {path} without :pyobject:"
    if options["pyobject"] not in _top_level_names(source):
        return (
            f"{chapter} includes {options['pyobject']!r} from {path}, which defines no such object"
        )
    return None


def test_only_a_listed_standalone_file_is_shown_whole():
    assert listing_problem("07.md", "../code/examples/whole_loop.py", {}) is None
    # A package module shown whole, a listed file by :lines:, a missing object: each refused.
    assert "without :pyobject:" in listing_problem("07.md", "../code/jaxloops/loop.py", {})
    by_lines = listing_problem("07.md", "../code/examples/whole_loop.py", {"lines": "1-9"})
    assert ":lines:" in by_lines
    assert "no such object" in listing_problem(
        "07.md", "../code/jaxloops/loop.py", {"pyobject": "nope"}
    )


def test_a_missing_object_would_be_caught(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "def present():\n    pass\n\nclass Box:\n    def method(self):\n        pass\n"
    )
    assert _top_level_names(module) == {"present", "Box", "Box.method"}
