"""What each control-plane message carries (:mod:`testbed.core.transport.protocol`): the field kinds
of every message type (:data:`SCHEMAS`), its payload (:data:`PAYLOADS`), the limits on field
values, and :class:`ProtocolError`, raised for any message that breaks them."""

from __future__ import annotations

#: Largest model accepted (parameters); bounds payload allocations.
MAX_PARAMS = 50_000_000
#: Largest upload accepted (complex symbols).
MAX_SYMBOLS = 50_000_000
#: Largest device id / round index accepted.
MAX_DEVICE = 1_000_000
MAX_ROUND = 100_000_000
#: Largest burst air time (s) and timing uncertainty (s) a ``tx_report`` may state.
MAX_AIRTIME_S = 3600.0
MAX_TIMING_UNCERTAINTY_S = 1.0
#: Largest mean burst power (W) a ``tx_report`` may state (the hardware config's bound).
MAX_TX_POWER_W = 100.0
#: Fields of a ``round``'s ``aircomp`` (all floats; ``alpha`` as real and imaginary parts).
AIRCOMP_ROUND_KEYS = ("alpha_re", "alpha_im", "amplitude", "signal_power")
#: Fields of an ``upload``'s ``tx_report`` (what the edge's transmitter did; seconds, watts).
#: ``slack_s``: how long before ``tx_time`` the radio had the whole burst (the part of the
#: slot's lead the hand-over left; negative when late), for the next round's lead.
TX_REPORT_KEYS = ("airtime_s", "tx_power_w", "tx_time_usrp_s", "timing_uncertainty_s",
                  "slack_s")
#: Largest ``tx_report.slack_s`` magnitude (s): an edge refuses bursts due further ahead.
MAX_SLACK_S = 60.0
#: Secure aggregation (:mod:`testbed.core.secagg`) on the wire, in lower-case hex digits:
#: an X25519 public key (32 bytes), an AES-GCM nonce (12 bytes), an encrypted pair of Shamir
#: ordinates (2 x 66 bytes plus the 16-byte tag) and one Shamir ordinate (66 bytes).
SECAGG_KEY_HEX = 64
SECAGG_NONCE_HEX = 24
SECAGG_CIPHERTEXT_HEX = 296
SECAGG_ORDINATE_HEX = 132

#: The kinds of a field in the schemas below (checked by
#: :func:`testbed.core.transport.protocol_checks.kind_ok`).
INT = "int"
FLOAT = "float"
STR = "str"
BOOL = "bool"
DICT = "dict"
LIST = "list"
OPT = "?"  # suffix: the field may be null


class ProtocolError(ValueError):
    """A message that does not follow the protocol (it is dropped, never acted on)."""


#: Field kinds of each message type; every field is required, no other field is allowed.
SCHEMAS: dict[str, dict[str, str]] = {
    # edge -> aggregator: join (or rejoin)
    "hello": {"device": INT, "instance": STR},
    # aggregator -> edge: the run it joins (config, and the secret masks derive from)
    "welcome": {
        "device": INT,
        "run_id": STR,
        "config_yaml": STR,
        "mask_secret": STR,  # sparsification masks derive from it; only sent here
        # the aggregator's radios on a usrp link: "usrp", "virtual" or "emulated" (virtual
        # on the emulation fallback); "" on other links. An edge on virtual radios refuses
        # an aggregator on real ones and the other way round
        "radios": STR,
        "next_round": INT,
    },
    # edge -> aggregator: set up; its shard size and the nonces its ledger holds
    "ready": {"device": INT, "instance": STR, "dataset_size": INT, "nonces": LIST},
    # aggregator -> edge: every upload the aggregator recorded for it (ledger reconciliation)
    "sync": {"device": INT, "events": LIST},
    # aggregator -> edge: train from this model (payload) and upload in this slot
    "round": {
        "device": INT,
        "round": INT,
        "nonce": STR,
        "d": INT,
        "channel": DICT + OPT,  # channel fields the gated event credits (null: none)
        "slot": INT,
        "deadline_s": FLOAT,
        # split usrp link: when the burst is due (start of the device's TDMA slot, s, on the
        # schedule's time base: radio/edge_radio.py); null on simulated links and when
        # await_slot is true
        "tx_time_s": FLOAT + OPT,
        # split usrp link, rounds paced by the edges: train, prepare the burst, say
        # ``upload_ready``, and transmit only at the time a later ``slot`` names
        "await_slot": BOOL,
        # the privacy event the aggregator gated the upload with (its to_dict(), the
        # mechanism's parameters: e.g. 004's l1 clip, Laplace scale and full batch); the
        # edge records its own and refuses when they differ. Null: the aggregator keeps no
        # ledger (no DP)
        "mechanism": DICT + OPT,
        # scheme aircomp on the usrp link: how the device transmits in the shared slot
        # (AIRCOMP_ROUND_KEYS: its pre-equalization alpha = c / h_hat, the common amplitude
        # c, the bound on E|x|^2 its frame is normalised with); null otherwise
        "aircomp": DICT + OPT,
    },
    # edge -> aggregator (await_slot): trained, noised, burst built; nothing journalled or
    # sent yet (n_symbols: the upload's symbols)
    "upload_ready": {"device": INT, "round": INT, "nonce": STR, "n_symbols": INT},
    # aggregator -> edge (await_slot): transmit the prepared burst at tx_time_s (schedule
    # time base); null: no slot this round (not ready by the deadline): drop it, send nothing
    "slot": {"device": INT, "round": INT, "nonce": STR, "tx_time_s": FLOAT + OPT},
    # aggregator -> edge (scheme aircomp, usrp link): send the public pilot frame alone at
    # tx_time_s (schedule time base) so that the receiver estimates this device's path
    "pilot": {"device": INT, "round": INT, "tx_time_s": FLOAT, "n_symbols": INT},
    # edge -> aggregator: one upload; payload = symbols (complex128), or empty (0 bytes)
    # when the symbols went over the radio (on_air)
    "upload": {
        "device": INT,
        "round": INT,
        "nonce": STR,
        "header": DICT,  # UploadHeader.to_dict()
        "n_symbols": INT,
        "symbol_energy": FLOAT,
        "train_loss": FLOAT + OPT,
        "energy_comp_j": FLOAT,
        "energy_comp_source": STR,
        "on_air": BOOL,  # true: the edge transmitted the symbols itself (split usrp link)
        "tx_report": DICT + OPT,  # on_air: TX_REPORT_KEYS of its burst; else null
    },
    # aggregator -> edge: the upload is recorded with these channel fields
    "ack": {"device": INT, "round": INT, "nonce": STR, "channel": DICT + OPT},
    # edge -> aggregator: the edge will not upload (never went on air)
    "refuse": {"device": INT, "round": INT, "nonce": STR, "reason": STR},
    # either way: the run ended (or the edge is going away)
    "leave": {"device": INT, "reason": STR},
    # aggregator -> edge, in answer to anything after the run ended: how it ended and every
    # upload recorded for the device (as in ``sync``); the edge adopts them and exits
    "finished": {"device": INT, "run_id": STR, "reason": STR, "events": LIST},
    # edge -> aggregator: what is your clock? (t_send: the edge's clock when asking, s)
    "clock_req": {"device": INT, "t_send": FLOAT},
    # aggregator -> edge: its clock (t_remote, s) when it answered the request t_send
    "clock": {"device": INT, "t_send": FLOAT, "t_remote": FLOAT},
    # --- 002's secure aggregation (zcdp-secagg), after a ``round`` request; every message
    # names the round and the request's nonce. The aggregator only relays; see docs/lab.md.
    # edge -> aggregator, phase 0: its fresh X25519 public keys (hex)
    "sa_keys": {
        "device": INT, "round": INT, "nonce": STR, "mask_public": STR,
        "channel_public": STR,
    },
    # aggregator -> edge: U1 with every member's keys ({device, mask_public, channel_public})
    # and the Shamir threshold
    "sa_roster": {"device": INT, "round": INT, "nonce": STR, "threshold": INT, "keys": LIST},
    # edge -> aggregator, phase 1: its shares for every other member of U1, encrypted for
    # the recipient ({recipient, nonce, ciphertext}, hex)
    "sa_shares": {"device": INT, "round": INT, "nonce": STR, "shares": LIST},
    # aggregator -> edge: U2 and the ciphertexts addressed to this device ({sender, nonce,
    # ciphertext})
    "sa_inbox": {
        "device": INT, "round": INT, "nonce": STR, "participants": LIST, "shares": LIST,
    },
    # edge -> aggregator, phase 2: the masked update; payload = d uint64 residues
    "sa_masked": {
        "device": INT, "round": INT, "nonce": STR, "d": INT, "train_loss": FLOAT + OPT,
        "energy_comp_j": FLOAT, "energy_comp_source": STR,
    },
    # aggregator -> edge: whose masked input arrived (U3) and who dropped (U2 \ U3)
    "sa_unmask_req": {
        "device": INT, "round": INT, "nonce": STR, "received": LIST, "dropped": LIST,
    },
    # edge -> aggregator, phase 3: [owner, x, y (hex)] shares of the self-mask seeds of U3
    # and of the mask keys of the dropped
    "sa_unmask": {
        "device": INT, "round": INT, "nonce": STR, "self_mask_shares": LIST,
        "mask_key_shares": LIST,
    },
    # aggregator -> edge: this device takes no further part in the round (it was left out,
    # or the round was abandoned)
    "sa_abort": {"device": INT, "round": INT, "nonce": STR, "reason": STR},
}

#: Payload each type carries: None, "float64" (d values), "complex128" (n_symbols) or
#: "uint64" (d residues).
PAYLOADS: dict[str, str | None] = {
    "hello": None,
    "welcome": None,
    "ready": None,
    "sync": None,
    "round": "float64",
    "pilot": None,
    "upload_ready": None,
    "slot": None,
    "upload": "complex128",
    "ack": None,
    "refuse": None,
    "leave": None,
    "finished": None,
    "clock_req": None,
    "clock": None,
    "sa_keys": None,
    "sa_roster": None,
    "sa_shares": None,
    "sa_inbox": None,
    "sa_masked": "uint64",
    "sa_unmask_req": None,
    "sa_unmask": None,
    "sa_abort": None,
}

#: Longest string field (characters) and longest list field (items) a message may hold.
MAX_STR = 1_000_000
MAX_LIST = 10_000_000
