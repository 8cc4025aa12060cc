"""A replay composed a run at a time (``replay_runs``) is the replay event by event, bit for
bit: the same nodes, histories, epsilons and device order, with no more compositions, whatever
the runs look like (devices twice in a run, devices that skip runs, new devices mid-way, short
runs, devices that do not fit int64, events without a shared store)."""

from __future__ import annotations

import random

import pytest

from testbed.core.privacy.accountants import replay_runs
from testbed.core.privacy.accountants.record_accountant import RecordAccountant
from testbed.core.privacy.accountants.replay_runs import advance_run, run_starts
from testbed.core.privacy.record_events import RecordEvent


def _event(t: int, d: int, dataset: int = 6000) -> RecordEvent:
    return RecordEvent(round=t, device=d, steps=1, sampling_rate=60.0 / dataset, amplified=True,
                       example_clip=1.0, expected_batch=60.0, dataset_size=dataset, sigma=0.02)


def _ledger_like(seed: int, runs: int, devices: int) -> list[RecordEvent]:
    """Runs of copies of three templates (three keys), each run a random subset of devices
    in random order, some twice, some new, with plain events (no store) between runs."""
    rng = random.Random(seed)
    templates = [_event(0, 0, dataset) for dataset in (3000, 6000, 9000)]
    events: list[RecordEvent] = []
    for t in range(runs):
        template = templates[rng.randrange(3)]
        present = [d for d in range(devices + 5 * t) if rng.random() < 0.7]
        present += rng.sample(present, k=min(len(present), rng.randrange(4)))  # twice in a run
        rng.shuffle(present)
        events += [template.for_round_and_device(t, d) for d in present]
        if rng.random() < 0.3:
            events.append(_event(t, rng.randrange(devices), 4000))
    return events


def _same(one: RecordAccountant, many: RecordAccountant) -> None:
    assert list(one._events) == list(many._events)  # new devices in the same order
    assert list(one._nodes) == list(many._nodes)
    for d in one._events:
        assert one.history(d) == many.history(d)
        assert one.epsilon(d) == many.epsilon(d)
        assert one.epsilon_without_channel(d) == many.epsilon_without_channel(d)
    # a cost, not a result: event by event may compose a node again after it was dropped
    assert many.compositions <= one.compositions


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
@pytest.mark.parametrize("min_run", [1, 7, replay_runs.MIN_RUN])
def test_run_at_a_time_is_event_by_event_bit_for_bit(
    accountant: str, min_run: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(replay_runs, "MIN_RUN", min_run)
    events = _ledger_like(seed=min_run, runs=12 if accountant == "pld" else 30, devices=300)
    starts = run_starts(events)
    assert max(b - a for a, b in zip(starts, starts[1:], strict=False)) >= 256
    one, many = RecordAccountant(accountant, 1e-5), RecordAccountant(accountant, 1e-5)
    for event in events:
        one.add(event)
    half = len(events) // 2  # two calls: the second starts from the nodes the first left
    many.add_all(events[:half])
    many.add_all(iter(events[half:]))
    _same(one, many)


def test_run_starts_split_at_each_new_store_and_at_each_plain_event() -> None:
    a, b = _event(0, 0, 3000), _event(0, 0, 6000)
    events = [a.for_round_and_device(1, d) for d in range(3)]
    events += [_event(1, 7), _event(1, 8)]  # no store: a run each
    events += [b.for_round_and_device(1, d) for d in range(2)]
    events += [a.for_round_and_device(2, d) for d in range(2)]
    assert run_starts(events) == [0, 3, 4, 5, 7]
    assert run_starts([]) == []


def test_devices_beyond_int64_go_event_by_event(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replay_runs, "MIN_RUN", 1)
    template = _event(0, 0)
    big = 2**70
    events = [template.for_round_and_device(t, d) for t in range(3) for d in (big, 1, big + 1)]
    one, many = RecordAccountant("rdp", 1e-5), RecordAccountant("rdp", 1e-5)
    for event in events:
        one.add(event)
    many.add_all(events)
    _same(one, many)
    assert len(many.history(big)) == 3


def test_advance_run_moves_each_device_by_its_own_count() -> None:
    made: list[tuple[str, str]] = []

    def child(node: object, key: object) -> object:
        made.append((str(node), str(key)))
        return f"{node}+{key}"

    nodes: dict[int, object] = {5: "s"}
    history: dict[int, list[object]] = {5: ["old"]}
    template = _event(0, 0)
    devices = [9, 5, 9, 9, 2] * 60  # 300 events: 9 three times a round, 5 and 2 once
    run = [template.for_round_and_device(0, d) for d in devices]
    advance_run(run, "k", child, "r", nodes, history)  # type: ignore[arg-type]
    assert nodes == {5: "s" + "+k" * 60, 9: "r" + "+k" * 180, 2: "r" + "+k" * 60}
    assert list(nodes) == [5, 9, 2] and list(history) == [5, 9, 2]
    assert history[5] == ["old", *run[1::5]]
    assert history[9] == [e for e in run if e.device == 9]
    # each node composed once: the root's chain serves both devices that start there
    assert len(made) == len(set(made)) == 180 + 60


def test_an_empty_replay_adds_nothing() -> None:
    acc = RecordAccountant("rdp", 1e-5)
    acc.add_all([])
    acc.add_all(iter(()))
    assert acc.devices() == () and acc.compositions == 0
