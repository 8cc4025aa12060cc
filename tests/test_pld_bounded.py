"""PLD accounting in memory bounded whatever the number of steps (issue 21, item 9).

``testbed privacy --unit record --accountant pld --q 0.5 --z 0.3 --steps 1000000`` took
23.7 GB (``self_compose`` sizes its FFT by a Chernoff bound growing with K) and 10^7 steps
died. Now a PLD never exceeds ``MAX_PLD_POINTS`` points per direction: coarser grids (losses
rounded up) and composition by squaring, still an upper bound.
"""

from __future__ import annotations

import json
import math
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from testbed.core.privacy.accountants.record_accountant import RecordAccountant
from testbed.core.privacy.accountants.record_planning import record_epsilon_for
from testbed.core.privacy.analysis import pld_bounded
from testbed.core.privacy.record_events import RecordEvent

REPO = Path(__file__).resolve().parents[1]
DELTA = 1e-5


def _sgm(z: float, q: float, interval: float = 1e-3, pessimistic: bool = True) -> object:
    return pld_lib.from_gaussian_mechanism(
        standard_deviation=z, sampling_prob=q, value_discretization_interval=interval,
        pessimistic_estimate=pessimistic,
    )


def test_coarsening_only_raises_epsilon_and_keeps_the_mass() -> None:
    pld = _sgm(0.8, 0.3).self_compose(20)
    for factor in (2, 8, 64):
        coarse = pld_bounded.coarsen(pld, factor)
        assert pld_bounded.interval_of(coarse) == 1e-3 * factor
        assert pld_bounded.size_of(coarse) <= pld_bounded.size_of(pld) // factor + 2
        for delta in (1e-3, 1e-5, 1e-8):
            fine_eps = pld.get_epsilon_for_delta(delta)
            coarse_eps = coarse.get_epsilon_for_delta(delta)
            assert fine_eps <= coarse_eps <= fine_eps + 1e-3 * factor + 1e-9
        for eps in (0.5, 2.0, 5.0):
            assert coarse.get_delta_for_epsilon(eps) >= pld.get_delta_for_epsilon(eps) - 1e-15


def test_squaring_in_few_points_is_still_an_upper_bound() -> None:
    """2000 steps (the fine self-composition: 221,139 points) composed in at most 2^14:
    above the fine pessimistic estimate, within 2 % of it (1.1 % here; 7 % in 2^12)."""
    steps, q, z = 2000, 0.2, 0.9
    fine = _sgm(z, q).self_compose(steps).get_epsilon_for_delta(DELTA)
    lower = _sgm(z, q, pessimistic=False).self_compose(steps).get_epsilon_for_delta(DELTA)
    small = pld_bounded.self_compose(_sgm(z, q), steps, max_points=1 << 14)
    assert pld_bounded.size_of(small) <= 1 << 14
    eps = small.get_epsilon_for_delta(DELTA)
    assert lower <= fine <= eps <= 1.02 * fine


def test_ten_million_steps_fit_in_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """The audit's case at 10^7 steps, with the bound lowered so the test is quick."""
    monkeypatch.setattr(pld_bounded, "MAX_PLD_POINTS", 1 << 15)
    res = record_epsilon_for(q=0.5, z=0.3, steps=10_000_000, delta=DELTA, accountant="pld")
    rdp = record_epsilon_for(q=0.5, z=0.3, steps=10_000_000, delta=DELTA, accountant="rdp")
    # the mean privacy loss of one step is ~2.2 nats: no bound can be below K x that / 2
    assert 1e7 < res.epsilon < math.inf and res.epsilon <= 1.5 * rdp.epsilon


def test_tiny_noise_is_built_on_a_coarser_grid(monkeypatch: pytest.MonkeyPatch) -> None:
    """z = 1e-3 needs ~1e9 points at 1e-3 nats for one step; it is built coarser (and z so
    small that no grid fits reports inf, never less)."""
    monkeypatch.setattr(pld_bounded, "MAX_PLD_POINTS", 1 << 16)
    one = record_epsilon_for(q=1.0, z=1e-3, steps=1, delta=DELTA, accountant="pld").epsilon
    assert 0.5 / 1e-6 < one < math.inf  # the Gaussian's loss at sensitivity 1: 1 / (2 z^2)
    assert record_epsilon_for(q=0.5, z=1e-200, steps=3, delta=DELTA,
                              accountant="pld").epsilon == math.inf


def test_accountant_state_stays_bounded_over_many_events(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run's accountant composes event by event; its state is coarsened as it grows."""
    monkeypatch.setattr(pld_bounded, "MAX_PLD_POINTS", 1 << 13)
    acc = RecordAccountant("pld", DELTA)
    plain = RecordAccountant("pld", DELTA)
    monkeypatch.setattr(pld_bounded, "MAX_PLD_POINTS", 1 << 30)
    # q = 0.5 (B = 50 of D = 100), z = sigma B / C from 0.5 up, 200 steps per event
    events = [RecordEvent(round=t, device=0, steps=200, sampling_rate=0.5, amplified=True,
                          example_clip=1.0, expected_batch=50.0, dataset_size=100,
                          sigma=(0.5 + 0.01 * t) / 50.0) for t in range(5)]
    for e in events:
        plain.add(e)
    monkeypatch.setattr(pld_bounded, "MAX_PLD_POINTS", 1 << 13)
    for e in events:
        acc.add(e)
    state = acc._node(0).state  # noqa: SLF001 - the bound is on the state itself
    assert pld_bounded.size_of(state) <= 1 << 13
    assert plain.epsilon(0).epsilon <= acc.epsilon(0).epsilon <= 1.05 * plain.epsilon(0).epsilon


@pytest.mark.slow  # reason: ~10 s idle, 30 s+ loaded; the cases above check the bound quickly
def test_cli_million_steps_in_bounded_memory(tmp_path: Path) -> None:
    """The command that took 23.7 GB: well under 2 GiB now (the child's peak RSS)."""
    script = (
        "import resource, subprocess, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))\n"  # a failure stays cheap
        "p = subprocess.run([sys.executable, '-m', 'testbed', 'privacy', '--unit', 'record',"
        " '--accountant', 'pld', '--q', '0.5', '--z', '0.3', '--steps', '1000000', '--json'],"
        " capture_output=True, text=True)\n"
        "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
        "print(p.stdout.strip()); print(p.stderr.strip()[-2000:], file=sys.stderr)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    first, out = proc.stdout.splitlines()[:2]
    rc, maxrss_kib = (int(x) for x in first.split())
    assert rc == 0, proc.stderr
    assert maxrss_kib < 2 * 1024 * 1024, f"peak RSS {maxrss_kib} KiB"
    assert json.loads(out)["epsilon"] > 1e6
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss > 0


def _same_pmf(a: object, b: object) -> bool:
    """Whether two PMFs are equal bit for bit (grid, offset, masses, probabilities)."""
    a, b = a.to_dense_pmf(), b.to_dense_pmf()  # type: ignore[attr-defined]
    return (a._discretization == b._discretization and a._lower_loss == b._lower_loss
            and a._infinity_mass == b._infinity_mass
            and a._pessimistic_estimate == b._pessimistic_estimate
            and a._probs.dtype == b._probs.dtype and a._probs.tobytes() == b._probs.tobytes())


@pytest.mark.parametrize(("z", "q", "steps", "pessimistic"), [
    (0.8, 0.3, 1, True), (1.1, 0.01, 7, True), (0.6, 1.0, 3, True), (2.0, 0.05, 40, False),
    (5.0, 0.5, 1, True),
])
def test_composition_is_dp_accounting_s_bit_for_bit(z: float, q: float, steps: int,
                                                     pessimistic: bool) -> None:
    """The composition with the tail search in numpy gives exactly the PLD of
    ``dp_accounting``'s own ``compose``, over a chain of compositions (the tails grow)."""
    one = _sgm(z, q, pessimistic=pessimistic).self_compose(steps)
    mine = theirs = one
    for _ in range(12):
        mine = pld_bounded.compose_plds(mine, one, 1e-15)
        theirs = theirs.compose(one, tail_mass_truncation=1e-15)
        assert _same_pmf(mine._pmf_remove, theirs._pmf_remove)
        assert _same_pmf(mine._pmf_add, theirs._pmf_add)
        assert mine._symmetric == theirs._symmetric
    assert mine.get_epsilon_for_delta(DELTA) == theirs.get_epsilon_for_delta(DELTA)


def test_the_tail_search_stops_where_the_loop_does() -> None:
    """Every threshold crossing, at chunk boundaries and past them, and none at all."""
    from dp_accounting.pld import pld_pmf

    rng = np.random.default_rng(3)
    for n in (1, 63, 64, 65, 320, 321, 5000):
        arr = rng.exponential(size=n) * 1e-18
        sums = np.cumsum(arr)
        for threshold in (-1.0, 0.0, *sums[:: max(1, n // 17)], sums[-1], 2 * sums[-1]):
            for probs in (arr, np.flip(arr)):
                try:
                    offset, kept, right = pld_pmf._truncate_tails(probs.copy(), 2 * threshold,
                                                                  True)
                except IndexError:  # all of it is tail: both fail alike
                    with pytest.raises(IndexError):
                        pld_bounded._truncate_tails(probs.copy(), 2 * threshold, True)
                    continue
                mine = pld_bounded._truncate_tails(probs.copy(), 2 * threshold, True)
                assert mine[0] == offset and mine[2] == right
                assert mine[1].tobytes() == kept.tobytes()


def test_the_convolution_is_scipys_bit_for_bit_and_its_held_spectrum_follows_the_values(
) -> None:
    """_fft_convolve against scipy.signal.fftconvolve: lengths 1 (scipy's plain product),
    integer arrays (transformed as float64), a second argument seen before (its spectrum
    reused) and the same array changed in place (not reused)."""
    from scipy import signal

    rng = np.random.default_rng(5)
    for dtype in (np.int64, np.float64):
        for _ in range(60):
            a = (rng.random(int(rng.integers(1, 400))) * 4).astype(dtype)
            b = rng.random(int(rng.integers(1, 400)))
            for x, y in ((a, b), (b, a), (a, b), (b, b)):
                mine, theirs = pld_bounded._fft_convolve(x, y), signal.fftconvolve(x, y)
                assert mine.dtype == theirs.dtype and mine.tobytes() == theirs.tobytes()
            b[-1] += 0.5
            assert (pld_bounded._fft_convolve(a, b).tobytes()
                    == signal.fftconvolve(a, b).tobytes())
