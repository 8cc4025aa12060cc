"""Three small output fixes.

1. ``testbed radio loopback --link usrp``: the expected NMSE and the CI coverage are computed
   against the air's SNR (the virtual air's link budget; ``null`` with a reason on real
   USRPs), the capture margins are not counted as negative lost samples, and ``--snr-db``
   (which the usrp link cannot apply) is refused.
2. ``testbed edge`` without PyTorch: one line naming the install command, exit 2.
3. A folder without ``__init__.py`` that takes the name of a user's module: the import error
   names the folder and what to do.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from radio.link import ChannelState, Reception
from radio.link_budget import budget_snr_db
from testbed.cli import cmd_radio_loopback
from testbed.cli.main import main
from testbed.core.config.hardware import HardwareConfig
from testbed.core.config.loader import load_hardware
from testbed.core.extensions import ExtensionError, resolve
from tests.radio_helpers import require_gnuradio

ROOT = Path(__file__).resolve().parents[1]
VIRTUAL_LAB = str(ROOT / "hw_configs" / "virtual_lab.yaml")
#: virtual_lab.yaml: 0.1 W (20 dBm) through tx0's 116 dB against kT*NF (290 K, NF 5 dB)
#: over the 200 kBd symbol rate: Es/N0 = 20 dBm - 116 dB + 116 dB, about 20 dB.
VIRTUAL_LAB_BUDGET_DB = budget_snr_db(0.1 * 10 ** (-116.0 / 10), 200e3, 290.0, 5.0)


# -- 1. radio loopback on the usrp link ---------------------------------------------------------


class _FakeUsrpLink:
    """Stands in for the usrp link: receptions at ``snr_db`` in an arbitrary receiver gain
    scale, each with the window of a real one (the burst and two capture margins),
    ``short`` samples fewer in the last trial."""

    def __init__(self, snr_db: float, margin: int, short: int = 0) -> None:
        self.snr_db, self.margin, self.short = snr_db, margin, short
        self.calls = 0

    def __enter__(self) -> _FakeUsrpLink:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def transmit(self, *, device: int, round_index: int, symbols: np.ndarray,
                 rng: np.random.Generator) -> Reception:
        self.calls += 1
        gain = np.full(symbols.size, 3e-3 * np.exp(0.7j))  # receiver units, not 1
        n0 = abs(gain[0]) ** 2 * 10 ** (-self.snr_db / 10)
        noise = np.sqrt(n0 / 2) * (rng.standard_normal(symbols.size)
                                   + 1j * rng.standard_normal(symbols.size))
        state = ChannelState(gain, n0, 0.6 * n0, 1.6 * n0, estimated=True, confidence=0.95)
        sent = 5 * symbols.size
        short = self.short if round_index == 2 else 0
        info = {"snr_est_db": self.snr_db + 0.1, "snr_ci_lo_db": self.snr_db - 2.0,
                "snr_ci_hi_db": self.snr_db + 2.0, "cfo_est_hz": 0.0}
        return Reception(gain * symbols + noise, state, sent, sent + self.margin - short,
                         symbols.size / 200e3, info)


def _fake_usrp_link(monkeypatch: pytest.MonkeyPatch, hw: HardwareConfig, snr_db: float,
                    short: int = 0) -> _FakeUsrpLink:
    """A :class:`_FakeUsrpLink` with ``hw``'s two capture margins, made the link that
    ``testbed radio loopback`` uses."""
    margin = int(2 * hw.usrp.capture_margin_s * hw.sample_rate_hz)
    fake = _FakeUsrpLink(snr_db, margin, short)
    monkeypatch.setattr(cmd_radio_loopback, "make_link", lambda exp, hw: fake)
    return fake


def _loopback_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["radio", "loopback", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_usrp_loopback_refuses_snr_db_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """The usrp link's noise is the air's: --snr-db would be a number that means nothing."""
    assert main(["radio", "loopback", "--link", "usrp", "--hw", VIRTUAL_LAB,
                 "--snr-db", "20", "--json"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("testbed: error: --snr-db") and "\n" not in err, err
    assert "usrp link" in err and "air" in err and "leave --snr-db out" in err


def test_usrp_loopback_help_says_what_snr_db_means(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["radio", "loopback", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Refused on --link usrp" in text and "link-budget SNR" in text


def test_virtual_usrp_loopback_is_measured_against_the_link_budget(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Expected NMSE and coverage from tx0's link budget, in the receiver's gain scale; the
    capture margins are no lost samples, a short window is."""
    fake = _fake_usrp_link(monkeypatch, load_hardware(VIRTUAL_LAB), VIRTUAL_LAB_BUDGET_DB,
                           short=7)
    out = _loopback_json(["--link", "usrp", "--hw", VIRTUAL_LAB, "--trials", "3",
                          "--n-symbols", "4000"], capsys)
    assert fake.calls == 3
    assert out["snr_db"] == pytest.approx(VIRTUAL_LAB_BUDGET_DB)
    assert out["snr_db"] == pytest.approx(20.0, abs=0.1)
    assert "link budget" in out["snr_source"] and "tx0" in out["snr_source"]
    assert out["nmse_expected_db"] == pytest.approx(-VIRTUAL_LAB_BUDGET_DB, abs=1e-9)
    assert abs(out["nmse_db"] - out["nmse_expected_db"]) < 0.5
    assert out["n0_ci_coverage"] == 1.0
    assert out["samples_lost"] == 7  # the margins are not counted, a short window is
    assert "no_truth_reason" not in out


def test_real_usrp_loopback_says_why_there_is_no_truth(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Real radios: the air's SNR is unknown, so no expected NMSE and no coverage (null,
    with the reason), never a made-up 0.0."""
    hw = load_hardware("lab_ota")
    assert not hw.virtual
    _fake_usrp_link(monkeypatch, hw, 17.0)
    out = _loopback_json(["--link", "usrp", "--hw", "lab_ota", "--n-symbols", "2000"], capsys)
    assert out["snr_db"] is None
    assert out["nmse_expected_db"] is None and out["n0_ci_coverage"] is None
    assert "real USRPs" in out["no_truth_reason"] and out["snr_source"] == out["no_truth_reason"]
    assert out["samples_lost"] == 0
    assert out["snr_est_db"] == pytest.approx(17.1) and math.isfinite(out["nmse_db"])


def test_virtual_usrp_loopback_real_run() -> None:
    """Through the flowgraphs and a private virtual air: the numbers agree with the budget."""
    require_gnuradio()
    run = subprocess.run(
        [sys.executable, "-m", "testbed", "radio", "loopback", "--hw", VIRTUAL_LAB,
         "--link", "usrp", "--trials", "3", "--n-symbols", "2000", "--json"],
        capture_output=True, text=True, timeout=600, check=False, cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["frames_lost"] == 0 and out["samples_lost"] == 0, out
    assert out["snr_db"] == pytest.approx(VIRTUAL_LAB_BUDGET_DB)
    assert out["nmse_expected_db"] == pytest.approx(-VIRTUAL_LAB_BUDGET_DB, abs=0.5), out
    assert abs(out["nmse_db"] - out["nmse_expected_db"]) < 1.5, out
    assert abs(out["snr_est_db"] - out["snr_db"]) < 1.0, out
    assert out["n0_ci_coverage"] >= 2 / 3, out  # 95 % intervals: one miss in three at most


# -- 2. an edge without PyTorch -----------------------------------------------------------------

#: Installed by sitecustomize in the child: ``import torch`` fails as on a torch-less install.
TORCH_GUARD = """
import sys
class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError("No module named 'torch'", name="torch")
        return None
sys.meta_path.insert(0, _NoTorch())
"""


def test_edge_without_torch_says_how_to_install_in_one_line(tmp_path: Path) -> None:
    guard = tmp_path / "guard"
    guard.mkdir()
    (guard / "sitecustomize.py").write_text(TORCH_GUARD)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(guard), *filter(None, [env.get("PYTHONPATH", "")])])
    run = subprocess.run(
        [sys.executable, "-m", "testbed", "edge", "--connect", "tcp://127.0.0.1:9",
         "--device-id", "0", "--keys", str(tmp_path / "keys"),
         "--state-dir", str(tmp_path / "state")],
        capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path, env=env,
    )
    err = run.stderr.strip()
    assert run.returncode == 2, err[-2000:]
    assert "Traceback" not in err and "\n" not in err, err
    assert err.startswith("testbed edge: error: PyTorch is not installed"), err
    assert f"make edge PY={sys.executable}" in err and "scripts/install_edge.py" in err
    assert "docs/lab.md" in err
    assert not (tmp_path / "state").exists()  # nothing done before saying so


# -- 3. a folder that takes the name of a user's module -----------------------------------------


@pytest.fixture
def clean_imports(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``sys.path`` restored and the ``mylab`` modules forgotten after the test."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield
    for name in [n for n in sys.modules if n == "mylab" or n.startswith("mylab.")]:
        del sys.modules[name]
    importlib.invalidate_caches()


#: A module defining the model factory ``mlp``.
MLP_MODULE = "def mlp(input_shape, n_classes):\n    pass\n"


def _lab_folder(tmp_path: Path, models: str = MLP_MODULE) -> Path:
    folder = tmp_path / "mylab"  # a lab's folder: no __init__.py
    folder.mkdir()
    (folder / "models.py").write_text(models)
    importlib.invalidate_caches()
    return folder


def _refusal(tmp_path: Path, target: str, models: str = MLP_MODULE) -> tuple[Path, str]:
    """The lab folder ``tmp_path/mylab`` (its ``models.py`` holding ``models``) and the
    message of the :class:`ExtensionError` that resolving the model ``target`` raises."""
    folder = _lab_folder(tmp_path, models)
    with pytest.raises(ExtensionError) as info:
        resolve("model", target, [str(tmp_path)])
    return folder, str(info.value)


def test_a_namespace_folder_is_named_with_what_to_do(tmp_path: Path,
                                                     clean_imports: None) -> None:
    folder, msg = _refusal(tmp_path, "mylab:mlp")
    assert "\n" not in msg
    assert "(None)" not in msg
    assert f"namespace package at {folder.resolve()}" in msg
    assert "without __init__.py" in msg and "shadows" in msg
    assert "Rename the folder" in msg and "extensions_path" in msg
    assert "'mylab.models:mlp'" in msg  # the folder's file, named through it
    assert resolve("model", "mylab.models:mlp", [str(tmp_path)]).__name__ == "mlp"


def test_a_missing_submodule_of_the_folder_names_it(tmp_path: Path,
                                                    clean_imports: None) -> None:
    folder, msg = _refusal(tmp_path, "mylab.nets:mlp")
    assert f"namespace package at {folder.resolve()}" in msg and "no 'nets'" in msg


def test_a_missing_dependency_of_the_users_code_is_not_blamed_on_the_folder(
    tmp_path: Path, clean_imports: None
) -> None:
    _, msg = _refusal(tmp_path, "mylab.models:mlp", "import no_such_dependency_xyz\n")
    assert "no_such_dependency_xyz" in msg and "namespace package" not in msg


def test_the_module_on_the_path_wins_over_the_folder(tmp_path: Path,
                                                     clean_imports: None) -> None:
    """What the message advises works: the directory holding mylab.py in extensions_path
    (a namespace folder only stands in when no module of its name is found)."""
    _lab_folder(tmp_path)
    code = tmp_path / "code"
    code.mkdir()
    (code / "mylab.py").write_text(MLP_MODULE)
    importlib.invalidate_caches()
    factory = resolve("model", "mylab:mlp", [str(tmp_path), str(code)])
    assert Path(sys.modules["mylab"].__file__ or "").parent == code
    assert callable(factory)


def test_a_regular_module_keeps_its_message(tmp_path: Path, clean_imports: None) -> None:
    (tmp_path / "mylab.py").write_text("x = 1\n")
    importlib.invalidate_caches()
    with pytest.raises(ExtensionError, match=r"module 'mylab' \(.*mylab\.py\) has no attribute "
                       r"'mlp'") as info:
        resolve("model", "mylab:mlp", [str(tmp_path)])
    assert "namespace" not in str(info.value)
