"""A run's TensorBoard event files from the aggregator's side: what
:mod:`testbed.core.runs.tensorboard_log` needs of a round loop (settings, trust statement,
the enforced accounting, a simulated link's SNR budget, the air's sample rate, the figures
of the rounds committed before a resume).

:func:`aggregator.run_rounds.run_rounds` opens it, so ``testbed run``, the lab aggregator
and every sweep cell write the same files.
"""

from __future__ import annotations

from aggregator.outcome import trust_fields
from aggregator.round_loop import RoundLoop
from testbed.core.config.link import link_name
from testbed.core.runs.tensorboard_log import Note, RoundFigures, RunBoard, open_board


def settings_text(loop: RoundLoop) -> str:
    """The run's settings as markdown: link, radios, privacy unit and accounting, and its
    ``config.yaml`` (indented: shown as code)."""
    state = loop.state
    cfg, hw = state.cfg, state.hw
    head = [
        f"scheme **{cfg.scheme}**, link **{link_name(cfg, hw)}**, {cfg.devices} devices, "
        f"{cfg.rounds} rounds",
    ]
    if state.book is not None:
        head.append(f"privacy: epsilon target {cfg.privacy.epsilon:g} per {state.book.unit}, "
                    f"delta {cfg.privacy.delta:g}, enforced accounting {state.book.enforce}")
    config = (state.rundir.path / "config.yaml")
    body = config.read_text(encoding="utf-8") if config.is_file() else ""
    code = "\n".join("    " + ln for ln in body.splitlines())
    return "\n\n".join([*head, code])


def open_run_board(loop: RoundLoop, start_round: int, note: Note) -> RunBoard | None:
    """The run's event writer (``None``: none, :func:`~testbed.core.runs.tensorboard_log.
    open_board` says why), its running figures rebuilt from the rounds committed before
    ``start_round``. Never raises: a failure is said through ``note`` and the run goes on
    without event files."""
    try:
        return _open(loop, start_round, note)
    except Exception as exc:  # noqa: BLE001 - never stop a run for its event files
        note(f"tensorboard: no event files ({type(exc).__name__}: {exc})")
        return None


def _open(loop: RoundLoop, start_round: int, note: Note) -> RunBoard | None:
    state = loop.state
    cfg, hw, book = state.cfg, state.hw, state.book
    on_usrp = link_name(cfg, hw) == "usrp"
    figures = RoundFigures(
        cfg.devices,
        epsilon_key=f"epsilon_{book.enforce}" if book is not None else None,
        epsilon_target=cfg.privacy.epsilon if book is not None else None,
        budget_snr_db=None if on_usrp else cfg.snr_db_per_device(),
    )
    if start_round > 0:
        for line in state.rundir.metrics():
            figures.scalars(line)
    trust = trust_fields(cfg, hw, state.unit, state.uplinks, state.record).get("trust")
    return open_board(state.rundir.path, figures, rounds=cfg.rounds, note=note,
                      settings=settings_text(loop), trust=trust,
                      sample_rate_hz=hw.sample_rate_hz if on_usrp else None,
                      recordings=state.rundir.recordings_path if cfg.record else None)
