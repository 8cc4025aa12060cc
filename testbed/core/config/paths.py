"""Checks of command-line paths, made before any work starts.

Each check raises :class:`~testbed.core.config.errors.ConfigError` with one line naming the
option, the path and what is wrong, so ``testbed`` prints ``testbed: error: ...`` and exits
with code 2 instead of failing with a traceback after minutes of work.
"""

from __future__ import annotations

import os
import unicodedata
from pathlib import Path

from testbed.core.config.errors import ConfigError

#: Unicode categories refused in an output path: control characters (newline, tab, ESC,
#: DEL, C1) and the line and paragraph separators; each would split or garble the one-line
#: outcome and every log line that names the path.
REFUSED_PATH_CATEGORIES = frozenset({"Cc", "Zl", "Zp"})


def check_path_text(path: str | Path, flag: str) -> None:
    """Refuse a path holding a control character (it would split the one-line outcome).

    The one check of the output and run-directory paths of every command (``--out``,
    ``--resume``; :class:`testbed.cli.overrides.PathOption` and :func:`check_output_file`,
    :func:`check_output_dir`), made before anything is created.

    Parameters
    ----------
    path
        The path as given.
    flag
        The option that gave it (``--out``), for the message.

    Raises
    ------
    ConfigError
        Naming ``flag``, the path (``repr``: the character is visible), the first character
        refused and what is allowed.
    """
    text = str(path)
    for i, ch in enumerate(text):
        if unicodedata.category(ch) in REFUSED_PATH_CATEGORIES:
            raise ConfigError(
                f"{flag}: got {text!r}; it holds the control character {ch!r} at position "
                f"{i}; allowed: a path without control characters (no newline, tab, ESC, "
                "...)"
            )


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
    check_path_text(path, flag)
    if path.is_dir():
        raise ConfigError(f"{flag} '{path}': is a directory; allowed: a file path")
    if path.exists() and not path.is_file():
        raise ConfigError(f"{flag} '{path}': exists and is not a regular file")
    if path.exists() and not os.access(path, os.W_OK):
        raise ConfigError(f"{flag} '{path}': file is not writable")
    _check_creatable(path, flag)


def check_output_dir(path: Path, flag: str) -> None:
    """``path`` is an existing writable directory or can be created as one."""
    check_path_text(path, flag)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} '{path}': exists and is not a directory")
    if path.is_dir():
        if not os.access(path, os.W_OK | os.X_OK):
            raise ConfigError(f"{flag} '{path}': directory is not writable")
        return
    _check_creatable(path / "x", flag)
