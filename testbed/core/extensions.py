"""A lab's own model and data set, named in the config by an import string.

``model: package.module:factory`` and ``dataset: package.module:loader`` (besides the
built-in names) are imported where the model is built and the data loaded, in every process
of a run: ``testbed run``, the aggregator and each edge of ``testbed launch``, every sweep
cell. The signatures (docs/extensions.md):

* ``factory(input_shape: tuple[int, ...], n_classes: int) -> torch.nn.Module``, called with
  torch's RNG seeded from the run's MODEL_INIT stream (every process builds the same
  initial weights);
* ``loader(data_dir: str | None) -> (x_train, y_train, x_test, y_test)``: numpy arrays, the
  samples of any shape ``(n, ...)`` (float or integer), integer labels ``0..K-1``.

Where the module is looked for: ``sys.path`` of the process, with ``extensions_path``'s
directories put first. ``python -m testbed ...`` has its current directory on ``sys.path``,
so a module under the directory a command runs from imports (``testbed launch`` and sweep
cells start their processes from that same directory); an edge on another host needs the
module installed there or on its own path.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from testbed.core.data.datasets import Dataset
from testbed.core.data.from_torch import dataset_arrays, is_map_dataset

#: ``package.module:attribute``: dotted Python identifiers on both sides of one ``:``.
IMPORT_PATTERN = re.compile(
    r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*"
    r"(\.[A-Za-z_][A-Za-z0-9_]*)*"
)

#: How each key's import string is called, for error messages.
SIGNATURES = {
    "model": "factory(input_shape: tuple[int, ...], n_classes: int) -> torch.nn.Module",
    "dataset": (
        "loader(data_dir: str | None) -> (x_train, y_train, x_test, y_test) numpy arrays"
    ),
    "scheme": "class Name(testbed.core.scheme_api.Scheme) with base = a built-in scheme",
}


class ExtensionError(ValueError):
    """An import string that cannot be imported, or whose object misbehaves; the message
    names the config key, the string and what went wrong."""


def is_import_string(value: str) -> bool:
    """Whether a ``model`` / ``dataset`` value is an import string (it holds a ``:``)."""
    return ":" in value


def check_import_syntax(key: str, value: str, builtins: Sequence[str]) -> None:
    """Refuse a value that is neither a built-in name nor ``package.module:attr``.

    Raises
    ------
    ValueError
        Saying what is allowed (pydantic prefixes the key and the value).
    """
    if value in builtins or IMPORT_PATTERN.fullmatch(value):
        return
    what = "factory" if key == "model" else "loader"
    raise ValueError(
        f"allowed: one of {', '.join(repr(b) for b in builtins)}, or an import string "
        f"'package.module:{what}' (dotted Python names, one ':'), e.g. "
        f"'examples.iq_modulation:{key if key == 'model' else 'loader'}'"
    )


def absolute_paths(paths: Sequence[str]) -> list[str]:
    """``extensions_path`` entries as stored: each expanded and made absolute against the
    current directory.

    Raises
    ------
    ValueError
        An empty entry.
    """
    out = []
    for p in paths:
        if not p:
            raise ValueError("allowed: directory paths (an empty string is not one)")
        out.append(str(Path(p).expanduser().absolute()))
    return out


def add_search_path(paths: Sequence[str]) -> None:
    """Put ``paths`` (``extensions_path``) first on ``sys.path``, each once, in order."""
    for p in reversed([str(x) for x in paths]):
        if p in sys.path:
            sys.path.remove(p)
        sys.path.insert(0, p)


def namespace_dirs(module: Any) -> list[str]:
    """The directories of ``module`` when it is a namespace package (a directory without
    ``__init__.py`` that Python imports as a package with no code); ``[]`` for a module or
    a regular package."""
    spec = getattr(module, "__spec__", None)
    locations = getattr(spec, "submodule_search_locations", None)
    if getattr(module, "__file__", None) is not None or locations is None:
        return []
    return list(dict.fromkeys(str(Path(d).resolve()) for d in locations))


def namespace_shadow(name: str, module: Any, missing: str, attr: str) -> str:
    """Why an import string that reached the namespace package ``module`` (imported as
    ``name``) found nothing, and what to do.

    Parameters
    ----------
    name
        The dotted name the namespace package was imported as (``mylab``).
    module
        That namespace package.
    missing
        What was looked for in it and not found (a submodule or the attribute).
    attr
        The import string's attribute (after the ``:``), for the suggested fix.

    Returns
    -------
    str
        The folder that took the name of the module the user meant, and the ways out:
        rename it, put the module's directory in ``extensions_path``, or name a file of the
        folder through it (its ``.py`` files listed).
    """
    dirs = namespace_dirs(module)
    files = sorted({f.stem for d in dirs for f in Path(d).glob("*.py")
                    if f.stem.isidentifier() and f.stem != "__init__"})
    inside = (f"; or, if the code is a file of that folder, name it through the folder, e.g. "
              f"'{name}.{files[0]}:{attr}' (its .py files: {', '.join(files[:5])}"
              f"{', ...' if len(files) > 5 else ''})" if files else "")
    leaf = name.rsplit(".", 1)[-1]
    return (f"{name!r} resolved to a namespace package at {' and '.join(dirs)} (a directory "
            f"without __init__.py; it holds no {missing!r}): no module {leaf}.py or package "
            f"with an __init__.py of that name is on this process's path (extensions_path, "
            f"then sys.path), so the folder took the name of, and shadows, the module you "
            f"meant. Rename the folder, or list the directory holding {leaf}.py in "
            f"extensions_path (import strings take dotted module names, not file "
            f"paths){inside}")


def _deepest_namespace(module_name: str) -> tuple[str, Any]:
    """The longest prefix of ``module_name`` imported as a namespace package, and that
    package (``("", None)`` when there is none)."""
    parts = module_name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:i])
        module = sys.modules.get(prefix)
        if module is not None and namespace_dirs(module):
            return prefix, module
    return "", None


def resolve(key: str, spec: str, paths: Sequence[str] = ()) -> Any:
    """The object ``spec`` (``package.module:attr``) names, imported.

    Raises
    ------
    ExtensionError
        The module does not import, or has no such attribute (named, with the rule for
        where modules are looked for).
    """
    module_name, _, attr = spec.partition(":")
    add_search_path(paths)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any failure of the user's module is reported
        top_name = module_name.split(".")[0]
        top = sys.modules.get(top_name)
        found = getattr(top, "__file__", None) or list(getattr(top, "__path__", []))
        ns_name, ns = _deepest_namespace(module_name)
        gone = exc.name or "" if isinstance(exc, ModuleNotFoundError) else ""
        # Only a module of the string itself missing inside the folder, not a module that
        # the user's own code imports.
        if (ns is not None and gone.startswith(f"{ns_name}.")
                and f"{module_name}.".startswith(f"{gone}.")):
            missing = gone[len(ns_name) + 1:].split(".")[0]
            raise ExtensionError(
                f"{key}: {spec!r}: cannot import module {module_name!r}: "
                f"{namespace_shadow(ns_name, ns, missing, attr)}"
            ) from exc
        if top is not None and found:
            shadow = (f" (package {top_name!r} was found at {found}: another package of that "
                      "name may shadow yours)")
        else:
            shadow = ""
        raise ExtensionError(
            f"{key}: {spec!r}: cannot import module {module_name!r} "
            f"({type(exc).__name__}: {exc}){shadow}. Every process of a run imports it: run the "
            "command from the directory that holds the package, list that directory in "
            "extensions_path, or install the package (on every edge host too)"
        ) from exc
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            if namespace_dirs(module):
                raise ExtensionError(
                    f"{key}: {spec!r}: {namespace_shadow(module_name, module, part, attr)}"
                ) from None
            raise ExtensionError(
                f"{key}: {spec!r}: module {module_name!r} ({getattr(module, '__file__', '?')})"
                f" has no attribute {attr!r}"
            ) from None
    if not callable(obj):
        raise ExtensionError(
            f"{key}: {spec!r} is a {type(obj).__name__}, not callable; expected "
            f"{SIGNATURES[key]}"
        )
    return obj


def build_user_model(spec: str, input_shape: tuple[int, ...], n_classes: int,
                     paths: Sequence[str] = ()) -> Any:
    """Call the factory ``spec`` names (torch's RNG already seeded by the caller).

    Parameters
    ----------
    spec
        ``package.module:factory``.
    input_shape
        One sample's shape, e.g. ``(2, 64)``.
    n_classes
        Number of labels K (logits per sample).
    paths
        ``extensions_path``.

    Returns
    -------
    torch.nn.Module
        The model.

    Raises
    ------
    ExtensionError
        Import failure, a factory that raises, or one that does not return a
        ``torch.nn.Module``.
    """
    from torch import nn

    factory: Callable[..., Any] = resolve("model", spec, paths)
    try:
        model = factory(tuple(int(x) for x in input_shape), int(n_classes))
    except Exception as exc:  # noqa: BLE001
        raise ExtensionError(
            f"model: {spec!r}: the factory raised {type(exc).__name__}: {exc} (called as "
            f"{SIGNATURES['model']} with input_shape={tuple(input_shape)}, "
            f"n_classes={n_classes})"
        ) from exc
    if not isinstance(model, nn.Module):
        raise ExtensionError(
            f"model: {spec!r}: the factory returned a {type(model).__name__}, not a "
            f"torch.nn.Module; expected {SIGNATURES['model']}"
        )
    return model


def _check_split(spec: str, split: str, x: Any, y: Any,
                 required: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """``(x float32, y int64)`` of one split, checked (``required``: it must hold samples)."""
    where = f"dataset: {spec!r}: {split} split:"
    if not isinstance(x, np.ndarray) or not isinstance(y, np.ndarray):
        raise ExtensionError(
            f"{where} x_{split} and y_{split} must be numpy arrays, got "
            f"{type(x).__name__} and {type(y).__name__}"
        )
    if x.ndim < 2:
        raise ExtensionError(
            f"{where} x_{split} has shape {x.shape}; expected (n_samples, ...) with at least "
            "one sample dimension"
        )
    if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
        raise ExtensionError(f"{where} x_{split} has dtype {x.dtype}; allowed: float or integer")
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise ExtensionError(
            f"{where} y_{split} has shape {y.shape} and dtype {y.dtype}; expected integer "
            "labels of shape (n_samples,)"
        )
    if len(x) != len(y):
        raise ExtensionError(f"{where} {len(x)} samples but {len(y)} labels")
    if len(y) == 0 and required:
        raise ExtensionError(f"{where} no samples")
    if len(y) and y.min() < 0:
        raise ExtensionError(f"{where} label {int(y.min())} < 0; labels are 0..K-1")
    xf = x.astype(np.float32)
    if not np.isfinite(xf).all():
        raise ExtensionError(f"{where} x_{split} holds non-finite values (nan or inf)")
    return xf, y.astype(np.int64)


def load_user_dataset(spec: str, data_dir: str | None, paths: Sequence[str] = (),
                      required: Sequence[str] = ("train", "test")) -> Dataset:
    """Call the loader ``spec`` names and check what it returns.

    Parameters
    ----------
    spec
        ``package.module:loader``.
    data_dir
        Passed to the loader as it is (``data_dir`` of the config, or an edge's
        ``--data-dir``); ``None`` when not set.
    paths
        ``extensions_path``.
    required
        The splits that must hold samples (the others may be empty: an edge's own shard
        needs no test split, an aggregator no training split).

    Returns
    -------
    testbed.core.data.datasets.Dataset
        ``x`` as ``float32`` ``(n, ...)`` (as returned, not normalised), ``y`` ``int64``
        ``(n,)``, ``n_classes`` = the largest label over both splits + 1.

    Raises
    ------
    ExtensionError
        Import failure, a loader that raises, or arrays of the wrong kind, shape or labels.
    """
    loader: Callable[..., Any] = resolve("dataset", spec, paths)
    try:
        out = loader(data_dir)
    except Exception as exc:  # noqa: BLE001
        raise ExtensionError(
            f"dataset: {spec!r}: the loader raised {type(exc).__name__}: {exc} (called as "
            f"{SIGNATURES['dataset']} with data_dir={data_dir!r})"
        ) from exc
    if (isinstance(out, tuple | list) and len(out) == 2
            and all(is_map_dataset(o) for o in out)):  # (train, test) torch Datasets
        try:
            out = (*dataset_arrays(out[0], "train"), *dataset_arrays(out[1], "test"))
        except ValueError as exc:
            raise ExtensionError(f"dataset: {spec!r}: {exc}") from None
    if not isinstance(out, tuple | list) or len(out) != 4:
        raise ExtensionError(
            f"dataset: {spec!r}: the loader returned a {type(out).__name__}; expected a tuple "
            "(x_train, y_train, x_test, y_test) of numpy arrays, or (train, test) map-style "
            "torch Datasets of (sample, label) items"
        )
    x_train, y_train = _check_split(spec, "train", out[0], out[1], "train" in required)
    x_test, y_test = _check_split(spec, "test", out[2], out[3], "test" in required)
    if not len(x_train):  # an empty split takes the other's sample shape
        x_train = np.zeros((0, *x_test.shape[1:]), dtype=np.float32)
    if not len(x_test):
        x_test = np.zeros((0, *x_train.shape[1:]), dtype=np.float32)
    if x_train.shape[1:] != x_test.shape[1:]:
        raise ExtensionError(
            f"dataset: {spec!r}: sample shapes differ: train {x_train.shape[1:]}, test "
            f"{x_test.shape[1:]}"
        )
    n_classes = int(max(y.max() for y in (y_train, y_test) if len(y))) + 1
    return Dataset(spec, x_train, y_train, x_test, y_test, n_classes)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _version(module_name: str) -> str | None:
    """The top package's ``__version__``, else its installed distribution's version."""
    top = module_name.split(".")[0]
    version = getattr(sys.modules.get(top), "__version__", None)
    if isinstance(version, str):
        return version
    try:
        return importlib.metadata.version(top)
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None


def extension_facts(model: str, dataset: str, paths: Sequence[str] = (),
                    scheme: str | None = None) -> dict[str, Any]:
    """What ``meta.json`` records of the import strings among ``model``, ``dataset`` and
    ``scheme`` (``scheme_class``, ``None`` for a built-in):
    ``{key: {"import", "file", "version", "sha256"}}`` (``{}`` for built-in names).

    Raises
    ------
    ExtensionError
        A string that does not import.
    """
    facts: dict[str, Any] = {}
    for key, spec in (("model", model), ("dataset", dataset), ("scheme", scheme or "")):
        if not is_import_string(spec):
            continue
        resolve(key, spec, paths)
        module_name = spec.partition(":")[0]
        module = sys.modules[module_name]
        file = getattr(module, "__file__", None)
        facts[key] = {
            "import": spec,
            "file": str(Path(file).resolve()) if file else None,
            "version": _version(module_name),
            "sha256": _sha256(Path(file)) if file and Path(file).is_file() else None,
        }
    return facts
