"""Which files of the built site are pages, and which URLs stay on this machine."""

import urllib.parse
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOCAL_HOSTS = {"127.0.0.1", "localhost"}
# Folders of the site that hold assets, not pages (theme templates such as webpack-macros.html
# live in _static).
NOT_PAGES = {"_static", "_sources", "_images", "_downloads"}


def html_dir(config) -> Path:
    path = Path(config.getoption("--book-html"))
    path = path if path.is_absolute() else ROOT / path
    if not (path / "index.html").is_file():
        raise pytest.UsageError(f"no built book at {path} (run `make book`, or set BOOK_HTML)")
    return path


def site_pages(root: Path) -> list[str]:
    """Every HTML page of the site, as a path relative to its root."""
    pages = []
    for path in sorted(root.rglob("*.html")):
        parts = path.relative_to(root).parts
        if parts[0] in NOT_PAGES or any(part.startswith(".") for part in parts):
            continue
        pages.append(path.relative_to(root).as_posix())
    return pages


def is_local(url: str) -> bool:
    parsed = urllib.parse.urlsplit(url)
    return parsed.scheme in ("data", "blob", "about") or parsed.hostname in LOCAL_HOSTS
