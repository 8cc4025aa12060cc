"""``--set`` lists for tests: later values replace earlier ones of the same key.

The CLI refuses a key given twice (a silent override is a user error); tests that extend a
fixture's overrides merge them here instead.
"""

from __future__ import annotations


def merge_sets(*groups: list[str] | tuple[str, ...]) -> list[str]:
    """``KEY=VALUE`` items of ``groups`` in order, one per key, the last value winning.

    Parameters
    ----------
    groups
        Lists of ``KEY=VALUE`` strings, earliest first.

    Returns
    -------
    list of str
        One item per key, in the order each key first appeared.
    """
    merged: dict[str, str] = {}
    for group in groups:
        for item in group:
            key = item.split("=", 1)[0].strip()
            merged[key] = item
    return list(merged.values())
