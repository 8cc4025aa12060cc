"""Reading YAML: bounded, no alias bombs, no silent duplicate keys, readable errors.

Every test here feeds one hostile or malformed input and asserts the refusal names the
file (or option), says what is wrong, stays short and costs little time and memory.
"""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

import pytest

from aggregator.solver.from_config import read_calibration_betas, read_scenario_file
from testbed.core.config.errors import ConfigError
from testbed.core.config.loader import dump_yaml, load_experiment, load_hardware
from testbed.core.config.plan_file import load_plan
from testbed.core.config.safe_yaml import MAX_YAML_BYTES, parse_yaml_text, read_yaml_mapping


def _billion_laughs() -> str:
    """The classic 9 x 9 alias bomb: ~340 bytes naming 9^9 strings."""
    text = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    prev = "a"
    for name in "bcdefghi":
        text += f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]\n"
        prev = name
    return text


def _one_line(message: str) -> str:
    assert "\n" not in message and "Traceback" not in message, message
    return message


@pytest.mark.timeout(20)
def test_alias_bomb_is_refused_at_once_with_little_memory(tmp_path: Path) -> None:
    bomb = tmp_path / "lol.yaml"
    bomb.write_text(_billion_laughs())
    assert bomb.stat().st_size < 400
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(ConfigError) as info:
            load_experiment(bomb)
        elapsed = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    message = _one_line(str(info.value))
    assert elapsed < 0.5 and peak < 5_000_000, (elapsed, peak)
    assert "lol.yaml" in message and "anchor" in message and len(message) < 300


def test_alias_in_an_override_value_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"--set 'seed=&x 1'.*anchor"):
        load_experiment(None, ["seed=&x 1"])


@pytest.mark.timeout(20)
def test_two_megabyte_file_is_refused_before_parsing(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("rounds: 3\n# " + "x" * (2 * MAX_YAML_BYTES) + "\n")
    t0 = time.perf_counter()
    with pytest.raises(ConfigError) as info:
        load_experiment(big)
    assert time.perf_counter() - t0 < 0.5
    message = _one_line(str(info.value))
    assert "big.yaml" in message and str(big.stat().st_size) in message and "1 MiB" in message


@pytest.mark.parametrize(
    ("text", "key", "first_line"),
    [
        ("rounds: 3\nseed: 1\nrounds: 5\n", "'rounds'", 1),
        ("privacy:\n  epsilon: 1\n  delta: 1.0e-5\n  epsilon: 8\n", "'epsilon'", 2),
    ],
)
def test_duplicate_keys_are_refused_naming_key_file_and_lines(
    tmp_path: Path, text: str, key: str, first_line: int
) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_experiment(path)
    message = _one_line(str(info.value))
    assert "dup.yaml" in message and f"duplicate key {key}" in message
    assert f"first given on line {first_line}" in message


def test_binary_file_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "blob.yaml"
    path.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(ConfigError, match=r"config file '.*blob\.yaml' is not UTF-8 text"):
        load_experiment(path)
    nul = tmp_path / "nul.yaml"
    nul.write_bytes(b"rounds: 3\x00\n")
    with pytest.raises(ConfigError, match=r"nul\.yaml' holds NUL bytes"):
        load_experiment(nul)


def test_a_directory_is_named_as_such(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is a directory"):
        load_experiment(tmp_path)


def test_deep_nesting_is_refused_without_recursion_error(tmp_path: Path) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text("seed: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ConfigError, match="nesting deeper than"):
        load_experiment(path)


def test_an_integer_too_long_to_convert_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "long.yaml"
    path.write_text("rounds: " + "9" * 5000 + "\n")
    with pytest.raises(ConfigError, match="more than 4300 digits"):
        load_experiment(path)


def test_echoed_values_are_cut_short(tmp_path: Path) -> None:
    path = tmp_path / "long-name.yaml"
    path.write_text("name: " + "a" * 500_000 + "\n")
    with pytest.raises(ConfigError) as info:
        load_experiment(path)
    message = _one_line(str(info.value))
    assert "config key 'name'" in message and "500000 characters" in message
    assert len(message) < 600


def test_many_errors_are_capped(tmp_path: Path) -> None:
    path = tmp_path / "many.yaml"
    path.write_text("".join(f"bogus_{i}: {i}\n" for i in range(50)))
    with pytest.raises(ConfigError) as info:
        load_experiment(path)
    lines = str(info.value).splitlines()
    assert len(lines) <= 9 and "42 more errors" in lines[-1]


def test_unquoted_date_stays_text() -> None:
    assert load_experiment(None, ["name=2024-01-01"]).name == "2024-01-01"


def test_yaml_1_2_exponents_are_numbers_and_round_trip(tmp_path: Path) -> None:
    cfg = load_experiment(None, ["privacy.delta=1e-7", "privacy.epsilon=1e3", "name='1e5'"])
    assert cfg.privacy.delta == 1e-7 and cfg.privacy.epsilon == 1000.0 and cfg.name == "1e5"
    path = tmp_path / "config.yaml"
    path.write_text(dump_yaml(cfg))
    assert load_experiment(path) == cfg
    assert parse_yaml_text("915.0e6", "x") == 915e6


def test_exotic_tags_are_refused() -> None:
    with pytest.raises(ConfigError, match="tag"):
        parse_yaml_text("name: !!binary YWJj\n", "--set 'x'")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("solver: 5\n", "scenario file key 'solver': got 5; allowed: a mapping"),
        ("- 1\n", "must hold a mapping"),
        ("solver:\n  h: [true, 1]\n", "scenario key 'h'"),
        ("solver:\n  n0: .nan\n", "scenario key 'n0'"),
        ("solver:\n  beta1: 1\n  beta1: 2\n", "duplicate key 'beta1'"),
    ],
)
def test_bad_scenario_files(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "scn.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        read_scenario_file(path)
    assert fragment in _one_line(str(info.value))


def test_binary_scenario_calibration_and_plan_files(tmp_path: Path) -> None:
    blob = tmp_path / "blob.yaml"
    blob.write_bytes(b"\xff\xfe" * 64)
    for read, what in [
        (read_scenario_file, "scenario file"),
        (lambda p: read_calibration_betas(p, model="paper-25"), "calibration file"),
        (load_plan, "plan file"),
        (lambda p: load_hardware(str(p)), "hardware config file"),
    ]:
        with pytest.raises(ConfigError, match=f"{what} '.*blob.yaml' is not UTF-8"):
            read(blob)


def test_a_file_that_is_not_a_plan_says_so(tmp_path: Path) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text("rounds: 3\n")
    with pytest.raises(ConfigError, match=r"plan file '.*exp\.yaml' key 'format'.*testbed plan"):
        load_plan(path)
    with pytest.raises(ConfigError, match="plan file .* is a directory"):
        load_plan(tmp_path)


def test_empty_file_is_an_empty_mapping(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("# nothing\n")
    assert read_yaml_mapping(path) == {}
