import sys
import types
import warnings

import pytest

from jaxloops import pages


def test_a_failed_check_raises_while_the_book_is_built(monkeypatch):
    monkeypatch.setenv("JAXLOOPS_STRICT", "1")
    with pytest.raises(AssertionError, match="loss fell"):
        pages.check(2.0 < 1.0, "loss fell")


def test_a_failed_check_only_warns_in_a_readers_run(monkeypatch):
    monkeypatch.delenv("JAXLOOPS_STRICT", raising=False)
    with pytest.warns(pages.PageCheckWarning, match="loss fell"):
        assert pages.check(False, "loss fell") is False


def test_a_check_that_holds_is_silent_either_way(monkeypatch):
    for value in ("1", "0"):
        monkeypatch.setenv("JAXLOOPS_STRICT", value)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert pages.check(1 < 2, "never shown") is True


def test_glue_all_glues_each_value_under_its_prefixed_name(monkeypatch):
    glued = []
    record = lambda name, value, display: glued.append((name, value, display))  # noqa: E731
    fake = types.SimpleNamespace(glue=record)
    monkeypatch.setitem(sys.modules, "myst_nb", fake)
    pages.glue_all("ch14_", B=3, T=5)
    assert glued == [("ch14_B", 3, False), ("ch14_T", 5, False)]
