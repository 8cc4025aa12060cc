"""Accounting at scale: shared states, exact running sums and the fast ledger read.

Every optimisation must give exactly what the unoptimised path gives
(:mod:`testbed.core.privacy.accountants.reference`: each device composes its own events, coefficient
lists summed with ``math.fsum``); the fast ledger read must read exactly what the full JSON
parse reads, and report the same corruption.
"""

from __future__ import annotations

import gc
import json
import math
import random
import secrets
import weakref
from dataclasses import astuple
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.core.privacy import (
    BudgetGuard,
    LaplaceRecordEvent,
    Ledger,
    LedgerError,
    PrivacyAccountant,
    RecordAccountant,
    RecordEvent,
    TornLineWarning,
    UploadEvent,
    gaussian_epsilon_closed_form,
    upload_coefficient,
)
from testbed.core.privacy.accountants.reference import (
    ReferencePrivacyAccountant,
    ReferenceRecordAccountant,
)
from testbed.core.privacy.accountants.state_trie import StateTrie
from testbed.core.privacy.analysis.exact_sum import ExactSum
from testbed.core.privacy.book import PrivacyBook, make_accountants
from testbed.core.privacy.events import EventError
from testbed.core.privacy.ledger import EVENT_TYPES, HEADER_TYPE
from testbed.core.privacy.ledger_parse import GENESIS, LineParser, seal

DELTA = 1e-5


def _same(a: Any, b: Any) -> bool:
    """Equal results, NaN equal to NaN (bit for bit otherwise)."""
    def norm(x: Any) -> tuple[Any, ...]:
        return tuple("nan" if isinstance(v, float) and math.isnan(v) else v for v in astuple(x))
    return norm(a) == norm(b)


def _record(rng: random.Random, device: int, t: int, relation: str) -> Any:
    """A random record-level event drawn from a few kinds (so histories repeat)."""
    kind = rng.random()
    if kind < 0.15:
        return LaplaceRecordEvent(round=t, device=device, scale=rng.choice([0.5, 2.0]),
                                  example_clip=1.0, dataset_size=rng.choice([100, 200]),
                                  relation=relation)
    base: dict[str, Any] = dict(round=t, device=device, steps=rng.choice([1, 1, 4]),
                                sampling_rate=rng.choice([0.01, 0.05, 1.0]),
                                amplified=rng.random() < 0.8, example_clip=1.0,
                                expected_batch=60.0, dataset_size=6000,
                                sigma=rng.choice([1 / 60, 1.3 / 60]), relation=relation)
    if kind < 0.35:  # channel credit with a realized gain: (almost) never repeats
        base.update(steps=1, alpha=1.0, gain=rng.uniform(0.2, 2.0), n0=1e-4,
                    trusted_channel_noise=1.0, d=1000, l=500)
    return RecordEvent(**base)


def _upload(rng: random.Random, device: int, t: int) -> UploadEvent:
    return UploadEvent(round=t, device=device, mechanism=rng.choice(["before", "after"]),
                       sigma=rng.choice([0.5, 2.0, rng.uniform(0.0, 3.0)]), alpha=1.0,
                       gain=rng.choice([1.0, rng.uniform(0.0, 2.0)]),
                       n0=rng.choice([0.0, 1e-2]), trusted_channel_noise=rng.choice([0.0, 1.0]),
                       d=1000, l=rng.choice([100, 1000]), q=rng.choice([None, 4, 16]), clip=5.0,
                       quantizer_scale=rng.choice(["norm", "fixed"]))


# ------------------------------------------------------------------ exact running sum


def test_exact_sum_is_math_fsum_bit_for_bit() -> None:
    rng = random.Random(11)
    for _ in range(3000):
        values = [rng.random() * 10.0 ** rng.randint(-320, 300) for _ in range(rng.randint(0, 40))]
        total = ExactSum(values)
        assert total.value() == math.fsum(values)
        extra = rng.random() * 10.0 ** rng.randint(-20, 20)
        assert total.value_with(extra) == math.fsum([*values, extra])
        assert len(total) == len(values)
    assert ExactSum([1.0, math.inf, 2.0]).value() == math.inf
    assert ExactSum([0.1] * 10).value() == math.fsum([0.1] * 10) != sum([0.1] * 10)
    with pytest.raises(OverflowError):
        ExactSum([1e308, 1e308]).value()
    with pytest.raises(ValueError, match="must be >= 0"):
        ExactSum([math.nan])
    with pytest.raises(ValueError, match="must be >= 0"):
        ExactSum().add(-1.0)


# ------------------------------------------------------------ cached == unoptimised


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
@pytest.mark.parametrize("relation", ["add-remove", "replace-one"])
def test_record_accountant_equals_the_unoptimised_one(accountant: str, relation: str) -> None:
    rng = random.Random(f"{accountant}-{relation}")
    cached = RecordAccountant(accountant, DELTA, relation=relation)
    plain = ReferenceRecordAccountant(accountant, DELTA, relation=relation)
    rounds = 4 if accountant == "pld" else 25
    for t in range(rounds):
        shared = _record(rng, 0, t, relation)
        for device in range(6):
            # devices 0-2 share every event, 3-5 draw their own: both paths are exercised
            event = shared.for_round_and_device(t, device) if device < 3 else _record(
                rng, device, t, relation)
            assert _same(cached.epsilon_if(device, event), plain.epsilon_if(device, event))
            cached.add(event)
            plain.add(event)
            assert _same(cached.epsilon(device), plain.epsilon(device))
    # the three devices with one history were composed once per round, not three times
    assert cached.compositions <= 4 * rounds
    assert cached.epsilon(1) is cached.epsilon(0) and cached.epsilon(2) is cached.epsilon(0)


@pytest.mark.parametrize("mode", ["paper", "strict"])
@pytest.mark.parametrize("conversion", ["standard", "balle2020"])
def test_device_accountant_equals_the_unoptimised_one(mode: str, conversion: str) -> None:
    rng = random.Random(f"{mode}-{conversion}")
    cached = PrivacyAccountant(mode, DELTA, conversion)
    plain = ReferencePrivacyAccountant(mode, DELTA, conversion)
    for t in range(40):
        for device in range(5):
            event = _upload(rng, device, t)
            assert _same(cached.epsilon_if(device, event), plain.epsilon_if(device, event))
            cached.add(event)
            plain.add(event)
            assert _same(cached.epsilon(device), plain.epsilon(device))


def test_identical_device_uploads_match_the_closed_form() -> None:
    """docs/privacy.md §2: K uploads of coefficient c give c K + 2 sqrt(c K log(1/delta))."""
    acc = PrivacyAccountant("strict", DELTA)
    event = UploadEvent(round=0, device=0, mechanism="before", sigma=20.0, alpha=1.0, gain=1.0,
                        n0=1e-4, trusted_channel_noise=1.0, d=21840, l=2184, q=None, clip=5.0)
    c = upload_coefficient(event, mode="strict")
    for t in range(60):
        for device in range(50):
            acc.add(event.for_round_and_device(t, device))
    for device in (0, 49):
        result = acc.epsilon(device)
        closed, _ = gaussian_epsilon_closed_form(coefficient=math.fsum([c] * 60), delta=DELTA)
        assert result.rdp_coefficient == math.fsum([c] * 60)
        assert result.epsilon == pytest.approx(closed, rel=1e-9)
        assert result.uploads == 60


def test_identical_histories_are_composed_once_and_freed() -> None:
    acc = RecordAccountant("pld", DELTA)
    event = RecordEvent(round=0, device=0, steps=1, sampling_rate=0.01, amplified=True,
                        example_clip=1.0, expected_batch=60.0, dataset_size=6000,
                        sigma=1.0 / 60.0)
    single = ReferenceRecordAccountant("pld", DELTA)
    for t in range(5):
        for device in range(300):
            acc.add(event.for_round_and_device(t, device))
            acc.epsilon(device)
        single.add(event.for_round_and_device(t, 0))
    assert acc.compositions == 5  # not 1,500
    assert all(acc.epsilon(d) is acc.epsilon(0) for d in range(300))
    assert _same(acc.epsilon(299), single.epsilon(0))


def test_a_prefix_no_device_points_at_is_freed() -> None:
    composed: list[tuple[Any, Any]] = []

    def compose(state: Any, key: Any) -> Any:
        composed.append((state, key))
        return (*state, key)

    trie = StateTrie((), compose, lambda key: 1, keep_recent=0)
    a = trie.child(trie.root, "x")
    b = trie.child(trie.root, "x")
    assert a is b and trie.composed == 1
    first = weakref.ref(a)
    second = trie.child(a, "y")
    assert (second.state, second.events, second.steps) == (("x", "y"), 2, 2)
    del a, b
    composed.clear()
    gc.collect()
    assert first() is None  # only the device's current node is kept
    assert trie.child(second, "z").state == ("x", "y", "z")
    kept = StateTrie((), compose, lambda key: 1, keep_recent=2)
    recent = weakref.ref(kept.child(kept.root, "x"))
    gc.collect()
    assert recent() is not None  # a device that lags behind still finds it
    kept.child(kept.root, "y")
    kept.child(kept.root, "z")
    gc.collect()
    assert recent() is None
    with pytest.raises(ValueError, match="keep_recent"):
        StateTrie((), compose, lambda key: 1, keep_recent=-1)


def test_devices_sampled_into_rounds_share_by_count() -> None:
    """With device sampling each device has made k of the same uploads: one state per k."""
    rng = random.Random(5)
    acc = RecordAccountant("rdp", DELTA)
    plain = ReferenceRecordAccountant("rdp", DELTA)
    event = RecordEvent(round=0, device=0, steps=2, sampling_rate=0.02, amplified=True,
                        example_clip=1.0, expected_batch=60.0, dataset_size=3000,
                        sigma=0.9 / 60.0)
    rounds, devices = 30, 40
    for t in range(rounds):
        for device in range(devices):
            if rng.random() < 0.4:
                e = event.for_round_and_device(t, device)
                acc.add(e)
                plain.add(e)
    assert acc.compositions <= rounds
    for device in range(devices):
        assert _same(acc.epsilon(device), plain.epsilon(device))


@pytest.mark.filterwarnings("ignore::testbed.core.privacy.analysis.rdp.OrderAtEdgeWarning")
def test_gate_is_exact_under_sharing() -> None:
    """The guard refuses exactly where the unoptimised accountant refuses, and no device
    passes its target: epsilon_if equals epsilon after add bit for bit."""
    rng = random.Random(3)
    cached = RecordAccountant("rdp", DELTA)
    plain = ReferenceRecordAccountant("rdp", DELTA)
    targets = {d: rng.uniform(0.3, 1.5) for d in range(20)}
    guards = BudgetGuard(cached, targets), BudgetGuard(plain, targets)
    refused = 0
    for t in range(60):
        shared = _record(rng, 0, t, "add-remove")
        for device in range(20):
            event = shared.for_round_and_device(t, device)
            allowed = [g.allows(device, event) for g in guards]
            assert allowed[0] == allowed[1]
            if allowed[0]:
                projected = cached.epsilon_if(device, event)
                cached.add(event)
                plain.add(event)
                assert cached.epsilon(device) == projected
            else:
                refused += 1
    assert refused > 0
    assert all(cached.epsilon(d).epsilon <= targets[d] for d in range(20))


def test_rarely_asked_figures_equal_the_history_functions() -> None:
    from testbed.core.privacy import device_level_epsilon

    rng = random.Random(9)
    acc = RecordAccountant("rdp", DELTA)
    for t in range(30):
        for device in range(3):
            acc.add(_record(rng, device, t, "add-remove"))
    for device in range(3):
        assert acc.device_epsilon(device) == device_level_epsilon(acc.history(device), DELTA)
        assert acc.epsilon_without_channel(device) is acc.epsilon_without_channel(device)


# ------------------------------------------------------------------ event copies


def test_copies_for_another_round_and_device_share_derived_values() -> None:
    event = RecordEvent(round=3, device=4, steps=1, sampling_rate=0.01, amplified=True,
                        example_clip=1.0, expected_batch=60.0, dataset_size=6000, sigma=0.02)
    copy = event.for_round_and_device(7, 9)
    assert (copy.round, copy.device) == (7, 9)
    fields = {k: v for k, v in event.to_dict().items() if k != "type"}
    assert copy == RecordEvent(**(fields | {"round": 7, "device": 9}))
    calls: list[Any] = []

    def compute(e: Any) -> float:
        calls.append(e)
        return e.sigma * 2.0

    assert copy.derived("x", compute) == 0.04
    assert event.derived("x", compute) == 0.04
    assert event.for_round_and_device(1, 1).derived("x", compute) == 0.04
    assert len(calls) == 1  # computed once for the event and all its copies
    plain = RecordEvent(**fields)
    assert plain.derived("x", compute) == plain.derived("x", compute) == 0.04
    assert len(calls) == 3  # an event made otherwise keeps no store
    assert copy.to_dict() == {**event.to_dict(), "round": 7, "device": 9}
    for bad in (-1, True, 1.0):
        with pytest.raises(EventError, match="must be an integer >= 0"):
            event.for_round_and_device(bad, 0)  # type: ignore[arg-type]
        with pytest.raises(EventError, match="must be an integer >= 0"):
            event.for_round_and_device(0, bad)  # type: ignore[arg-type]


# ------------------------------------------------------------------ ledger read


def _line(event: Any, nonce: str | None) -> bytes:
    """A line exactly as Ledger.append writes it."""
    data = event.to_dict()
    if nonce is not None:
        data["nonce"] = nonce
    return (json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n").encode()


def _chain(header: dict[str, Any] | None, lines: list[bytes],
           writer: str = "0123456789abcdef") -> bytes:
    """``lines`` (and a header first) as Ledger.append writes them: chained and sealed."""
    out: list[bytes] = []
    tail = GENESIS
    records = [] if header is None else [{"type": HEADER_TYPE, **header}]
    records += [json.loads(line) for line in lines]
    for data in records:
        data = data | {"writer": writer} | ({} if "prev" in data or data["type"] == HEADER_TYPE
                                           else {"prev": tail})
        out.append(seal(json.dumps(data, sort_keys=True, separators=(",", ":"))[:-1].encode()))
        tail = out[-1][-67:-3].decode()
    return b"".join(out)


def _parse_both(data: bytes, path: Path) -> tuple[Any, Any]:
    """(fast result, full result), each a list of (event dict, type, nonce) or the error."""
    out: list[Any] = []
    for templates in (True, False):
        try:
            entries = LineParser(path, EVENT_TYPES, HEADER_TYPE, templates=templates).parse(data)
            out.append([(type(e.event), e.event.to_dict(), type(e.event.round), e.nonce)
                        for e in entries])
        except LedgerError as exc:
            out.append(str(exc))
    return out[0], out[1]


def test_ledger_append_writes_the_line_format_the_tests_generate(tmp_path: Path) -> None:
    event = RecordEvent(round=2, device=5, steps=1, sampling_rate=0.01, amplified=True,
                        example_clip=1.0, expected_batch=60.0, dataset_size=6000, sigma=0.02)
    with Ledger.open(tmp_path / "l.jsonl") as ledger:
        ledger.append(event, "ab12")
    assert (tmp_path / "l.jsonl").read_bytes() == _chain(None, [_line(event, "ab12")],
                                                         ledger.writer)


_BASE = _line(RecordEvent(round=12, device=34, steps=1, sampling_rate=0.01, amplified=True,
                          example_clip=1.0, expected_batch=60.0, dataset_size=6000, sigma=0.02),
              "0a1b2c").decode()
TRICKY = [
    _BASE,
    _BASE.replace('"round":12', '"round": 12'),
    _BASE.replace('"round":12', '"round":012'),
    _BASE.replace('"round":12', '"round":-12'),
    _BASE.replace('"round":12', '"round":1.5'),
    _BASE.replace('"round":12', '"round":1e3'),
    _BASE.replace('"round":12', '"round":true'),
    _BASE.replace('"round":12', '"round":12,"round":13'),
    _BASE.replace('"round":12', '"round":-1,"round":13'),
    _BASE.replace('"round":12', '"round":13,"round":-1'),
    _BASE.replace('"round":12', '"round":12,"round":0'),
    _BASE.replace('"device":34', '"device":34,"device":0'),
    _BASE.replace('"nonce":"0a1b2c"', '"nonce":"0a1b2c","nonce":""'),
    _BASE.replace('"device":34', '"device":34,"dev\\u0069ce":-5'),
    _BASE.replace('"device":34', '"dev\\u0069ce":-5,"device":34'),
    _BASE.replace('"device":34', '"x\\"device":35,"device":34'),
    _BASE.replace('"nonce":"0a1b2c"', '"nonce":null'),
    _BASE.replace('"nonce":"0a1b2c"', '"nonce":5'),
    _BASE.replace('"nonce":"0a1b2c"', '"nonce":"a\\u0041"'),
    _BASE.replace('"nonce":"0a1b2c"', '"nonce":"a b"'),
    _BASE.replace('"nonce":"0a1b2c"', '"nonce":"\u00e9"'),
    _BASE.replace('"nonce":"0a1b2c"', '"nonce":"0a1b2c","nonce":"zz"'),
    _BASE.replace('"nonce":"0a1b2c",', ''),
    _BASE.replace('"relation":"add-remove"', '"relation":{"device":1}'),
    _BASE.replace('"relation":"add-remove"', '"relation":["add-remove"]'),
    _BASE.replace('"sigma":0.02', '"sigma":NaN'),
    _BASE.replace('"sigma":0.02', '"sigma":-0.02'),
    _BASE.replace('"type":"record-sgm/v1"', '"type":"nope/v1"'),
    _BASE.replace('"type":"record-sgm/v1"', f'"type":"{HEADER_TYPE}"'),
    _BASE.replace('"steps":1', '"steps":1,"extra":0'),
    _BASE.replace("}\n", "} x\n"),
    _BASE.replace("}\n", "}}\n"),
    "[" + _BASE.rstrip("\n") + "]\n",
    _BASE.replace('{"alpha"', '{"round":7,"alpha"'),
]


@pytest.mark.parametrize("line", TRICKY)
def test_fast_read_equals_full_parse_on_tricky_lines(tmp_path: Path, line: str) -> None:
    data = (_BASE + _BASE.replace('"round":12', '"round":13') + line).encode()
    fast, full = _parse_both(data, tmp_path / "ledger.jsonl")
    assert fast == full


def test_fast_read_equals_full_parse_on_invalid_utf8(tmp_path: Path) -> None:
    bad = _BASE.encode().replace(b'"add-remove"', b'"add-\xff-remove"')
    fast, full = _parse_both(_BASE.encode() + bad, tmp_path / "ledger.jsonl")
    assert fast == full
    assert isinstance(full, str) and "line 2" in full


@settings(max_examples=300, deadline=None)
@given(st.integers(0, len(_BASE) - 2), st.integers(0, 4), st.binary(max_size=4))
def test_fast_read_equals_full_parse_on_damaged_lines(cut: int, drop: int, insert: bytes) -> None:
    raw = _BASE.encode()
    damaged = raw[:cut] + insert + raw[cut + drop:]
    if not damaged.endswith(b"\n"):
        damaged += b"\n"
    # the same damage twice: the second line goes through the template the first made
    data = raw + damaged + damaged.replace(b'"round":12', b'"round":99')
    fast, full = _parse_both(data, Path("ledger.jsonl"))
    assert fast == full


def test_a_long_ledger_is_read_through_templates(tmp_path: Path) -> None:
    rng = random.Random(1)
    events = [_record(rng, d, t, "add-remove") if d % 5 == 0 else
              RecordEvent(round=t, device=d, steps=1, sampling_rate=0.01, amplified=True,
                          example_clip=1.0, expected_batch=60.0, dataset_size=6000,
                          sigma=1.0 / 60.0) for t in range(40) for d in range(25)]
    data = b"".join(_line(e, secrets.token_hex(16)) for e in events)
    parser = LineParser(tmp_path / "l", EVENT_TYPES, HEADER_TYPE)
    entries = parser.parse(data)
    assert [e.event for e in entries] == events
    assert parser.fast_lines == len(events)
    fast, full = _parse_both(data, tmp_path / "l")
    assert fast == full


# ------------------------------------------------------------------ replay == live


def _write_ledger(path: Path, header: dict[str, Any], lines: list[bytes]) -> None:
    path.write_bytes(_chain(header, lines))


@pytest.mark.parametrize("unit", ["record", "device"])
def test_replay_of_a_generated_ledger_equals_live_accounting(tmp_path: Path, unit: str) -> None:
    rng = random.Random(unit)
    enforce = "rdp" if unit == "record" else "strict"
    live = make_accountants(unit, DELTA)
    plain = ({"rdp": ReferenceRecordAccountant("rdp", DELTA),
              "pld": ReferenceRecordAccountant("pld", DELTA)} if unit == "record" else
             {m: ReferencePrivacyAccountant(m, DELTA) for m in ("paper", "strict")})
    lines = []
    devices, rounds = 9, (5 if unit == "record" else 30)
    for t in range(rounds):
        shared = (_record(rng, 0, t, "add-remove") if unit == "record" else _upload(rng, 0, t))
        for device in range(devices):
            event = (shared.for_round_and_device(t, device) if device % 3 else
                     _record(rng, device, t, "add-remove") if unit == "record"
                     else _upload(rng, device, t))
            for acc in (*live.values(), *plain.values()):
                acc.add(event)
            lines.append(_line(event, secrets.token_hex(16)))
    header = {"delta": DELTA, "accounting": enforce, "epsilon_target": 1e6}
    if unit == "record":
        header |= {"unit": "record", "relation": "add-remove"}
    path = tmp_path / "ledger.jsonl"
    _write_ledger(path, header, lines)
    book = PrivacyBook(path, delta=DELTA, enforce=enforce, target=1e6, unit=unit)
    for device in range(devices):
        replayed = book.epsilon(device)
        for name in live:
            assert _same(replayed[name], live[name].epsilon(device))
            assert _same(replayed[name], plain[name].epsilon(device))
    assert len(book.nonces()) == devices * rounds
    book.close()


def test_replay_charges_a_begun_upload_and_detects_corruption(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    event = RecordEvent(round=0, device=0, steps=1, sampling_rate=0.01, amplified=True,
                        example_clip=1.0, expected_batch=60.0, dataset_size=6000,
                        sigma=1.0 / 60.0)
    book = PrivacyBook(path, delta=DELTA, enforce="rdp", target=1e6, unit="record")
    for t in range(3):
        for device in range(4):
            e = event.for_round_and_device(t, device)
            book.commit(e, book.begin(e))
    pending = event.for_round_and_device(3, 2)
    book.begin(pending)  # ... the process dies before the commit
    book.ledger.close()
    with pytest.warns(UserWarning, match="device 2 round 3"):
        again = PrivacyBook(path, delta=DELTA, enforce="rdp", target=1e6, unit="record")
    assert again.epsilon(2)["rdp"].events == 4  # the begun upload is charged
    assert again.epsilon(1)["rdp"].events == 3
    live = RecordAccountant("rdp", DELTA)
    for t in range(4):
        live.add(event.for_round_and_device(t, 2))
    assert again.epsilon(2)["rdp"] == live.epsilon(2)
    again.close()
    # a complete line damaged in the middle of the ledger is corruption, named by its line
    data = path.read_bytes().split(b"\n")
    original = data[5]
    data[5] = data[5].replace(b'"round":', b'"round":x')
    path.write_bytes(b"\n".join(data))
    with pytest.raises(LedgerError, match="line 6"):
        PrivacyBook(path, delta=DELTA, enforce="rdp", target=1e6, unit="record")
    # a torn last line is still cut off with a warning, the rest replayed
    data[5] = original
    path.write_bytes(b"\n".join(data) + b'{"round":4,"dev')
    with pytest.warns(TornLineWarning):
        third = PrivacyBook(path, delta=DELTA, enforce="rdp", target=1e6, unit="record")
    assert third.epsilon(2)["rdp"].events == 4
    third.close()


def test_loaded_entries_are_handed_over_once(tmp_path: Path) -> None:
    with Ledger.open(tmp_path / "l.jsonl") as ledger:
        assert ledger.take_loaded() == []
        with pytest.raises(LedgerError, match="already taken"):
            ledger.take_loaded()
