"""The sweep file: a base experiment config, fixed overrides and a grid, validated.

A sweep file is YAML::

    name: eps-vs-scheme            # optional; default: the file's name without .yaml
    base: ../private-fedsgd.yaml   # optional experiment config; relative to THIS file's folder
    set:                           # optional fixed overrides, dotted keys as with --set
      rounds: 5
      train_samples: 2000
    hw_set: {}                     # optional fixed hardware overrides, as with --hw-set
    grid:                          # one list of values per key; every combination is a cell
      scheme: [ldp-fedavg, ee-dp-fl]
      privacy.epsilon: [1.8, 5]
      seed: [0, 1]
    cpus_per_cell: 1               # torch_threads of each cell, and the CPUs Ray reserves for it

Every key of ``set`` and ``grid`` must be a key of the experiment config
(:class:`~testbed.core.config.experiment.ExperimentConfig`), dotted for sections
(``privacy.epsilon``); that is checked here, before any cell is built, and the error lists
the keys allowed. Values are YAML values as ``--set`` would parse them; a mapping is
refused (write the dotted keys instead, so a section is never replaced as a whole).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from testbed.core.config.errors import ConfigError
from testbed.core.config.experiment import NAME_PATTERN, ExperimentConfig
from testbed.core.config.loader import validate
from testbed.core.config.safe_yaml import read_yaml_mapping, short_repr, short_text

#: Most values one grid key may take, and most cells in one sweep.
MAX_VALUES_PER_KEY = 1000
MAX_CELLS = 10_000


def value_text(value: Any) -> str:
    """``value`` as YAML flow text that the ``--set`` parser reads back as the same value.

    JSON is YAML flow syntax (and the project's YAML reader takes ``1e-05`` as a number),
    so this is ``json.dumps`` except for non-finite floats (``.inf``, ``-.inf``, ``.nan``).
    """
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if math.isnan(value) else (".inf" if value > 0 else "-.inf")
    if isinstance(value, list):
        return "[" + ", ".join(value_text(v) for v in value) + "]"
    return json.dumps(value)


def config_keys(model: type[BaseModel] = ExperimentConfig, prefix: str = "") -> dict[str, bool]:
    """Every dotted key of ``model``: ``{key: is_section}`` (sections are sub-models)."""
    out: dict[str, bool] = {}
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out[key] = True
            out.update(config_keys(ann, f"{key}."))
        else:
            out[key] = False
    return out


def check_config_key(key: str, where: str) -> None:
    """Refuse ``key`` unless it is a (non-section) experiment config key.

    Parameters
    ----------
    key
        Dotted key as written in the sweep file (``privacy.epsilon``).
    where
        The sweep section it came from (``grid`` or ``set``), for the message.
    """
    keys = config_keys()
    if keys.get(key) is False:
        return
    if keys.get(key) is True:
        inner = sorted(k for k in keys if k.startswith(f"{key}.") and not keys[k])
        raise ConfigError(
            f"sweep key '{where}.{key}': '{key}' is a section, not a value; use dotted keys "
            f"(allowed: {', '.join(inner)})"
        )
    section = key.rsplit(".", 1)[0] if "." in key else ""
    if section and keys.get(section) is True:
        allowed = sorted(k for k in keys if k.startswith(f"{section}.") and not keys[k])
    else:
        allowed = sorted(k for k in keys if "." not in k and not keys[k])
        allowed += sorted(f"{k}.*" for k in keys if keys[k])
    raise ConfigError(
        f"sweep key '{where}.{key}': not an experiment config key; allowed: "
        f"{', '.join(allowed)}"
    )


class SweepSpec(BaseModel):
    """A validated sweep file (see the module docstring for the format).

    ``base`` is stored as given; :func:`load_sweep` makes it absolute (relative paths are
    taken from the sweep file's folder). ``fixed`` is the file's ``set`` mapping.
    """

    model_config = ConfigDict(
        extra="forbid", frozen=True, strict=True, allow_inf_nan=False
    )

    name: str = Field("sweep", description="label of the sweep (plot title, default --out)")
    base: str | None = Field(
        None, description="experiment config; relative to the sweep file's folder; null = default"
    )
    fixed: dict[str, Any] = Field(default_factory=dict, alias="set")
    hw_set: dict[str, Any] = Field(default_factory=dict)
    grid: dict[str, list[Any]] = Field(min_length=1)
    cpus_per_cell: int = Field(
        1, ge=1, le=256, description="torch_threads per cell (unless set or gridded) and the "
        "CPUs Ray reserves for each cell"
    )

    @field_validator("name")
    @classmethod
    def _plain_name(cls, v: str) -> str:
        if not NAME_PATTERN.fullmatch(v):
            raise ValueError(
                "allowed: a plain file name of 1-100 letters, digits, '-', '_' or '.', not "
                "starting with '.' (it names the default output folder sweeps/<name>)"
            )
        return v

    @field_validator("fixed", "hw_set")
    @classmethod
    def _no_mappings(cls, v: dict[str, Any]) -> dict[str, Any]:
        for key, value in v.items():
            if isinstance(value, dict):
                example = ", ".join(
                    f"{key}.{k}: {short_repr(v, 40)}" for k, v in list(value.items())[:2]
                ) or f"{key}.KEY: VALUE"
                raise ValueError(
                    f"'{key}': got a mapping; write dotted keys instead ({example}), so the "
                    "rest of the section is kept"
                )
        return v

    @field_validator("grid")
    @classmethod
    def _grid_lists(cls, v: dict[str, list[Any]]) -> dict[str, list[Any]]:
        cells = 1
        for key, values in v.items():
            if not values:
                raise ValueError(f"'{key}': an empty list; allowed: a list of 1 or more values")
            if len(values) > MAX_VALUES_PER_KEY:
                raise ValueError(
                    f"'{key}': {len(values)} values; allowed: at most {MAX_VALUES_PER_KEY}"
                )
            seen: set[str] = set()
            for value in values:
                if isinstance(value, dict):
                    raise ValueError(
                        f"'{key}': value {short_repr(value, 80)} is a mapping; allowed: "
                        "numbers, strings, booleans, null or lists (grid dotted keys instead)"
                    )
                text = value_text(value)
                if text in seen:
                    raise ValueError(f"'{key}': value {text} is listed twice")
                seen.add(text)
            cells *= len(values)
        if cells > MAX_CELLS:
            raise ValueError(f"{cells} cells; allowed: at most {MAX_CELLS} in one sweep")
        return v

    @model_validator(mode="after")
    def _keys(self) -> SweepSpec:
        both = sorted(set(self.fixed) & set(self.grid))
        if both:
            raise ValueError(
                f"key {both[0]!r} is in both 'set' and 'grid'; allowed in one of them only"
            )
        return self

    def check_keys(self) -> None:
        """Refuse any ``set`` or ``grid`` key that is not an experiment config key."""
        for key in self.grid:
            check_config_key(key, "grid")
        for key in self.fixed:
            check_config_key(key, "set")


#: What a sweep's ``grid`` looks like, for messages.
GRID_EXAMPLE = "grid: {snr_db: [10, 20]}"


def parse_sweep(
    data: dict[str, Any], root: Path, default_name: str = "sweep", *, source: str = "the sweep"
) -> SweepSpec:
    """Validate a sweep mapping; ``base`` is resolved against ``root`` and must exist.

    Parameters
    ----------
    data
        The sweep file's top-level mapping.
    root
        Folder that a relative ``base`` is taken from (the sweep file's folder).
    default_name
        ``name`` when the mapping has none.
    source
        What the mapping came from, for messages (``sweep file 'x.yaml'``).

    Raises
    ------
    ConfigError
        Naming the key, the value and what is allowed; a mapping without ``grid`` is told
        what one looks like (:data:`GRID_EXAMPLE`).
    """
    data = dict(data)
    if "grid" not in data:
        raise ConfigError(
            f"{source} has no 'grid' section (keys given: "
            f"{', '.join(sorted(map(str, data))) or 'none'}); allowed: a grid mapping each "
            f"experiment config key to a list of values, every combination a cell, e.g. "
            f"{GRID_EXAMPLE}"
        )
    data.setdefault("name", default_name)
    spec = validate(SweepSpec, data, "sweep")
    spec.check_keys()
    if spec.base is not None:
        base = Path(spec.base).expanduser()
        base = base if base.is_absolute() else (root / base)
        if not base.is_file():
            raise ConfigError(
                f"sweep key 'base': got {spec.base!r}; no such file '{base}' (a relative "
                f"base is taken from the sweep file's folder, {root})"
            )
        spec = spec.model_copy(update={"base": str(base.resolve())})
    return spec


def load_sweep(path: str | Path) -> SweepSpec:
    """Read and validate a sweep file; a relative ``base`` is taken from its folder.

    Raises
    ------
    ConfigError
        Naming the key, the value and what is allowed.
    """
    p = Path(path)
    data = read_yaml_mapping(p, "sweep file")
    stem = p.name.removesuffix(".yaml").removesuffix(".yml")
    default = stem if NAME_PATTERN.fullmatch(stem) else "sweep"
    return parse_sweep(data, p.resolve().parent, default,
                       source=f"sweep file '{short_text(str(p), 300)}'")
