"""The built site, served on localhost and visited in headless Chromium, once per page.

Inputs (environment, or pytest options):
  BOOK_HTML / --book-html   the built site (default _build/html)
  CHROMIUM / --chromium     Debian's Chromium (default /usr/bin/chromium); playwright drives it,
                            it never downloads a browser
  BROWSER_SCREENSHOTS       a folder: save a full-page PNG of every page there
The counts of what was checked are printed at the end and written to browser-report.json next
to the site's folder.
"""

import dataclasses
import functools
import http.server
import json
import os
import tempfile
import threading
import urllib.parse
from pathlib import Path

import pytest
from sitepages import html_dir, is_local, site_pages

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def pytest_addoption(parser):
    parser.addoption("--book-html", default=os.environ.get("BOOK_HTML", "_build/html"))
    parser.addoption("--chromium", default=os.environ.get("CHROMIUM", "/usr/bin/chromium"))


def pytest_generate_tests(metafunc):
    if "page_path" in metafunc.fixturenames:
        metafunc.parametrize("page_path", site_pages(html_dir(metafunc.config)))


@dataclasses.dataclass
class Visit:
    """What one page did in the browser."""

    url: str
    status: int | None
    requests: list[str]
    failed: list[str]  # requests that failed, or answered 4xx/5xx
    console_errors: list[str]
    images: list[dict]
    math: dict
    failed_fonts: list[str]
    scrolling_code: list[str]  # code blocks whose lines are wider than the code column
    # MyST roles shown as text (`{glue:text}` written in backticks), and Markdown tables
    # glued in a format without tables (commonmark), shown as their source
    unrendered_roles: list[str]


@dataclasses.dataclass
class Tally:
    pages: int = 0
    requests: int = 0
    images: int = 0
    math: int = 0
    hosts: set = dataclasses.field(default_factory=set)


TALLY = Tally()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="session")
def site_root(pytestconfig) -> Path:
    return html_dir(pytestconfig)


@pytest.fixture(scope="session")
def base_url(site_root):
    handler = functools.partial(QuietHandler, directory=str(site_root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="session")
def browser_context(pytestconfig):
    from playwright.sync_api import sync_playwright

    chromium = pytestconfig.getoption("--chromium")
    if not os.access(chromium, os.X_OK):
        pytest.fail(f"no Chromium at {chromium}: apt-get install chromium, or set CHROMIUM")
    with (
        tempfile.TemporaryDirectory(prefix="book-chromium-") as profile,
        sync_playwright() as playwright,
    ):
        context = playwright.chromium.launch_persistent_context(
            profile,
            executable_path=chromium,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 900},
        )
        # Anything for another host is refused at once (and recorded by the visit): the
        # suite must not depend on, or wait for, the network.
        context.route(lambda url: not is_local(url), lambda route: route.abort())
        yield context
        context.close()


def settle(page, script: str) -> None:
    """Runs `script`, again after a navigation (a redirect) interrupted it."""
    for _ in range(3):
        try:
            page.evaluate(script)
            return
        except Exception as error:  # playwright's Error: the page navigated away meanwhile
            if "context was destroyed" not in str(error):
                raise
            page.wait_for_load_state("load")
    page.evaluate(script)


# Code a reader reads (cell inputs and listings, not outputs): each block, named by its first
# line, that scrolls sideways, and each whose column is too narrow for its longest line, up to
# 100 characters (the package's limit), set in the block's own font, unwrapped: a line of up
# to 100 characters must show whole, and only a longer one (a chapter's own cell) may wrap.
SCROLLING_CODE = """() => Array.from(document.querySelectorAll('div.highlight pre'))
    .filter(p => !p.closest('.cell_output') && p.clientWidth > 0)
    .filter(p => {
        const probe = document.createElement('span');
        probe.style.whiteSpace = 'pre';
        const longest = Math.max(...p.textContent.split('\\n').map(line => line.length));
        probe.textContent = 'x'.repeat(Math.min(100, longest));
        p.appendChild(probe);
        const style = getComputedStyle(p);
        const room = p.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
        const too_narrow = probe.getBoundingClientRect().width > room + 1;
        probe.remove();
        return too_narrow || p.scrollWidth > p.clientWidth + 1;
    })
    .map(p => (p.textContent.split('\\n')[0] || '').slice(0, 80))"""


# A MyST role the build did not render, in prose (listings may show one on purpose): an
# inline code span that is a bare role name, `{glue:text}`, or a role's text in plain prose.
UNRENDERED_ROLES = """() => {
    const role = /^\\{[a-z][a-z:-]*\\}$/;
    const spans = Array.from(document.querySelectorAll('article code'))
        .filter(c => !c.closest('pre') && role.test(c.textContent.trim()))
        .map(c => c.parentElement.textContent.trim().slice(0, 80));
    const walker = document.createTreeWalker(
        document.querySelector('article') || document.body, NodeFilter.SHOW_TEXT);
    const prose = [];
    for (let n = walker.nextNode(); n; n = walker.nextNode()) {
        if (!n.parentElement.closest('pre, code, script, style')
            && (/\\{(glue|cite|doc|ref|numref)(:[a-z]+)?\\}/.test(n.textContent)
                || /\\|\\s*:?(-{3,}|—+):?\\s*\\|/.test(n.textContent)))  // a table left as text
            prose.push(n.textContent.trim().slice(0, 80));
    }
    return spans.concat(prose);
}"""


def visit_page(context, url: str, screenshot: Path | None = None) -> Visit:
    """Loads `url`, waits for MathJax and the network to settle, and records what happened."""
    page = context.new_page()
    requests, failed, console = [], [], []
    page.on("request", lambda request: requests.append(request.url))
    page.on("requestfailed", lambda request: failed.append(f"{request.url} ({request.failure})"))
    page.on(
        "response",
        lambda response: (
            response.status >= 400 and failed.append(f"{response.url} ({response.status})")
        ),
    )
    page.on("console", lambda message: message.type == "error" and console.append(message.text))
    page.on("pageerror", lambda error: console.append(f"uncaught: {error}"))
    try:
        response = page.goto(url, wait_until="load")
        page.wait_for_load_state("networkidle")  # and any redirect (the site's index.html) is done
        settle(
            page,
            "() => window.MathJax && MathJax.startup"
            " ? MathJax.startup.promise.then(() => null) : null",
        )
        page.wait_for_load_state("networkidle")  # fonts MathJax asks for once it has typeset
        settle(page, "() => document.fonts.ready.then(() => null)")
        images = page.evaluate(
            "() => Array.from(document.images)"
            ".map(i => ({src: i.currentSrc || i.src, width: i.naturalWidth}))"
        )
        math = page.evaluate("""() => {
            const all = Array.from(document.querySelectorAll('.math'));
            return {total: all.length,
                    typeset: all.filter(e => e.querySelector('mjx-container')).length,
                    errors: document.querySelectorAll('mjx-merror').length};
        }""")
        failed_fonts = page.evaluate(
            "() => Array.from(document.fonts).filter(f => f.status === 'error').map(f => f.family)"
        )
        scrolling_code = page.evaluate(SCROLLING_CODE)
        unrendered_roles = page.evaluate(UNRENDERED_ROLES)
        if screenshot is not None:
            page.screenshot(path=str(screenshot), full_page=True)
    finally:
        page.close()
    TALLY.pages += 1
    TALLY.requests += len(requests)
    TALLY.images += len(images)
    TALLY.math += math["typeset"]
    TALLY.hosts.update(
        urllib.parse.urlsplit(r).hostname or urllib.parse.urlsplit(r).scheme for r in requests
    )
    return Visit(
        url,
        response.status if response else None,
        requests,
        failed,
        console,
        images,
        math,
        failed_fonts,
        scrolling_code,
        unrendered_roles,
    )


@pytest.fixture(scope="session")
def visits(browser_context, base_url):
    """Each page is visited once; the tests of that page read the same record."""
    shots = os.environ.get("BROWSER_SCREENSHOTS")
    if shots:
        Path(shots).mkdir(parents=True, exist_ok=True)
    cache = {}

    def visit(page_path: str) -> Visit:
        if page_path not in cache:
            shot = Path(shots) / (page_path.replace("/", "_") + ".png") if shots else None
            cache[page_path] = visit_page(browser_context, base_url + page_path, shot)
        return cache[page_path]

    return visit


def pytest_terminal_summary(terminalreporter, config):
    if not TALLY.pages:
        return
    line = (
        f"browser suite: {TALLY.pages} pages, {TALLY.images} images, {TALLY.requests} requests "
        f"(hosts: {', '.join(sorted(TALLY.hosts))}), {TALLY.math} math elements typeset"
    )
    terminalreporter.write_line(line)
    try:
        report = html_dir(config).parent / "browser-report.json"
        report.write_text(
            json.dumps({**dataclasses.asdict(TALLY), "hosts": sorted(TALLY.hosts)}, indent=1)
        )
    except OSError:  # a read-only site folder: the line above is the report
        pass
