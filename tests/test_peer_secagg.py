"""Pairwise-mask secure aggregation (002, Bonawitz et al.): exact sums, server view, dropouts."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from scipy import stats

from testbed.core.secagg import ProtocolError, SecAggAbortError
from testbed.core.secagg.codec import FixedPointCodec
from testbed.core.secagg.crypto import (
    ShamirShare,
    expand_mask,
    pairwise_seed,
    self_mask_seed,
    shamir_combine,
    shamir_split,
)
from testbed.core.secagg.device import SecAggDevice
from testbed.core.secagg.local_round import run_round
from testbed.core.secagg.messages import ServerView, UnmaskingRequest
from testbed.core.secagg.server import SecAggServer

P_MIN = 1e-4  # per statistical test; the runs are seeded, so the outcome is fixed anyway


def _entropy(seed: int) -> Callable[[int], bytes]:
    return np.random.default_rng(seed).bytes


def _updates(n: int, d: int, seed: int = 0, scale: float = 1.0) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {i: rng.normal(scale=scale, size=d) for i in range(n)}


def _seed_of(view: ServerView, owner: int, threshold: int) -> bytes:
    """What the server reconstructs of ``owner``'s self-mask seed from the replies it got."""
    shares = [s for reply in view.unmasking for j, s in reply.self_mask_shares if j == owner]
    return shamir_combine(shares, threshold=threshold)


# ---------------------------------------------------------------------- exactness


@pytest.mark.parametrize("bits", [64, 32, 16])
def test_sum_is_exact_fixed_point_sum(bits: int) -> None:
    ups = _updates(5, 257, seed=1)
    codec = FixedPointCodec.fit(clip=5.0, summands=5, modulus_bits=bits)
    res = run_round(ups, codec=codec, random_bytes=_entropy(2))
    expected_int = sum(codec.to_signed(codec.encode(u)) for u in ups.values())
    assert np.array_equal(res.integer_total, expected_int)  # bit-exact, wraparound included
    clipped = sum(np.clip(u, -5.0, 5.0) for u in ups.values())
    assert np.max(np.abs(res.total - clipped)) <= 5 * 0.5 / codec.scale + 1e-12
    assert res.included == frozenset(range(5)) and not res.dropped


def test_codec_fit_is_the_largest_safe_power_of_two() -> None:
    for bits, clip, s in [(64, 3.0, 10), (32, 0.7, 7), (16, 100.0, 3)]:
        codec = FixedPointCodec.fit(clip=clip, summands=s, modulus_bits=bits)
        assert s * codec.max_int <= 2 ** (bits - 1) - 1
        bigger = np.floor(clip * codec.scale * 2 + 0.5)
        assert s * bigger > 2 ** (bits - 1) - 1 or bigger > 2**53
        x = np.array([-clip, -clip / 3, 0.0, clip / 7, clip, 10 * clip])
        back = codec.decode(codec.encode(x))
        assert np.all(np.abs(back - np.clip(x, -clip, clip)) <= 0.5 / codec.scale)


def test_overflow_guard_raises() -> None:
    codec = FixedPointCodec(clip=1.0, scale=2.0**12, modulus_bits=16)  # max_int 4096
    assert codec.capacity() == 7  # 7 * 4096 = 28672 < 2^15 = 32768 <= 8 * 4096
    codec.check_summands(7)
    with pytest.raises(ValueError, match=r"summands=8 .* must be < 2\^15"):
        codec.check_summands(8)
    with pytest.raises(ValueError, match="summands=8"):
        run_round(_updates(8, 4), codec=codec, random_bytes=_entropy(0))
    with pytest.raises(ValueError, match="modulus_bits=65"):
        FixedPointCodec(clip=1.0, scale=1.0, modulus_bits=65)
    with pytest.raises(ValueError, match="clip"):
        FixedPointCodec(clip=float("nan"), scale=1.0)
    with pytest.raises(ValueError, match="clip \\* scale"):
        FixedPointCodec(clip=1.0, scale=2.0**15, modulus_bits=16)  # 32768 > 2^15 - 1
    with pytest.raises(ValueError, match="non-finite"):
        codec.encode(np.array([0.0, np.nan]))


# --------------------------------------------------------------- the server's view


def test_view_differs_only_in_masked_inputs_by_the_encoding_difference() -> None:
    """Same entropy, different update of device 0: identical messages except y_0 - y'_0."""
    codec = FixedPointCodec.fit(clip=4.0, summands=4)
    a = _updates(4, 32, seed=3)
    b = dict(a)
    b[0] = np.random.default_rng(99).normal(size=32)
    va = run_round(a, codec=codec, random_bytes=_entropy(7)).view
    vb = run_round(b, codec=codec, random_bytes=_entropy(7)).view
    assert va.keys == vb.keys and va.share_keys == vb.share_keys
    assert va.unmasking == vb.unmasking  # shares are drawn before any update is seen
    ya = {m.device: m.masked for m in va.masked}
    yb = {m.device: m.masked for m in vb.masked}
    for i in range(1, 4):
        assert np.array_equal(ya[i], yb[i])
    assert np.array_equal(codec.sub(ya[0], yb[0]), codec.sub(codec.encode(a[0]),
                                                               codec.encode(b[0])))


def test_update_to_masked_value_is_a_bijection_and_masks_are_uniform() -> None:
    codec = FixedPointCodec(clip=1.0, scale=10.0, modulus_bits=8)
    residues = np.arange(256, dtype=np.uint64)
    for x in (0, 7, 200, 255):  # over all masks, x + M hits every residue exactly once
        assert np.array_equal(np.sort(codec.add(np.full(256, x, np.uint64), residues)), residues)
    for m in expand_mask(bytes(range(32)), 16, 8):  # fixed mask: x -> x + M is a bijection
        masked = codec.add(residues, np.full(256, m, np.uint64))
        assert np.unique(masked).size == 256
        assert np.array_equal(codec.sub(masked, np.full(256, m, np.uint64)), residues)


def _trial_views(update0: np.ndarray, trials: int, seed: int) -> np.ndarray:
    """Device 0's masked input minus its self-mask (the server learns b_0), over fresh keys."""
    codec = FixedPointCodec.fit(clip=4.0, summands=3)
    ent = _entropy(seed)
    rows = []
    for _ in range(trials):
        ups = {0: update0, 1: np.ones(update0.size), 2: -np.ones(update0.size)}
        res = run_round(ups, codec=codec, random_bytes=ent)
        y0 = next(m.masked for m in res.view.masked if m.device == 0)
        b0 = self_mask_seed(_seed_of(res.view, 0, 2), round_index=0, device=0)
        rows.append(codec.sub(y0, expand_mask(b0, update0.size, 64)))
    return np.concatenate(rows)


def test_masked_input_is_uniform_and_independent_of_the_update() -> None:
    d, trials = 64, 250
    a = _trial_views(np.zeros(d), trials, seed=11)
    b = _trial_views(np.full(d, 4.0) * np.where(np.arange(d) % 2, 1, -1), trials, seed=12)
    n = d * trials  # 16,000 coordinates per update
    for w in (a, b):
        u = (w >> np.uint64(11)).astype(np.float64) * 2.0**-53
        assert stats.kstest(u, "uniform").pvalue > P_MIN
        top = (w >> np.uint64(56)).astype(np.int64)
        assert stats.chisquare(np.bincount(top, minlength=256)).pvalue > P_MIN
        ones = np.array([np.count_nonzero((w >> np.uint64(k)) & np.uint64(1)) for k in range(64)])
        assert np.max(np.abs(ones - n / 2) / np.sqrt(n / 4)) < 5.0  # every bit fair
    ua = (a >> np.uint64(11)).astype(np.float64)
    ub = (b >> np.uint64(11)).astype(np.float64)
    assert stats.ks_2samp(ua, ub).pvalue > P_MIN
    # power control: the same test sees the updates once every mask is stripped
    codec = FixedPointCodec.fit(clip=4.0, summands=3)
    ea = np.tile(codec.encode(np.zeros(d)), 50)
    eb = np.tile(codec.encode(np.full(d, 4.0) * np.where(np.arange(d) % 2, 1, -1)), 50)
    assert stats.ks_2samp((ea >> np.uint64(11)).astype(float),
                          (eb >> np.uint64(11)).astype(float)).pvalue < 1e-10


def test_all_other_participants_colluding_expose_the_update() -> None:
    """The trust assumption is needed: peers' pairwise seeds + b_0 give x_0 back exactly."""
    codec = FixedPointCodec.fit(clip=4.0, summands=3)
    ent = _entropy(5)
    devs = {i: SecAggDevice(i, round_index=0, dimension=8, codec=codec, random_bytes=ent)
            for i in range(3)}
    server = SecAggServer(round_index=0, dimension=8, codec=codec)
    for dev in devs.values():
        server.receive_keys(dev.advertise_keys())
    roster = server.roster()
    for dev in devs.values():
        server.receive_share_keys(dev.share_keys(roster))
    u2, inbox = server.forward_shares()
    for i, dev in devs.items():
        dev.receive_shares(inbox[i], u2)
    x0 = np.linspace(-3, 3, 8)
    for i, dev in devs.items():
        server.receive_masked(dev.masked_update(x0 if i == 0 else np.zeros(8)))
    req = server.unmasking_request()
    for dev in devs.values():
        server.receive_unmasking(dev.reveal_shares(req))
    server.aggregate()
    y0 = server.view.masked[0].masked
    stripped = codec.sub(y0, expand_mask(
        self_mask_seed(_seed_of(server.view, 0, 2), round_index=0, device=0), 8, 64))
    for j in (1, 2):  # what peers 1 and 2 would hand a colluding server
        seed = pairwise_seed(devs[j]._mask_key, roster.keys[0].mask_public,
                             round_index=0, a=j, b=0)
        stripped = codec.sub(stripped, expand_mask(seed, 8, 64))  # device 0 added +PRG
    assert np.array_equal(stripped, codec.encode(x0))


# ------------------------------------------------------------------------ dropouts


def test_drop_after_sending_masked_value_keeps_it_in_the_sum() -> None:
    ups = _updates(5, 40, seed=4)
    codec = FixedPointCodec.fit(clip=6.0, summands=5)
    res = run_round(ups, {1, 3}, codec=codec, random_bytes=_entropy(8))  # t = 3 survivors
    assert res.included == frozenset(range(5)) and not res.dropped
    assert np.allclose(res.total, sum(ups.values()), atol=1e-12)
    assert {r.device for r in res.view.unmasking} == {0, 2, 4}


def test_drop_before_upload_is_excluded_and_its_masks_removed() -> None:
    ups = _updates(6, 40, seed=5)
    codec = FixedPointCodec.fit(clip=6.0, summands=6)
    for self_masks in (True, False):
        res = run_round(ups, codec=codec, dropped_before_upload={2, 5}, self_masks=self_masks,
                        random_bytes=_entropy(9))
        assert res.included == frozenset({0, 1, 3, 4}) and res.dropped == frozenset({2, 5})
        assert np.allclose(res.total, sum(ups[i] for i in (0, 1, 3, 4)), atol=1e-12)
        assert {m.device for m in res.view.masked} == {0, 1, 3, 4}
        for reply in res.view.unmasking:  # never both secrets of one device
            assert {j for j, _ in reply.mask_key_shares} == {2, 5}
            assert not {j for j, _ in reply.self_mask_shares} & {2, 5}


def test_drop_before_keys_leaves_no_trace() -> None:
    ups = _updates(5, 16, seed=6)
    codec = FixedPointCodec.fit(clip=6.0, summands=5)
    res = run_round(ups, codec=codec, dropped_before_keys={0}, random_bytes=_entropy(10))
    assert res.included == frozenset({1, 2, 3, 4})
    assert np.allclose(res.total, sum(ups[i] for i in (1, 2, 3, 4)), atol=1e-12)
    senders = {getattr(m, "device", None) for m in res.view.messages()}
    assert 0 not in senders
    assert all(e.recipient != 0 for m in res.view.share_keys for e in m.shares)


def test_too_many_drops_abort_clearly() -> None:
    ups = _updates(5, 8, seed=7)
    codec = FixedPointCodec.fit(clip=6.0, summands=5)  # t = 3
    with pytest.raises(SecAggAbortError, match="fewer than the threshold t=3"):
        run_round(ups, codec=codec, dropped_before_upload={0, 1, 2}, random_bytes=_entropy(1))
    with pytest.raises(SecAggAbortError, match="answered the unmasking request, fewer than"):
        run_round(ups, {0, 1, 2}, codec=codec, random_bytes=_entropy(1))
    with pytest.raises(SecAggAbortError, match="need 3"):
        run_round(ups, codec=codec, dropped_before_keys={0, 1, 2}, random_bytes=_entropy(1))
    with pytest.raises(ValueError, match="threshold=5"):
        run_round(ups, codec=codec, threshold=5, random_bytes=_entropy(1))


def _started(n: int, self_masks: bool, ent: Callable[[int], bytes], d: int = 8
             ) -> tuple[dict[int, SecAggDevice], SecAggServer]:
    codec = FixedPointCodec.fit(clip=4.0, summands=n)
    devs = {i: SecAggDevice(i, round_index=3, dimension=d, codec=codec,
                            self_masks=self_masks, random_bytes=ent) for i in range(n)}
    server = SecAggServer(round_index=3, dimension=d, codec=codec, self_masks=self_masks)
    for dev in devs.values():
        server.receive_keys(dev.advertise_keys())
    roster = server.roster()
    for dev in devs.values():
        server.receive_share_keys(dev.share_keys(roster))
    u2, inbox = server.forward_shares()
    for i, dev in devs.items():
        dev.receive_shares(inbox[i], u2)
    return devs, server


@pytest.mark.parametrize("self_masks", [True, False])
def test_slow_device_is_exposed_only_without_self_masks(self_masks: bool) -> None:
    """Device 3 is late: the server unmasks without it, then its input arrives."""
    devs, server = _started(4, self_masks, _entropy(21))
    x = {i: np.linspace(-1, 1, 8) * (i + 1) for i in range(4)}
    for i in range(3):
        server.receive_masked(devs[i].masked_update(x[i]))
    req = server.unmasking_request()
    assert req.dropped == frozenset({3})
    for i in range(3):
        server.receive_unmasking(devs[i].reveal_shares(req))
    assert np.allclose(server.aggregate(), x[0] + x[1] + x[2], atol=1e-12)
    server.receive_masked(devs[3].masked_update(x[3]))  # the late arrival
    late = server.view.late[0].masked
    codec, t = server.codec, server.threshold
    key = shamir_combine([s for r in server.view.unmasking for j, s in r.mask_key_shares
                          if j == 3], threshold=t)
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
    sk3 = X25519PrivateKey.from_private_bytes(key)
    stripped = late
    for i in range(3):  # device 3 subtracted PRG(s_i3) for every i < 3
        public = {m.device: m for m in server.view.keys}[i].mask_public
        seed = pairwise_seed(sk3, public, round_index=3, a=3, b=i)
        stripped = codec.add(stripped, expand_mask(seed, 8, 64))
    exposed = np.array_equal(stripped, codec.encode(x[3]))
    assert exposed is (not self_masks)
    # and the honest survivors refuse to be asked again (e.g. for b_3 now)
    again = UnmaskingRequest(3, frozenset(range(4)), frozenset())
    with pytest.raises(ProtocolError, match="cannot reveal shares"):
        devs[0].reveal_shares(again)


def test_honest_device_refuses_bad_requests() -> None:
    devs, server = _started(4, True, _entropy(22))
    with pytest.raises(ProtocolError, match="cannot advertise"):
        devs[0].advertise_keys()
    for i in range(4):
        server.receive_masked(devs[i].masked_update(np.zeros(8)))
    bad = [UnmaskingRequest(3, frozenset({0, 1}), frozenset({1, 2, 3})),  # overlap
           UnmaskingRequest(3, frozenset({1, 2, 3}), frozenset({0})),  # lists itself dropped
           UnmaskingRequest(3, frozenset({0, 1}), frozenset({2})),  # not a partition of U2
           UnmaskingRequest(4, frozenset(range(4)), frozenset())]  # another round
    for req in bad:
        with pytest.raises(ProtocolError):
            devs[0].reveal_shares(req)
    with pytest.raises(ProtocolError, match="below threshold"):
        devs[0].reveal_shares(UnmaskingRequest(3, frozenset({0, 1}), frozenset({2, 3})))


def test_default_entropy_is_fresh_and_seeded_entropy_reproducible() -> None:
    codec = FixedPointCodec.fit(clip=1.0, summands=3)
    a = SecAggDevice(0, round_index=0, dimension=4, codec=codec).advertise_keys()
    b = SecAggDevice(0, round_index=0, dimension=4, codec=codec).advertise_keys()
    assert a.mask_public != b.mask_public and a.channel_public != b.channel_public
    c = SecAggDevice(0, round_index=0, dimension=4, codec=codec,
                     random_bytes=_entropy(1)).advertise_keys()
    e = SecAggDevice(0, round_index=0, dimension=4, codec=codec,
                     random_bytes=_entropy(1)).advertise_keys()
    assert c == e


# -------------------------------------------------------------- building blocks


def test_shamir_any_t_shares_recover_and_fewer_fail() -> None:
    secret = bytes(range(100, 132))
    shares = shamir_split(secret, threshold=3, xs=[1, 2, 5, 9, 11], random_bytes=_entropy(3))
    for subset in ([0, 1, 2], [4, 2, 0], [1, 3, 4], [0, 1, 2, 3, 4]):
        assert shamir_combine([shares[i] for i in subset], threshold=3) == secret
    with pytest.raises(SecAggAbortError, match="2 distinct shares, need 3"):
        shamir_combine([shares[0], shares[1], shares[1]], threshold=3)
    forged = [shares[0], shares[1], ShamirShare(shares[2].x, shares[2].y ^ 1)]
    try:
        out: bytes | None = shamir_combine(forged, threshold=3)
    except SecAggAbortError:  # out of the 32-byte range: detected
        out = None
    assert out != secret


def test_mask_expansion_is_deterministic_and_reduced() -> None:
    s1, s2 = bytes(32), bytes([1]) + bytes(31)
    assert np.array_equal(expand_mask(s1, 1000, 64), expand_mask(s1, 1000, 64))
    assert not np.array_equal(expand_mask(s1, 1000, 64), expand_mask(s2, 1000, 64))
    m12 = expand_mask(s1, 1000, 12)
    assert m12.max() < 2**12 and np.array_equal(m12, expand_mask(s1, 1000, 64) & np.uint64(4095))
    with pytest.raises(ValueError, match="need 32"):
        expand_mask(bytes(16), 4, 64)
