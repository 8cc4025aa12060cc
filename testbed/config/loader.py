"""Loading configs from YAML with ``--set key=value`` overrides, and readable errors.

Every error raised here is a :class:`ConfigError` whose message names the key, the value
given and what is allowed, e.g.::

    config key 'rounds': got -3; Input should be greater than or equal to 1
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from testbed.config.experiment import ExperimentConfig
from testbed.config.hardware import HardwareConfig

M = TypeVar("M", bound=BaseModel)

#: The repository's ``hw_configs`` folder (next to the packages in a checkout).
HW_CONFIG_DIR = Path(__file__).resolve().parents[2] / "hw_configs"


class ConfigError(ValueError):
    """A configuration value was refused; the message says which key and why."""


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"config file '{path}' does not exist")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file '{path}' is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file '{path}' must hold a mapping, got {type(data).__name__}")
    return data


def default_experiment_dict() -> dict[str, Any]:
    """The default experiment shipped with the package, as a plain mapping."""
    text = resources.files("testbed.config").joinpath("default.yaml").read_text()
    data = yaml.safe_load(text)
    assert isinstance(data, dict)
    return data


def parse_override(item: str) -> tuple[list[str], Any]:
    """Split ``"a.b=value"`` into (``["a", "b"]``, parsed YAML value)."""
    if "=" not in item:
        raise ConfigError(f"--set '{item}': expected key=value, e.g. --set rounds=5")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"--set '{item}': empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set '{item}': value is not valid YAML: {exc}") from exc
    return key.split("."), value


def apply_overrides(data: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Return a copy of ``data`` with each ``key.sub=value`` override applied."""
    out: dict[str, Any] = _deep_copy(data)
    for item in overrides:
        path, value = parse_override(item)
        node = out
        for part in path[:-1]:
            child = node.get(part)
            if child is None:
                child = {}
                node[part] = child
            if not isinstance(child, dict):
                raise ConfigError(f"--set '{item}': '{part}' is a value ({child!r}), not a section")
            node = child
        node[path[-1]] = value
    return out


def _deep_copy(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, Mapping) else v for k, v in data.items()}


def _format_validation_error(exc: ValidationError, what: str) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            lines.append(f"{what} key '{loc}': unknown key (value {err.get('input')!r})")
            continue
        if err["type"] == "value_error":
            lines.append(f"{what}: {msg.removeprefix('Value error, ')}")
            continue
        ctx = err.get("ctx") or {}
        allowed = f" (allowed: {ctx['expected']})" if "expected" in ctx else ""
        lines.append(f"{what} key '{loc}': got {err.get('input')!r}; {msg}{allowed}")
    return "\n".join(lines)


def validate(model: type[M], data: Mapping[str, Any], what: str = "config") -> M:
    """Validate ``data`` into ``model``, raising :class:`ConfigError` with readable text."""
    try:
        return model.model_validate(dict(data))
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc, what)) from None


def load_experiment(
    path: str | Path | None = None, overrides: Iterable[str] = ()
) -> ExperimentConfig:
    """Load an experiment config: the shipped default, then ``path``, then overrides.

    Parameters
    ----------
    path
        YAML file; ``None`` uses the default experiment only.
    overrides
        ``key=value`` strings, dotted keys for sections (``privacy.epsilon=1.8``).
    """
    data = default_experiment_dict()
    if path is not None:
        data = _merge(data, _read_yaml(Path(path)))
    data = apply_overrides(data, overrides)
    return validate(ExperimentConfig, data, "config")


def _merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    out = _deep_copy(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def resolve_hw_config_path(name_or_path: str) -> Path:
    """Map ``sim`` to ``hw_configs/sim.yaml``; pass real paths through."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") or candidate.exists():
        return candidate
    path = HW_CONFIG_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in HW_CONFIG_DIR.glob("*.yaml"))
        raise ConfigError(
            f"config key 'hw_config': got {name_or_path!r}; allowed: a YAML path or one of {known}"
        )
    return path


def load_hardware(name_or_path: str, overrides: Iterable[str] = ()) -> HardwareConfig:
    """Load a hardware config by name (``sim``) or path."""
    data = apply_overrides(_read_yaml(resolve_hw_config_path(name_or_path)), overrides)
    return validate(HardwareConfig, data, "hardware config")


def dump_yaml(model: BaseModel) -> str:
    """The resolved config as YAML (every key, defaults included)."""
    return yaml.safe_dump(model.model_dump(mode="json"), sort_keys=False)
