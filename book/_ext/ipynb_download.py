"""Offers each executed chapter as a .ipynb download, with no launch service configured.

sphinx-book-theme adds ".ipynb" to a page's download menu only when a launch button (Binder,
Colab, ...) is configured. This book configures none, since none would work for a repository
that may not be public, so this copies the notebook myst-nb executed (outputs included) into
the site's _sources folder and tells the theme it is there.
"""

import shutil
from pathlib import Path


def add_ipynb_source(app, pagename, templatename, context, doctree):
    if doctree is None or not context.get("sourcename", "").endswith(".md"):
        return
    executed = Path(app.outdir).parent / "jupyter_execute" / f"{pagename}.ipynb"
    if not executed.is_file():  # a page without code cells is not a notebook
        return
    target = Path(app.outdir) / "_sources" / f"{pagename}.ipynb"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(executed, target)
    context["ipynb_source"] = f"{pagename}.ipynb"


def setup(app):
    # Before the theme builds its header buttons (priority 501).
    app.connect("html-page-context", add_ipynb_source, priority=400)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
