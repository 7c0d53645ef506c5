"""What a reader sees of each built chapter: its visible words, the words behind its dropdowns,
the seconds its strict execution took (the build's own table on the build-information page),
and any sentence about the project's own workings that a chapter must not show.

Usage: python scripts/book_report.py [_build/html] [--before OTHER_HTML]

Visible words count the article's text, code and outputs included, less what sits in a
collapsed dropdown (sphinx-design's `dropdown`, an admonition with the `dropdown` class, a
toggled cell) and less the page's navigation. With --before, a column per build.
"""

import argparse
import pathlib
import re
import sys

from bs4 import BeautifulSoup

ROOT = pathlib.Path(__file__).resolve().parents[1]
# What a page must never say: a goal stated in a chapter, an issue's number, the project's
# device time and how it is shared out. (build_info's goals table names goals by what they
# measure.)
FORBIDDEN = {
    "a goal stated on the page": r"\bThe goal is\b",
    "a goal's verdict on the page": r"\bnot applicable here\b",
    "an issue's number": r"\b[Ii]ssues?\s+#?\d+",
    "the project's device time": r"\b(?:project|session)(?:'s|’s)? device time\b",
    "how device time is shared out": r"\bration(?:ed|ing)\b",
}
# Where a goal's words belong: build_info's goals table, not a chapter.
GOAL_WORDS = ("a goal stated on the page", "a goal's verdict on the page")
HIDDEN = ["details", "div.dropdown", "div.toggle-hidden", "div.tag_hide-input div.cell_input",
          "script", "style", "a.headerlink", "button"]  # fmt: skip


def article(html: str) -> BeautifulSoup:
    soup = BeautifulSoup(html, "html.parser")
    main = soup.select_one("article.bd-article") or soup.select_one("main") or soup
    return main


def words(text: str) -> int:
    return len(re.findall(r"\S+", text))


def visible_and_hidden(html: str) -> tuple[int, int]:
    """(visible words, words inside dropdowns) of one built page's article."""
    main = article(html)
    hidden = 0
    for selector in HIDDEN:
        for node in main.select(selector):
            if selector in ("details", "div.dropdown", "div.toggle-hidden"):
                title = node.select_one("summary, p.admonition-title")
                shown = title.get_text(" ") if title else ""  # a dropdown's title shows
                hidden += words(node.get_text(" ")) - words(shown)
                node.replace_with(shown)
            else:
                node.decompose()
    return words(main.get_text(" ")), hidden


def forbidden(text: str) -> list[tuple[str, str]]:
    """(what, the passage) for each sentence of `text` a page must not show."""
    found = []
    for what, pattern in FORBIDDEN.items():
        for match in re.finditer(pattern, text):
            start, end = max(0, match.start() - 60), min(len(text), match.end() + 60)
            found.append((what, " ".join(text[start:end].split())))
    return found


def page_text(html: str) -> str:
    """The whole article's text, dropdowns included (a forbidden sentence hides nowhere)."""
    main = article(html)
    for node in main.select("script, style"):
        node.decompose()
    return main.get_text(" ")


def exec_seconds(html_dir: pathlib.Path) -> dict[str, float]:
    """{chapter stem: seconds} from the build's execution table on build_info.html."""
    path = html_dir / "book" / "build_info.html"
    if not path.is_file():
        return {}
    seconds = {}
    for row in BeautifulSoup(path.read_text(), "html.parser").select("table tr"):
        cells = [c.get_text(" ", strip=True) for c in row.select("td")]
        if len(cells) >= 4 and re.fullmatch(r"[\d.]+", cells[3]):
            seconds[cells[0].split("/")[-1]] = float(cells[3])
    return seconds


def chapters(html_dir: pathlib.Path) -> list[pathlib.Path]:
    return sorted((html_dir / "book").glob("[0-9][0-9]*_*.html"))


def report(html_dir: pathlib.Path) -> dict[str, dict]:
    times = exec_seconds(html_dir)
    rows = {}
    for page in chapters(html_dir):
        visible, hidden = visible_and_hidden(page.read_text())
        rows[page.stem] = {"visible": visible, "dropdowns": hidden, "seconds": times.get(page.stem)}
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("html", nargs="?", default=str(ROOT / "_build" / "html"))
    parser.add_argument("--before", help="another build's html folder, shown beside")
    args = parser.parse_args(argv)
    html_dir = pathlib.Path(args.html)
    if not (html_dir / "index.html").is_file():
        raise SystemExit(f"no built book at {html_dir}: run `make book` first")
    now = report(html_dir)
    before = report(pathlib.Path(args.before)) if args.before else {}
    head = "| chapter | visible words | in dropdowns | strict execution, s |"
    if before:
        head = "| chapter | visible words before | after | in dropdowns | strict execution, s |"
    print(head)
    print("|" + " --- |" * (head.count("|") - 1))
    for stem, row in now.items():
        secs = f"{row['seconds']:.1f}" if row["seconds"] is not None else "?"
        cells = [stem]
        if before:
            cells.append(str(before.get(stem, {}).get("visible", "—")))
        cells += [f"{row['visible']:,}", f"{row['dropdowns']:,}", secs]
        print("| " + " | ".join(cells) + " |")
    for stem in now:
        text = page_text((html_dir / "book" / f"{stem}.html").read_text())
        for what, passage in forbidden(text):
            print(f"{stem}: {what}: …{passage}…", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
