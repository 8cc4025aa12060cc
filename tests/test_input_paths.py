"""Output paths: what `--out` accepts before any work starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.core.config.errors import ConfigError
from testbed.core.config.paths import check_output_file


def test_an_existing_output_file_may_be_overwritten(tmp_path: Path) -> None:
    f = tmp_path / "plan.yaml"
    f.write_text("old\n")
    check_output_file(f, "--out")  # writing over a file is allowed
    check_output_file(tmp_path / "new" / "deeper" / "plan.yaml", "--out")


def test_an_output_file_under_a_file_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "plan.yaml"
    f.write_text("old\n")
    with pytest.raises(ConfigError, match="is a file, not a directory"):
        check_output_file(f / "x.yaml", "--out")
    with pytest.raises(ConfigError, match="is a directory"):
        check_output_file(tmp_path, "--out")
