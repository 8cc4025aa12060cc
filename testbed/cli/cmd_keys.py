"""``testbed keys``: create the CurveZMQ keys of the lab control plane.

Writes the aggregator's key pair, one key pair per device and the allow-list
(:func:`testbed.core.transport.curve_keys.generate_keys`), then says which files go to which host.
Never overwrites keys. Exit code: 0 written, 2 bad input (existing keys, bad N, a
directory that cannot be written).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from testbed.cli.overrides import PathOption
from testbed.core.transport.curve_keys import MAX_DEVICES, KeySet, generate_keys


def register(sub: Any) -> None:
    """Add the ``keys`` subcommand."""
    p = sub.add_parser(
        "keys",
        help="create CurveZMQ key pairs for the aggregator and the devices, and the allow-list",
        description=(
            "Create the CurveZMQ keys of the lab control plane in DIR: aggregator.key and "
            "aggregator.key_secret, device-{i}.key and device-{i}.key_secret for each "
            "device, and allowed/ holding the device public keys. Existing keys are never "
            "overwritten. Secret files are mode 0600: copy each only to its own host, over "
            "a secure channel. Exit code: 0 written, 2 bad input."
        ),
    )
    p.add_argument("--out", action=PathOption, required=True, metavar="DIR",
                   help="keys directory (created if missing; must not hold keys yet)")
    p.add_argument("--devices", type=int, required=True, metavar="N",
                   help=f"number of edge devices, 1..{MAX_DEVICES} (ids 0..N-1)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.set_defaults(func=_keys)


def _host_plan(keys: KeySet) -> dict[str, list[str]]:
    """Host name -> the paths to copy there."""
    plan = {
        "aggregator": [
            f"{p}/" if p == keys.allowed_dir else str(p) for p in keys.aggregator_host_files()
        ]
    }
    for i in range(keys.devices):
        plan[f"device-{i}"] = [str(p) for p in keys.device_host_files(i)]
    return plan


def _keys(args: argparse.Namespace) -> int:
    try:
        keys = generate_keys(args.out, args.devices)
    except ValueError as exc:
        print(f"testbed keys: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"testbed keys: error: cannot write to '{args.out}': {exc}", file=sys.stderr)
        return 2
    plan = _host_plan(keys)
    if args.json:
        print(json.dumps({
            "out": str(keys.out_dir),
            "devices": keys.devices,
            "aggregator": {
                "public": str(keys.aggregator_public),
                "secret": str(keys.aggregator_secret),
                "allowed_dir": str(keys.allowed_dir),
            },
            "device_public": [str(p) for p in keys.device_public],
            "device_secret": [str(p) for p in keys.device_secret],
            "hosts": plan,
        }))
        return 0
    print(f"testbed keys: wrote the aggregator's and {keys.devices} devices' key pairs to "
          f"{keys.out_dir}")
    print(f"  aggregator public key  {keys.aggregator_public}")
    print(f"  aggregator secret key  {keys.aggregator_secret}  (mode 0600)")
    print(f"  allow-list             {keys.allowed_dir}/  ({keys.devices} device public keys)")
    print(f"  device i key pair      {keys.out_dir}/device-{{i}}.key, "
          "device-{i}.key_secret (mode 0600)")
    print("copy to each host (secret files over a secure channel, to their own host only):")
    for host, paths in plan.items():
        print(f"  {host} host: {', '.join(paths)}")
    return 0
