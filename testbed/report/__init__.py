"""Readable reports of a run directory: ``report.md`` and figures under ``report/``.

:func:`write_report` reads the run's files (never writing them), draws the figures and
writes, each atomically (temporary file, fsync, rename)::

    RUN/report/accuracy_loss.png  loss and accuracy per round
    RUN/report/epsilon.png        each device's epsilon per round, with the target (DP runs)
    RUN/report/energy.png         computing and radio energy per device
    RUN/report/snr.png            received SNR per device and round (uploads over a link)
    RUN/report/sources.json       every table of the report, each number with its file/key
    RUN/report.md                 settings, outcome, tables, links to the figures (last)

so a crash leaves either the previous report or the new one, and never touches
``metrics.jsonl``, ``ledger.jsonl`` or ``summary.json``.
"""

from __future__ import annotations

from pathlib import Path

from testbed.core.runs.rundir import atomic_write_bytes, dumps
from testbed.report.load import NotARunDirectory, RunData, load_run

__all__ = ["NotARunDirectory", "RunData", "load_run", "write_report"]

#: Name of the report in the run directory.
REPORT_NAME = "report.md"


def write_report(run_dir: Path) -> Path:
    """Write ``report.md`` and its figures for run directory ``run_dir``; returns the
    path of ``report.md``.

    Works on any run directory, complete or not: missing or unreadable files make a
    partial report that says what is missing. A figure that cannot be drawn is named in
    the report instead of failing it.

    Raises
    ------
    NotARunDirectory
        When ``run_dir`` does not exist, is not a directory, or holds no run file.
    OSError
        When the report files cannot be written (read-only directory, disk full); the run's
        own files are untouched.
    """
    from testbed.report.markdown import REPORT_DIR, render
    from testbed.report.plots import PLOT_NAMES, PLOTTERS

    run_dir = Path(run_dir)
    run = load_run(run_dir)
    out_dir = run_dir / REPORT_DIR
    out_dir.mkdir(exist_ok=True)
    plots = []
    for plotter in PLOTTERS:
        try:
            plot = plotter(run)
        except Exception as exc:  # noqa: BLE001 - a figure's failure is reported, not fatal
            run.problems.append(f"a figure ({plotter.__name__}) could not be drawn: "
                                f"{type(exc).__name__}: {exc}")
            continue
        if plot is not None:
            atomic_write_bytes(out_dir / plot.name, plot.png)
            plots.append(plot)
    drawn = {p.name for p in plots}
    for stale in PLOT_NAMES:  # a figure of an earlier report that has no data now
        if stale not in drawn:
            (out_dir / stale).unlink(missing_ok=True)
    text, tables = render(run, plots)
    sources = {
        "run_dir": str(run_dir.resolve()),
        "report": REPORT_NAME,
        "figures": sorted(drawn),
        "tables": [t.to_json() for t in tables],
    }
    atomic_write_bytes(out_dir / "sources.json", (dumps(sources) + "\n").encode())
    path = run_dir / REPORT_NAME
    atomic_write_bytes(path, text.encode("utf-8"))
    return path


def report_after_run(run_dir: Path | None, summary: dict[str, object]) -> str | None:
    """Write the report of a run that just ended (``testbed run`` / ``aggregator``).

    Never raises: a report that cannot be written must not change the run's outcome.

    Returns
    -------
    str | None
        A line for the user (where the report is, or why it is missing); ``None`` when
        there is no run directory (a run refused before its first round leaves none).
    """
    if run_dir is None or summary.get("run_dir_removed") or not Path(run_dir).is_dir():
        return None
    try:
        path = write_report(Path(run_dir))
    except Exception as exc:  # noqa: BLE001 - reported, the run's outcome stands
        return f"report not written: {type(exc).__name__}: {exc} (try: testbed report {run_dir})"
    return f"report: {path}"
