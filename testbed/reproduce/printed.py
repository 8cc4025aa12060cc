"""What 003 prints: Table I and the claims of Fig. 2 and Fig. 3 (``../shared/seeds/003``).

These are the paper's numbers, quoted so that a report can put them next to what a run
measured. Nothing here is used to choose a setting or to tune a run.
"""

from __future__ import annotations

#: Table I of 003: test accuracy (%) per (epsilon, scheme, data set). DP-FedAvg is the
#: testbed's ``ldp-fedavg``.
TABLE1: dict[tuple[float, str], dict[str, float]] = {
    (1.8, "ldp-fedavg"): {"mnist": 89.52, "cifar10": 54.20},
    (1.8, "channel-dp"): {"mnist": 89.52, "cifar10": 54.20},
    (1.8, "s-dp-fl"): {"mnist": 91.84, "cifar10": 63.38},
    (1.8, "ee-dp-fl"): {"mnist": 94.82, "cifar10": 67.13},
    (5.0, "ldp-fedavg"): {"mnist": 91.12, "cifar10": 68.31},
    (5.0, "channel-dp"): {"mnist": 91.12, "cifar10": 68.31},
    (5.0, "s-dp-fl"): {"mnist": 93.60, "cifar10": 71.60},
    (5.0, "ee-dp-fl"): {"mnist": 96.87, "cifar10": 74.12},
}

#: Names the paper uses for the testbed's schemes (and the source paper of each peer).
PAPER_NAMES: dict[str, str] = {
    "ldp-fedavg": "DP-FedAvg (003)",
    "channel-dp": "Channel-DP (003)",
    "s-dp-fl": "S-DP-FL (003)",
    "ee-dp-fl": "EE-DP-FL (003)",
    "dp-pasgd": "DP-PASGD (000)",
    "zcdp-secagg": "zCDP + SecAgg (002)",
    "fedsgd-dpc": "FedSGD-DPC (004)",
    "aircomp": "over-the-air aggregation, distributed DP (this testbed; not in 003)",
}

#: The printed epsilons of Table I.
TABLE1_EPSILONS: tuple[float, ...] = (1.8, 5.0)

#: Printed claims, quoted (003 Section VI).
CLAIM_FIG2A = (
    "Fig. 2(a): among all DP mechanisms, EE-DP-FL injects the least artificial noise to reach "
    "the same target epsilon; Channel-DP injects less than LDP-FedAvg; S-DP-FL and EE-DP-FL "
    "less than both"
)
CLAIM_FIG2B = (
    "Fig. 2(b): for the same target epsilon, piggyback DP needs a lower SNR than 'Channel "
    "Only' (its epsilon is below Channel Only's at every SNR), AWGN channel"
)
CLAIM_FIG2C = (
    "Fig. 2(c): the same holds under Rayleigh fading (expected epsilon with its spread), and "
    "at the same SNR fading gives a lower expected epsilon than AWGN"
)
CLAIM_FIG3 = (
    "Fig. 3: EE-DP-FL consumes 1.5x-2.5x less energy than the other FL schemes (LDP-FedAvg, "
    "Channel-DP, S-DP-FL) to reach the target training loss"
)
#: Fig. 3's printed range of energy ratios (peer energy / EE-DP-FL energy).
FIG3_RATIO_RANGE: tuple[float, float] = (1.5, 2.5)
