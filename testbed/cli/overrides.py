"""Options that several commands share, checked as they are parsed.

``--set`` / ``--hw-set`` (:class:`UniqueOverrides`) refuse a key given twice:
``--set privacy.epsilon=3 --set privacy.epsilon=7`` used to run with 7 and say nothing; the
command now stops at parsing with one line naming the key and both values. Only the user's
own options are checked: overrides a command adds itself (a plan's, a sweep cell's) still
apply on top of them.

``--out`` / ``--resume`` directories (:class:`PathOption`) refuse a control character
(:func:`testbed.core.config.paths.check_path_text`); ``--fallback``
(:func:`add_fallback_option`). The options of a command that writes a run directory
(``testbed run``, ``testbed aggregator``): :func:`add_run_dir_options` and
:func:`add_summary_options`.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from testbed.core.config.errors import ConfigError
from testbed.core.config.paths import check_path_text


def override_key(item: str) -> str | None:
    """The dotted key of ``KEY=VALUE`` (parts stripped, as the loader reads it), or
    ``None`` when ``item`` has no ``=`` (the loader refuses it with its own message)."""
    if "=" not in item:
        return None
    key = item.split("=", 1)[0]
    return ".".join(part.strip() for part in key.split("."))


class TextOption(argparse.Action):
    """An option whose text is checked and turned into the value kept for it as it is
    parsed (:meth:`value`); a refusal is a :class:`ConfigError` (one ``testbed: error:``
    line, exit 2)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        kept = getattr(namespace, self.dest, None)
        setattr(namespace, self.dest, self.value(str(values), option_string or self.dest, kept))

    def value(self, text: str, option: str, kept: Any) -> Any:
        """The value to keep for ``text`` given to ``option`` (its flag, else its dest),
        ``kept`` being the value kept so far (its default before the first).

        Raises
        ------
        ConfigError
            ``text`` is refused.
        """
        raise NotImplementedError


class UniqueOverrides(TextOption):
    """``action="append"`` for ``KEY=VALUE`` items, refusing a key already given with a
    :class:`ConfigError` (one ``testbed: error:`` line, exit 2)."""

    def value(self, text: str, option: str, kept: Any) -> list[str]:
        """The items so far and ``text``, unless ``text``'s key is among them."""
        items = list(kept or [])
        key = override_key(text)
        if key is not None:
            for earlier in items:
                if override_key(earlier) == key:
                    raise ConfigError(
                        f"{option}: key '{key}' given twice "
                        f"({earlier!r}, then {text!r}); allowed: each key once"
                    )
        return [*items, text]


class PathOption(TextOption):
    """``type=Path`` for an output or run directory (``--out``, ``--resume``), refusing a
    path with a control character (:func:`~testbed.core.config.paths.check_path_text`)
    with a :class:`ConfigError` at parsing (one ``testbed: error:`` line, exit 2), before
    anything is created."""

    def value(self, text: str, option: str, kept: Any) -> Path:
        """``text`` as a :class:`~pathlib.Path`, once checked."""
        check_path_text(text, option)
        return Path(text)


def add_fallback_option(p: argparse.ArgumentParser, what: str) -> None:
    """``--fallback none|emulate`` (the emulation fallback, docs/virtual_lab.md); ``what``
    says what this command does with it, after "'emulate' "."""
    p.add_argument(
        "--fallback", choices=("none", "emulate"), default=None,
        help=f"usrp link, when UHD finds no USRP: 'emulate' {what}; every output then says "
        "'emulated radios (no USRP found)'. Default: the hardware config's usrp.fallback "
        "(none: a missing USRP fails the link)",
    )


def add_run_dir_options(p: argparse.ArgumentParser, *, resume_help: str) -> None:
    """``--out`` and ``--resume`` (:class:`PathOption`) of a command that writes a run
    directory; ``resume_help`` says what ``--resume`` continues."""
    p.add_argument("--out", action=PathOption,
                   help="run directory (default: runs/<name>-<time>)")
    p.add_argument("--resume", action=PathOption, metavar="RUN_DIR", help=resume_help)


def add_summary_options(p: argparse.ArgumentParser, *, progress_lines: str) -> None:
    """``--no-progress``, ``--json`` and ``--no-report`` of a command that runs rounds into a
    run directory; ``progress_lines`` names the per-round lines it prints when stderr is not
    a terminal."""
    p.add_argument("--no-progress", action="store_true",
                   help="no progress: neither the bar (stderr a terminal) nor the "
                   f"{progress_lines} (otherwise; every progress_every rounds)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--no-report", action="store_true",
                   help="do not write report.md and its figures at the end (testbed report)")
