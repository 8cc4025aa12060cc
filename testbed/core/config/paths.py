"""Checks of command-line paths, made before any work starts.

Each check raises :class:`~testbed.core.config.errors.ConfigError` with one line naming the
option, the path and what is wrong, so ``testbed`` prints ``testbed: error: ...`` and exits
with code 2 instead of failing with a traceback after minutes of work.
"""

from __future__ import annotations

import os
from pathlib import Path

from testbed.core.config.errors import ConfigError


def _nearest_existing(path: Path) -> Path:
    current = path.absolute()
    while not current.exists() and current != current.parent:
        current = current.parent
    return current


def _check_creatable(path: Path, flag: str) -> None:
    """Whatever of ``path`` is missing can be created: its nearest existing ancestor is a
    writable directory."""
    base = _nearest_existing(path.parent)
    if not base.is_dir():
        raise ConfigError(f"{flag} '{path}': '{base}' is a file, not a directory")
    if not os.access(base, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} '{path}': directory '{base}' is not writable")


def check_output_file(path: Path, flag: str) -> None:
    """``path`` can be written as a file (it may exist as a file; parents may be missing).

    Parameters
    ----------
    path
        The file the command will write.
    flag
        The option that gave it (``--out``), for the message.
    """
    if path.is_dir():
        raise ConfigError(f"{flag} '{path}': is a directory; allowed: a file path")
    if path.exists() and not path.is_file():
        raise ConfigError(f"{flag} '{path}': exists and is not a regular file")
    if path.exists() and not os.access(path, os.W_OK):
        raise ConfigError(f"{flag} '{path}': file is not writable")
    _check_creatable(path, flag)


def check_output_dir(path: Path, flag: str) -> None:
    """``path`` is an existing writable directory or can be created as one."""
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} '{path}': exists and is not a directory")
    if path.is_dir():
        if not os.access(path, os.W_OK | os.X_OK):
            raise ConfigError(f"{flag} '{path}': directory is not writable")
        return
    _check_creatable(path / "x", flag)
