import warnings

import pytest

from jaxloops import measure


def test_a_failed_check_raises_while_the_book_is_built(monkeypatch):
    monkeypatch.setenv("JAXLOOPS_STRICT", "1")
    with pytest.raises(AssertionError, match="loss fell"):
        measure.check(2.0 < 1.0, "loss fell")


def test_a_failed_check_only_warns_in_a_readers_run(monkeypatch):
    monkeypatch.delenv("JAXLOOPS_STRICT", raising=False)
    with pytest.warns(measure.PageCheckWarning, match="loss fell"):
        assert measure.check(False, "loss fell") is False


def test_a_check_that_holds_is_silent_either_way(monkeypatch):
    for value in ("1", "0"):
        monkeypatch.setenv("JAXLOOPS_STRICT", value)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert measure.check(1 < 2, "never shown") is True
