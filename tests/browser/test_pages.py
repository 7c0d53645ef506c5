"""Every page of the built book, as a reader's browser sees it (see conftest.py)."""

import urllib.parse

from sitepages import ROOT, is_local


def test_page_loads(visits, page_path):
    assert visits(page_path).status == 200


def test_no_console_errors(visits, page_path):
    assert visits(page_path).console_errors == []


def test_every_request_stays_on_localhost_and_succeeds(visits, page_path):
    visit = visits(page_path)
    assert [url for url in visit.requests if not is_local(url)] == []
    assert visit.failed == []


def test_every_image_loads(visits, page_path):
    broken = [image["src"] for image in visits(page_path).images if image["width"] == 0]
    assert broken == []


def test_math_is_typeset(visits, page_path):
    math = visits(page_path).math
    assert math["typeset"] == math["total"], (
        f"{math['total'] - math['typeset']} math elements left as TeX"
    )
    assert math["errors"] == 0


def test_fonts_load(visits, page_path):
    assert visits(page_path).failed_fonts == []


def test_code_fits_the_code_column(visits, page_path):
    """No listing or cell input scrolls sideways: the column fits the package's line length."""
    assert visits(page_path).scrolling_code == []


def test_no_myst_role_is_left_as_text(visits, page_path):
    """A role written inside backticks (`{glue:text}`name``) shows as code, not its value; a
    Markdown table glued as commonmark shows as its pipes and dashes, not a table."""
    assert visits(page_path).unrendered_roles == []


def test_chapters_have_math_and_figures(visits):
    """The checks above are not vacuous: the chapters do show typeset math and figures."""
    assert visits("book/05_train_step.html").math["typeset"] > 0
    assert len(visits("book/07_evaluation.html").images) >= 3


def test_pages_offer_their_sources_for_download(browser_context, base_url, site_root):
    page = browser_context.new_page()
    try:
        page.goto(base_url + "book/05_train_step.html")
        links = {
            label: page.locator(
                f".dropdown-download-buttons a.btn-download-{label}-button"
            ).get_attribute("href")
            for label in ("notebook", "source")
        }
    finally:
        page.close()
    assert links["notebook"].endswith("05_train_step.ipynb")
    assert links["source"].endswith("05_train_step.md")
    for href in links.values():
        path = urllib.parse.urlsplit(urllib.parse.urljoin(base_url + "book/", href)).path
        assert (site_root / path.lstrip("/")).is_file(), href


def test_code_blocks_have_copy_buttons(browser_context, base_url):
    page = browser_context.new_page()
    try:
        page.goto(base_url + "book/05_train_step.html", wait_until="load")
        blocks = page.locator("div.highlight").count()
        buttons = page.locator("div.highlight button.copybtn").count()
    finally:
        page.close()
    assert blocks > 0 and buttons == blocks


def test_exercise_solutions_are_hidden_until_opened(browser_context, base_url):
    page = browser_context.new_page()
    try:
        page.goto(base_url + "book/05_train_step.html", wait_until="load")
        solution = page.locator("div.admonition.dropdown").first
        body = solution.locator("div.highlight").first
        hidden_before = not body.is_visible()
        solution.locator("button.toggle-button").click()
        body.wait_for(state="visible")
        shown_after = body.is_visible()
    finally:
        page.close()
    assert hidden_before and shown_after


def test_search_finds_a_term_from_a_chapter(browser_context, base_url):
    page = browser_context.new_page()
    try:
        page.goto(base_url + "search.html?q=donate_argnums", wait_until="load")
        results = page.locator("#search-results ul.search li a")
        results.first.wait_for(timeout=30_000)
        hrefs = [results.nth(i).get_attribute("href") for i in range(results.count())]
    finally:
        page.close()
    assert any("05_train_step" in href for href in hrefs), hrefs


def test_a_chapter_shows_its_tpu_run_one_click_away(browser_context, base_url):
    """The dropdown at the end of a chapter holds the recorded TPU run: hidden, then shown."""
    page = browser_context.new_page()
    try:
        page.goto(base_url + "book/01_watching_jax.html", wait_until="load")
        dropdown = page.locator("details, div.dropdown").filter(has_text="The run on a TPU").last
        record = dropdown.get_by_text("Executed on TPU", exact=False).first
        hidden_before = not record.is_visible()
        dropdown.locator("summary, button.toggle-button").first.click()
        record.wait_for(state="visible")
        page.goto(base_url + "book/tpu.html", wait_until="load")
        rows = page.locator("table tbody tr").count()
        suite = page.get_by_text("The test suite there", exact=False).first.inner_text()
    finally:
        page.close()
    chapters = len(list((ROOT / "book").glob("[0-9][0-9]*_*.md")))
    assert hidden_before and rows >= chapters
    # the suite's record says whether the files it ran are today's
    assert any(word in suite for word in ("Current:", "Stale:", "were not hashed")), suite
