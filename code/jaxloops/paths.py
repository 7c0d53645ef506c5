"""Checking a path argument before any work is done: a ValueError that names the path.

A function that writes into a directory (creating it if need be) calls `writable_directory`;
one that reads an existing directory calls `existing_directory`; one that writes a file calls
`writable_file`. A parent that does not exist is refused rather than created: a typo in a
path should stop the run, not start a tree of directories somewhere else.
"""

import os
import pathlib
import tempfile


def _writable_place(place: pathlib.Path, path: pathlib.Path, what: str) -> None:
    """Raises a ValueError unless a file can be created in the existing directory `place`."""
    try:  # os.access says yes to root on a read-only file system: try it instead
        with tempfile.TemporaryFile(dir=place):
            pass
    except OSError as error:
        raise ValueError(f"{what} {path}: cannot write in {place} ({error.strerror})") from None


def _existing_parent(path: pathlib.Path, what: str) -> pathlib.Path:
    parent = path.parent
    if not parent.exists():
        raise ValueError(f"{what} {path}: its parent {parent} does not exist")
    if not parent.is_dir():
        raise ValueError(f"{what} {path}: its parent {parent} is not a directory")
    return parent


def writable_directory(directory, what: str = "directory") -> pathlib.Path:
    """The absolute path of a directory this process can write into: one that exists, or one
    that does not yet and whose parent is a directory it can write into.

    Raises:
      ValueError: `directory` names a file, its parent does not exist or is a file, or the
        place is not writable; the message names the path.
    """
    path = pathlib.Path(os.fspath(directory)).absolute()
    if path.exists():
        if not path.is_dir():
            raise ValueError(f"{what} {path} is a file, not a directory")
        _writable_place(path, path, what)
    else:
        _writable_place(_existing_parent(path, what), path, what)
    return path


def existing_directory(directory, what: str = "directory") -> pathlib.Path:
    """The absolute path of a directory that exists (to be read).

    Raises:
      ValueError: `directory` does not exist or names a file; the message names the path.
    """
    path = pathlib.Path(os.fspath(directory)).absolute()
    if not path.exists():
        raise ValueError(f"{what} {path} does not exist")
    if not path.is_dir():
        raise ValueError(f"{what} {path} is a file, not a directory")
    return path


def writable_file(path, what: str = "file") -> pathlib.Path:
    """The absolute path of a file this process can (over)write: not a directory, in an
    existing directory it can write into.

    Raises:
      ValueError: `path` names a directory, its parent does not exist or is a file, or the
        parent is not writable; the message names the path.
    """
    path = pathlib.Path(os.fspath(path)).absolute()
    if path.is_dir():
        raise ValueError(f"{what} {path} is a directory, not a file")
    _writable_place(_existing_parent(path, what), path, what)
    return path
