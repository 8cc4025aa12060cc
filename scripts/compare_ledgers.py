#!/usr/bin/env python3
"""Compare two runs' ledgers event for event.

Usage: ``python scripts/compare_ledgers.py A/ledger.jsonl B/ledger.jsonl``

What a run draws from the OS CSPRNG or the clock (nonces, the hash chain's ``prev``,
``writer`` and ``sha256``) is left out; every other field of every line (the header's
config pin, each upload's mechanism, sigma, alpha, sampling rate, channel credit, ...) must
be equal. Exit code 0 when the ledgers hold the same events in the same order, 1 otherwise
(the first differing lines are printed).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

#: Fields that differ between two runs of one config by design.
VOLATILE = frozenset({"nonce", "prev", "writer", "sha256"})


def events(path: Path) -> list[dict[str, Any]]:
    """Every line of the ledger at ``path`` without its volatile fields."""
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            out.append({k: v for k, v in json.loads(line).items() if k not in VOLATILE})
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    a, b = (events(Path(p)) for p in argv)
    differ = [(i, x, y) for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y]
    for i, x, y in differ[:5]:
        keys = sorted(k for k in set(x) | set(y) if x.get(k) != y.get(k))
        print(f"line {i + 1}: " + ", ".join(f"{k}: {x.get(k)!r} != {y.get(k)!r}" for k in keys))
    if len(a) != len(b):
        print(f"{len(a)} lines against {len(b)}")
    if differ or len(a) != len(b):
        return 1
    print(f"the same {len(a)} lines (header and events), event for event")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
