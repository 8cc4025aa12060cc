"""Loading configs from YAML with ``--set key=value`` overrides, and readable errors.

Every error raised here is a :class:`ConfigError` whose message names the key, the value
given and what is allowed, e.g.::

    config key 'rounds': got -3; Input should be greater than or equal to 1
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from testbed.core.config.errors import ConfigError
from testbed.core.config.experiment import ExperimentConfig
from testbed.core.config.hardware import SOURCE_CONTEXT_KEY, HardwareConfig
from testbed.core.config.safe_yaml import (
    dump_yaml_text,
    parse_yaml_text,
    read_yaml_mapping,
    short_repr,
    short_text,
)

__all__ = [
    "HW_CONFIG_DIR",
    "HW_CONFIG_ENV",
    "apply_overrides",
    "default_experiment_dict",
    "dump_yaml",
    "hw_config_dir",
    "include_calibration",
    "load_experiment",
    "load_hardware",
    "parse_override",
    "resolve_hw_config_path",
    "validate",
]

M = TypeVar("M", bound=BaseModel)

#: The repository's ``hw_configs`` folder (next to the packages in a checkout or an
#: editable install; found from this file, not from the working directory).
HW_CONFIG_DIR = Path(__file__).resolve().parents[3] / "hw_configs"
#: Environment variable that points at another ``hw_configs`` folder (a wheel install
#: has none beside the package).
HW_CONFIG_ENV = "TESTBED_HW_CONFIG_DIR"
#: Most validation errors listed in one message; the rest are counted.
MAX_ERRORS_SHOWN = 8

_BARE_NAME = re.compile(r"[A-Za-z0-9_-]+")


def default_experiment_dict() -> dict[str, Any]:
    """The default experiment shipped with the package, as a plain mapping."""
    # one name per step: Traversable.joinpath takes a single one before Python 3.11
    text = (resources.files("testbed") / "config" / "default.yaml").read_text("utf-8")
    data = parse_yaml_text(text, "the shipped default.yaml")
    assert isinstance(data, dict)
    return data


def parse_override(item: str, flag: str = "--set") -> tuple[list[str], Any]:
    """Split ``"a.b=value"`` into (``["a", "b"]``, parsed YAML value).

    Parameters
    ----------
    item
        One ``KEY=VALUE`` string; dotted keys address sections.
    flag
        The option the string came from (``--set`` or ``--hw-set``), for error messages.
    """
    shown = short_text(item)
    if "=" not in item:
        raise ConfigError(f"{flag} '{shown}': expected key=value, e.g. {flag} "
                          + ("rounds=5" if flag == "--set" else "waveform.speed_kmh=20"))
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key or any(not part.strip() for part in key.split(".")):
        raise ConfigError(f"{flag} '{shown}': empty key")
    value = parse_yaml_text(raw, f"{flag} '{shown}' value") if raw.strip() else None
    return [part.strip() for part in key.split(".")], value


def apply_overrides(
    data: dict[str, Any], overrides: Iterable[str], flag: str = "--set"
) -> dict[str, Any]:
    """Return a copy of ``data`` with each ``key.sub=value`` override applied.

    ``flag`` names the option in error messages (``--set`` or ``--hw-set``).
    """
    out: dict[str, Any] = _deep_copy(data)
    for item in overrides:
        path, value = parse_override(item, flag)
        node = out
        for part in path[:-1]:
            child = node.get(part)
            if child is None:
                child = {}
                node[part] = child
            if not isinstance(child, dict):
                raise ConfigError(
                    f"{flag} '{short_text(item)}': '{part}' is a value "
                    f"({short_repr(child)}), not a section"
                )
            node = child
        node[path[-1]] = value
    return out


def _deep_copy(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, Mapping) else v for k, v in data.items()}


def _loc(parts: Iterable[Any]) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


def _format_one(err: Any, what: str) -> str:
    loc = _loc(err["loc"])
    msg = err["msg"]
    given = short_repr(err.get("input"))
    if err["type"] == "extra_forbidden":
        return f"{what} key '{loc}': unknown key (value {given})"
    if err["type"] == "value_error":
        msg = msg.removeprefix("Value error, ")
        if not err["loc"]:
            return f"{what}: {msg}"
        return f"{what} key '{loc}': got {given}; {msg}"
    ctx = err.get("ctx") or {}
    allowed = f" (allowed: {short_text(str(ctx['expected']))})" if "expected" in ctx else ""
    hint = ""
    if err["type"] in ("int_type", "float_type", "finite_number"):
        value = err.get("input")
        if isinstance(value, bool):
            hint = " (true/false is not a number)"
        elif isinstance(value, str):
            hint = " (a number, written without quotes)"
    return f"{what} key '{loc}': got {given}; {msg}{allowed}{hint}"


def _format_validation_error(exc: ValidationError, what: str) -> str:
    errors = exc.errors()
    lines = [_format_one(err, what) for err in errors[:MAX_ERRORS_SHOWN]]
    if len(errors) > MAX_ERRORS_SHOWN:
        lines.append(f"... and {len(errors) - MAX_ERRORS_SHOWN} more errors")
    return "\n".join(lines)


def validate(
    model: type[M], data: Mapping[str, Any], what: str = "config",
    context: Mapping[str, Any] | None = None,
) -> M:
    """Validate ``data`` into ``model``, raising :class:`ConfigError` with readable text.

    ``context``: pydantic's validation context, for validators that name more than a key
    (e.g. the file, :data:`~testbed.core.config.hardware.SOURCE_CONTEXT_KEY`).
    """
    try:
        return model.model_validate(dict(data), context=None if context is None else dict(context))
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
        data = _merge(data, _read_nonempty(path, "config file",
                                           "run without CONFIG for the default experiment"))
    data = apply_overrides(data, overrides)
    return validate(ExperimentConfig, data, "config")


def _read_nonempty(path: str | Path, what: str, hint: str) -> dict[str, Any]:
    """:func:`read_yaml_mapping`, refusing a file with no keys (empty, only comments, or
    ``{}``): it would silently run with every default."""
    data = read_yaml_mapping(path, what)
    if not data:
        raise ConfigError(
            f"{what} '{short_text(str(path), 300)}' is empty; allowed: a YAML mapping with at "
            f"least one key ({hint})"
        )
    return data


def _merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    out = _deep_copy(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def hw_config_dir() -> Path:
    """The folder of named hardware configs: ``$TESTBED_HW_CONFIG_DIR`` or the checkout's.

    Raises
    ------
    ConfigError
        When the folder does not exist, saying where it looked.
    """
    env = os.environ.get(HW_CONFIG_ENV)
    folder = Path(env) if env else HW_CONFIG_DIR
    if not folder.is_dir():
        source = f"${HW_CONFIG_ENV}" if env else "beside the installed package"
        raise ConfigError(
            f"hardware configs folder not found: looked in '{folder}' ({source}); set "
            f"{HW_CONFIG_ENV} to the folder holding sim.yaml, or give hw_config as a YAML path"
        )
    return folder


def resolve_hw_config_path(name_or_path: str, key: str = "config key 'hw_config'") -> Path:
    """Map ``sim`` to ``<hw_configs>/sim.yaml``; pass paths through.

    A bare name (letters, digits, ``-``, ``_``) is looked up in :func:`hw_config_dir`
    whatever the working directory; anything else (``my/hw.yaml``, ``./hw``) is a path,
    relative to the working directory. ``key`` names the setting in errors.
    """
    text = str(name_or_path)
    if not _BARE_NAME.fullmatch(text):
        if not text.strip():
            raise ConfigError(f"{key}: got {text!r}; allowed: a hardware config name or path")
        return Path(text)
    folder = hw_config_dir()
    path = folder / f"{text}.yaml"
    if path.is_file():
        return path
    if Path(text).is_file():
        return Path(text)
    known = sorted(p.stem for p in folder.glob("*.yaml"))
    raise ConfigError(
        f"{key}: got {short_repr(text)}; allowed: a YAML path or one of {known} "
        f"(in {folder})"
    )


def load_hardware(name_or_path: str | Path, overrides: Iterable[str] = ()) -> HardwareConfig:
    """Load a hardware config by name (``sim``) or path, then ``--hw-set`` overrides.

    Parameters
    ----------
    name_or_path
        A name in the hardware configs folder (``sim``, ``lab_ota``, ``darkroom``) or a
        path to a YAML file.
    overrides
        ``KEY=VALUE`` strings as given to ``--hw-set``, dotted keys for sections
        (``waveform.speed_kmh=20``). Errors name ``--hw-set`` and the
        ``hardware config key '...'``.
    """
    path = resolve_hw_config_path(str(name_or_path))
    data = apply_overrides(_read_nonempty(path, "hardware config file",
                                          "e.g. hw_configs/sim.yaml"), overrides, "--hw-set")
    data = include_calibration(data, path)
    return validate(HardwareConfig, data, "hardware config",
                    context={SOURCE_CONTEXT_KEY: str(path)})


def include_calibration(data: dict[str, Any], path: Path) -> dict[str, Any]:
    """``data`` with its ``calibration: CAL.yaml`` include replaced by the file's content.

    The path is relative to the hardware config's own file ``path`` (absolute paths are
    kept); the embedded mapping gets ``source``, the file it came from. A ``calibration``
    that is already a mapping (a resolved config written by a run) or null is left alone.

    Raises
    ------
    ConfigError
        The file is missing, is not YAML, or holds no mapping; the message names the key
        ``calibration``, the value and the file looked for.
    """
    value = data.get("calibration")
    if not isinstance(value, str):
        return data
    if not value.strip():
        raise ConfigError("hardware config key 'calibration': got ''; allowed: the path of a "
                          "file written by testbed radio calibrate --out, or null")
    target = Path(value).expanduser()
    if not target.is_absolute():
        target = path.resolve().parent / target
    if not target.is_file():
        raise ConfigError(
            f"hardware config key 'calibration': got {short_repr(value)}; no such file "
            f"'{target}' (relative paths are read beside '{path}'); allowed: a file written "
            "by testbed radio calibrate --out, or null"
        )
    try:
        cal = read_yaml_mapping(target, "calibration file")
    except ConfigError as exc:
        raise ConfigError(f"hardware config key 'calibration': {exc}") from None
    return {**data, "calibration": {**cal, "source": str(target)}}


def dump_yaml(model: BaseModel) -> str:
    """The resolved config as YAML (every key, defaults included)."""
    return dump_yaml_text(model.model_dump(mode="json"))
