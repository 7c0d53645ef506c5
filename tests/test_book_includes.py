"""Every listing the book includes exists: the file, and the function or class it names."""

import ast
import pathlib
import re

import pytest

BOOK = pathlib.Path(__file__).resolve().parents[1] / "book"
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
    source = (BOOK / path).resolve()
    assert source.is_file(), f"{chapter} includes {path}, which does not exist"
    assert "lines" not in options, (
        f"{chapter} includes {path} by :lines:, which drifts; use :pyobject:"
    )
    assert "pyobject" in options, f"{chapter} includes {path} without :pyobject:"
    assert options["pyobject"] in _top_level_names(source), (
        f"{chapter} includes {options['pyobject']!r} from {path}, which defines no such object"
    )


def test_a_missing_object_would_be_caught(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "def present():\n    pass\n\nclass Box:\n    def method(self):\n        pass\n"
    )
    assert _top_level_names(module) == {"present", "Box", "Box.method"}
