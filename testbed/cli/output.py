"""How a ``testbed`` command prints its result: one JSON object, or lines for a person."""

from __future__ import annotations

import json
from typing import Any


def emit(result: dict[str, Any], as_json: bool, lines: list[str]) -> None:
    """Print ``result`` as one JSON object (keys sorted) when ``as_json``, else ``lines``."""
    if as_json:
        print(json.dumps(result, sort_keys=True))
    else:
        print("\n".join(lines))
