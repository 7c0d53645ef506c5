"""No broken internal link or anchor anywhere in the built site (no browser needed).

Sphinx's nitpicky mode (-n) catches unresolved cross-references in the sources; this checks
what ended up in the HTML: every href/src that points inside the site names a file that
exists, and every #fragment names an id (or name) in the page it points to.
"""

import functools
import html.parser
import urllib.parse
from pathlib import Path

from sitepages import site_pages

LINK_ATTRIBUTES = {
    ("a", "href"),
    ("link", "href"),
    ("img", "src"),
    ("script", "src"),
    ("source", "src"),
}


class LinkParser(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.links, self.anchors = [], set()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for key in ("id", "name") if tag == "a" else ("id",):
            if attrs.get(key):
                self.anchors.add(attrs[key])
        for tag_name, attribute in LINK_ATTRIBUTES:
            if tag == tag_name and attrs.get(attribute):
                self.links.append(attrs[attribute])


@functools.cache
def parse(path: Path) -> LinkParser:
    parser = LinkParser()
    parser.feed(path.read_text(encoding="utf-8"))
    return parser


def broken_links(root: Path, page: str) -> list[str]:
    source = root / page
    broken = []
    for link in parse(source).links:
        parts = urllib.parse.urlsplit(link)
        if parts.scheme or parts.netloc or link.startswith("javascript:"):
            continue  # another site (never fetched by the book's pages; see test_pages.py)
        target = (
            (source.parent / urllib.parse.unquote(parts.path)).resolve() if parts.path else source
        )
        if target.is_dir():
            target = target / "index.html"
        if root.resolve() not in (target, *target.parents):
            broken.append(f"{link} (outside the site)")
        elif not target.is_file():
            broken.append(f"{link} (no such file)")
        elif parts.fragment and target.suffix == ".html":
            fragment = urllib.parse.unquote(parts.fragment)
            if fragment not in parse(target).anchors:
                broken.append(f"{link} (no anchor #{fragment})")
    return broken


def test_internal_links_and_anchors_resolve(site_root, page_path):
    assert broken_links(site_root, page_path) == []


def test_the_check_sees_the_book(site_root):
    pages = site_pages(site_root)
    assert "book/05_train_step.html" in pages and "search.html" in pages
    assert any("#" in link for link in parse(site_root / "book/05_train_step.html").links)
