"""The pages' bookkeeping: what turns one chapter's rows into that page's numbers, tables,
plots, sentences and goals.

One module per chapter that needs one, named like the chapter (`pages/ch10_heads_and_cache.py`
for `book/10_heads_and_cache.md`; `gpu_appendix` for `book/gpu_appendix.md` and the sidebars
that quote the recorded GPU run), and what every page shares: `common`'s `check`, which stops
the book's build on a claim its numbers contradict and only warns in a reader's own run, and
`render`'s tables and drawings. A page module may import the concepts and
`jaxloops.measure`; nothing outside `pages/` imports it. A chapter imports its own as
`from jaxloops.pages import ch10_heads_and_cache as page`.
"""

from jaxloops.pages.common import MiB, PageCheckWarning, check, glue_all, strict

__all__ = (
    "check",
    "glue_all",
    "MiB",
    "PageCheckWarning",
    "strict",
)
