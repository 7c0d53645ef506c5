"""What the built pages say: no page states a goal, names an issue or speaks of the project's
device time (scripts/book_report.py lists the patterns); the chip's figures in a chapter's
text come from its record. Reads the built HTML; needs no browser."""

import sys
from pathlib import Path

import pytest
from sitepages import site_pages

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import book_report  # noqa: E402 - scripts/ is put on the path just above


def test_no_page_states_a_goal_an_issue_or_the_projects_workings(site_root):
    """No page names an issue or the project's device time; no page but the build
    information's goals table (where each goal's verdict belongs) states a goal."""
    found = []
    for path in site_pages(site_root):
        if path.startswith(("genindex", "search")):
            continue
        text = book_report.page_text((site_root / path).read_text())
        for what, passage in book_report.forbidden(text):
            if not (path == "book/build_info.html" and what in book_report.GOAL_WORDS):
                found.append(f"{path}: {what}: …{passage}…")
    assert found == []
    chapters = [p for p in site_pages(site_root) if p.startswith("book/") and p[5:7].isdigit()]
    assert len(chapters) >= 18  # the check read the chapters, not an empty site


@pytest.mark.parametrize(
    "sentence",
    [
        "The goal is ≥ 95 %: not applicable here (set for one TPU v5e chip).",
        "(Issue 43 set this goal for chapter 11's step.)",
        "the project's device time is rationed (30 minutes a session)",
    ],
)
def test_the_text_check_catches_each_kind_of_sentence(sentence):
    assert book_report.forbidden(sentence) != []


def test_the_text_check_passes_the_books_own_words():
    ok = "Each goal is measured by make bench. The chip took 2.91x; generation issues tokens."
    assert book_report.forbidden(ok) == []


def test_a_dropdowns_words_are_not_visible_words():
    html = (
        '<article class="bd-article"><p>one two three</p>'
        '<details class="sd-dropdown"><summary>How this is checked</summary>'
        "<p>four five six seven</p></details></article>"
    )
    assert book_report.visible_and_hidden(html) == (3 + 4, 4)  # its title shows
