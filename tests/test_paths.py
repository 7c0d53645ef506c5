"""Path arguments are checked before any work: a ValueError that names the path."""

import os

import pytest

from jaxloops import paths

# Root may write anywhere chmod forbids; /proc refuses a new file even to root.
UNWRITABLE_PARENT = "/proc" if os.geteuid() == 0 else None


@pytest.fixture
def unwritable(tmp_path):
    if UNWRITABLE_PARENT is not None:
        yield UNWRITABLE_PARENT
        return
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    yield str(locked)
    locked.chmod(0o700)


def test_a_writable_directory_may_exist_or_be_new(tmp_path):
    assert paths.writable_directory(tmp_path) == tmp_path
    assert paths.writable_directory(tmp_path / "new") == tmp_path / "new"
    assert not (tmp_path / "new").exists()  # checked, not created
    assert paths.writable_directory("relative").is_absolute()


def test_a_directory_argument_that_names_a_file_is_refused(tmp_path):
    (tmp_path / "a-file").write_text("")
    with pytest.raises(ValueError, match=f"{tmp_path}/a-file is a file, not a directory"):
        paths.writable_directory(tmp_path / "a-file")
    with pytest.raises(ValueError, match=f"{tmp_path}/a-file is a file, not a directory"):
        paths.existing_directory(tmp_path / "a-file")


def test_a_missing_parent_is_refused_not_created(tmp_path):
    for check in (paths.writable_directory, paths.writable_file):
        with pytest.raises(ValueError, match=f"its parent {tmp_path}/no does not exist"):
            check(tmp_path / "no" / "such")
    (tmp_path / "a-file").write_text("")
    with pytest.raises(ValueError, match=f"its parent {tmp_path}/a-file is not a directory"):
        paths.writable_directory(tmp_path / "a-file" / "sub")
    assert not (tmp_path / "no").exists()


def test_an_unwritable_place_is_refused(unwritable):
    with pytest.raises(ValueError, match=f"{unwritable}/new: cannot write in {unwritable}"):
        paths.writable_directory(f"{unwritable}/new")
    with pytest.raises(ValueError, match=f"cannot write in {unwritable}"):
        paths.writable_file(f"{unwritable}/out.npz")


def test_an_existing_directory_must_exist(tmp_path):
    assert paths.existing_directory(tmp_path) == tmp_path
    with pytest.raises(ValueError, match=f"{tmp_path}/missing does not exist"):
        paths.existing_directory(tmp_path / "missing")


def test_a_file_argument_that_names_a_directory_is_refused(tmp_path):
    assert paths.writable_file(tmp_path / "out.npz") == tmp_path / "out.npz"
    with pytest.raises(ValueError, match=f"{tmp_path} is a directory, not a file"):
        paths.writable_file(tmp_path)
