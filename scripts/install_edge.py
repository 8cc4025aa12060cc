#!/usr/bin/env python3
"""Install the testbed into this interpreter without touching its PyTorch (a Jetson's).

Run it with the interpreter of the environment the edge will use, e.g. on a Jetson with
JetPack 6 (Ubuntu 22.04, Python 3.10, NVIDIA's CUDA build of PyTorch installed system-wide)::

    python3 -m venv --system-site-packages ~/testbed-venv     # sees JetPack's torch
    ~/testbed-venv/bin/python scripts/install_edge.py         # from the repository root

What it does, in order (each step says what it found):

1. checks the Python version against ``requires-python`` (3.10 or 3.11);
2. finds PyTorch (``import torch``): its version and whether CUDA works. It never installs or
   replaces torch; without one it stops and says where to get it (``--allow-no-torch``: go
   on, for an environment that runs only the parts without torch, as CI's 3.10 check does);
3. installs this package (editable, ``--no-deps``) and every dependency in pyproject.toml
   except torch, holding torch and numpy at the versions already installed (a newer numpy
   would break a torch wheel built against the installed one); ``--with-tests``: also the
   test dependencies; ``--skip ray``: not ray (an edge runs no sweeps);
4. checks the radio side: ``uhd_find_devices`` (``uhd-host``) on PATH, and GNU Radio with
   UHD under ``/usr/bin/python3`` (``gnuradio``, ``python3-uhd``), which the ``tx``
   flowgraph runs on; says which apt packages are missing. UHD discovery is not run.

Exit code: 0 installed (radio findings are reported, not fatal), 1 a step failed.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Dependencies pyproject.toml lists that this script never installs.
NEVER_INSTALLED = {"torch"}
#: Interpreter the GNU Radio flowgraphs run under (Debian/Ubuntu's, with python3-uhd).
SYSTEM_PYTHON = "/usr/bin/python3"


def say(msg: str) -> None:
    print(f"install_edge: {msg}", flush=True)


def pyproject_lists() -> tuple[str, list[str], list[str]]:
    """``requires-python``, ``dependencies`` and the ``dev`` extra of pyproject.toml (read
    with a small parser: Python 3.10 has no ``tomllib``)."""
    text = (ROOT / "pyproject.toml").read_text()

    def array(name: str) -> list[str]:
        m = re.search(rf"^{re.escape(name)}\s*=\s*\[(.*?)\]", text, re.S | re.M)
        if m is None:
            raise SystemExit(f"install_edge: pyproject.toml has no {name} = [...]")
        body = re.sub(r"#.*", "", m.group(1))
        return re.findall(r'"([^"]+)"', body)

    m = re.search(r'^requires-python\s*=\s*"([^"]+)"', text, re.M)
    return (m.group(1) if m else ""), array("dependencies"), array("dev")


def requirement_name(req: str) -> str:
    """The distribution name of a requirement string (``"dp-accounting>=0.6"``)."""
    return re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0].strip().lower()


def check_python(spec: str) -> None:
    """Refuse an interpreter outside ``requires-python`` (lower and upper bound)."""
    v = sys.version_info[:2]
    lo = re.search(r">=\s*(\d+)\.(\d+)", spec)
    hi = re.search(r"<\s*(\d+)\.(\d+)", spec)
    if (lo and v < (int(lo[1]), int(lo[2]))) or (hi and v >= (int(hi[1]), int(hi[2]))):
        raise SystemExit(f"install_edge: Python {v[0]}.{v[1]} at {sys.executable}; the "
                         f"testbed needs {spec} (pyproject.toml requires-python)")
    say(f"Python {v[0]}.{v[1]} at {sys.executable}: within {spec}")


def installed_version(module: str) -> str | None:
    """``module.__version__`` as this interpreter imports it, ``None`` if it does not."""
    out = subprocess.run([sys.executable, "-c", f"import {module}; print({module}.__version__)"],
                         capture_output=True, text=True, check=False)
    return out.stdout.strip() if out.returncode == 0 else None


def check_torch(allow_missing: bool) -> str | None:
    """PyTorch's version (and CUDA), or ``None`` when absent and allowed."""
    version = installed_version("torch")
    if version is None:
        where = ("on a Jetson: NVIDIA's PyTorch wheel for your JetPack (docs/lab.md, 'An "
                 "edge on a Jetson'); on a PC: pip install 'torch>=2.3'")
        if allow_missing:
            say(f"no PyTorch here (--allow-no-torch): training will not run; {where}")
            return None
        raise SystemExit(f"install_edge: no PyTorch in {sys.executable}; install it first "
                         f"({where}). This script never installs or replaces torch.")
    cuda = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.is_available(), "
         "torch.cuda.device_count(), torch.version.cuda)"],
        capture_output=True, text=True, check=False).stdout.split()
    say(f"PyTorch {version} (kept as it is); CUDA available: {cuda[0] if cuda else '?'}, "
        f"devices: {cuda[1] if len(cuda) > 1 else '?'}, CUDA {cuda[2] if len(cuda) > 2 else '?'}")
    return version


def pip_install(args: list[str], constraints: list[str]) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(constraints) + "\n")
    cmd = [sys.executable, "-m", "pip", "install", "-q", "-c", f.name, *args]
    say("running: " + " ".join(cmd))
    try:
        subprocess.run(cmd, check=True)
    except subprocess.CalledProcessError as exc:
        raise SystemExit(f"install_edge: pip failed (exit {exc.returncode})") from None
    finally:
        Path(f.name).unlink(missing_ok=True)


def check_radio() -> list[str]:
    """What the radio side lacks (apt packages), each said; empty when all is there."""
    missing = []
    if shutil.which("uhd_find_devices") is None:
        missing.append("uhd-host")
        say("uhd_find_devices not on PATH: apt install uhd-host (then uhd_images_downloader)")
    else:
        say("uhd_find_devices found (not run: it would broadcast on every interface)")
    if not Path(SYSTEM_PYTHON).exists():
        missing.append("python3")
        say(f"{SYSTEM_PYTHON} missing: the flowgraphs run under the system Python")
        return missing
    for module, pkg in (("gnuradio.gr", "gnuradio"), ("uhd", "python3-uhd")):
        ok = subprocess.run([SYSTEM_PYTHON, "-c", f"import {module}"], capture_output=True,
                            check=False).returncode == 0
        say(f"{module} under {SYSTEM_PYTHON}: {'found' if ok else 'missing: apt install ' + pkg}")
        if not ok:
            missing.append(pkg)
    return missing


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--allow-no-torch", action="store_true",
                   help="go on without PyTorch (only the parts without training will run)")
    p.add_argument("--with-tests", action="store_true", help="also the test dependencies")
    p.add_argument("--skip-radio", action="store_true", help="do not look at UHD/GNU Radio")
    p.add_argument("--skip", action="append", default=[], metavar="NAME",
                   help="a dependency not to install (repeatable): an edge needs no 'ray' "
                   "(sweeps run on the aggregator's side)")
    args = p.parse_args(argv)
    spec, deps, dev = pyproject_lists()
    check_python(spec)
    torch_version = check_torch(args.allow_no_torch)
    skipped = NEVER_INSTALLED | {name.lower() for name in args.skip}
    wanted = [d for d in deps if requirement_name(d) not in skipped]
    if args.with_tests:
        wanted += [d for d in dev if requirement_name(d) not in {"opacus", "mypy"}]
    held = [f"torch=={torch_version}"] if torch_version else []
    numpy_version = installed_version("numpy")
    if numpy_version and torch_version:
        held.append(f"numpy=={numpy_version}")  # the torch wheel's ABI
    say("holding " + (", ".join(held) if held else "nothing (no torch installed)"))
    pip_install(wanted, held)
    pip_install(["--no-deps", "-e", str(ROOT)], held)
    out = subprocess.run([sys.executable, "-m", "testbed", "--help"], capture_output=True,
                         text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"install_edge: `testbed --help` failed: {out.stderr.strip()[-400:]}")
    say("testbed installed (python -m testbed, or the testbed command)")
    if not args.skip_radio:
        missing = check_radio()
        say("radio side ready" if not missing else
            f"radio side: missing {', '.join(missing)} (see docs/lab.md)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
