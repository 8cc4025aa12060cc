"""Record-level private local training: Poisson batches, per-example clipping, DP-SGD.

:class:`RecordTrainer` is the record-level counterpart of
:class:`edge_device.trainer.LocalTrainer` (SEED-NOTES item 9, DESIGN "The unit"). Each of the
H local steps

1. draws a Poisson batch: each of the device's ``D`` examples is included independently
   with probability ``q = B / D`` (``B`` the expected batch size); the realized size varies
   and may be zero (an empty batch is a valid step: the gradient sum is zero);
2. computes every example's gradient, clips it to l2 norm ``C`` and sums
   (:mod:`edge_device.per_example`);
3. adds ``N(0, (noise_multiplier * C)^2 I)`` to the sum when ``noise_multiplier > 0``
   (per-step mode, DP-SGD on the device: one subsampled Gaussian mechanism per step);
4. divides by the *expected* size ``B`` (never the realized one, which depends on the data
   set's size and would leak it) and takes an SGD step ``w -= lr * that``.

``noise_multiplier = 0`` is the upload-noise mode: no noise here, the uplink encoder adds
it once per round. With ``steps = 1`` (FedSGD) the differential is exactly the clipped sum
over ``B``, one example moves it by at most ``C / B``, and the upload is one subsampled
Gaussian mechanism. With ``steps > 1`` and no per-step noise, later steps depend on a record
through the weights and this trainer gives no record-level bound by itself.

:meth:`RecordTrainer.train_laplace` is 004's Laplace reply (FedSGD-DPC): one step over *all*
the device's examples (no sampling), each example's gradient clipped in the **l1** norm to
``xi_1``, the sum divided by ``D_pub`` plus ``Lap(0, s)`` per coordinate from
:func:`edge_device.laplace_noise.laplace_noise` (OS CSPRNG, never seeded). ``D_pub``
(``normaliser``) is a public constant fixed before the run (the device's shard size as
partitioned, recorded in every ledger event and in the summary), never the number of records
the step sees: with it one record added or removed moves the value by at most ``xi_1 / D_pub``
in l1. Dividing by the realized size instead (as this trainer once did) lets one added record
move the value by up to ``2 xi_1 / (D + 1)`` (docs/privacy.md, "The Laplace mechanism's
normaliser").

Randomness:

* **Sampling.** Subsampling amplification may only be credited when the adversary cannot
  know which records were drawn. ``secure_sampling=True`` draws the inclusions from the OS
  CSPRNG (:func:`testbed.core.noise.secure_bernoulli`: the law of a 53-bit uniform below
  ``q``, from about one byte per example per step) and
  refuses a generator. ``secure_sampling=False`` takes a ``numpy`` generator (reproducible
  from the experiment seed); the accountant must then credit no amplification.
* **Noise.** Always :func:`testbed.core.noise.gaussian` (``os.urandom`` + Box-Muller in
  float64), never seeded from anything, in both sampling modes. It costs about 0.8-1 ms of
  CPU per step for d = 21,840 (0.44 ms of it reading ``os.urandom``; about 10 % of a
  record-level step at B = 64 with the default per-example backend), and no faster PRNG
  seeded from the CSPRNG is used. Each step's draw runs in the process's side thread while
  the step before it computes (:class:`edge_device.noise_ahead.NoiseAhead`): with a free
  core it leaves the step's wall time; its CPU time is unchanged.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from edge_device.laplace_noise import laplace_noise
from edge_device.noise_ahead import NoiseAhead
from edge_device.per_example import Backend, ClippedGradientSum
from edge_device.trainer import DeviceData, LocalResult, model_device
from testbed.core.data.coded import CodedImages, float32_images
from testbed.core.models import get_flat, set_flat
from testbed.core.noise import secure_bernoulli


def poisson_sample(
    n: int, rate: float, *, rng: np.random.Generator | None = None
) -> np.ndarray:
    """Indices of a Poisson sample: each of ``n`` items kept independently with ``rate``.

    Parameters
    ----------
    n
        Number of items (``>= 0``).
    rate
        Inclusion probability ``q`` in ``[0, 1]``.
    rng
        ``None``: the inclusions come from the OS CSPRNG (secret sampling, the only kind that
        supports amplification by subsampling). A generator: reproducible draws from it.

    Returns
    -------
    numpy.ndarray
        ``int64``, sorted indices in ``[0, n)``; length ``~ Binomial(n, q)`` (may be 0).
    """
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
        raise ValueError(f"poisson_sample: n={n!r} must be an integer >= 0")
    if not (0.0 <= rate <= 1.0):
        raise ValueError(f"poisson_sample: rate={rate!r} must be in [0, 1]")
    if rng is None:
        keep = secure_bernoulli(int(n), rate)  # the law of secure_uniform(n) <= q
    else:
        keep = rng.random(int(n)) < rate  # uniforms in [0, 1): P(u < q) = q
    return np.flatnonzero(keep)


@dataclass(frozen=True)
class RecordResult(LocalResult):
    """Outcome of one device's record-level local training (a :class:`LocalResult`).

    Attributes
    ----------
    weights
        ``float32``, ``(d,)``: the local model after H steps.
    differential
        ``float64``, ``(d,)``: ``(w_global - w_local) / lr``, accumulated in float64 as the sum
        over steps of ``(clipped sum + noise) / B``, so that with ``steps = 1`` and no noise it
        is exactly the clipped sum over ``B`` (float32 weight differences would round it).
    mean_loss
        Mean per-example loss over all examples drawn in the round (each at the weights
        before its step); ``nan`` when every batch was empty.
    batch_sizes
        ``int64``, ``(H,)``: the realized Poisson batch sizes.
    sampling_rate
        ``q = B / D``.
    noise_multiplier
        ``z``: per-step noise std on the clipped sum is ``z C``, on the step's gradient
        ``z C / B``; ``0`` in upload-noise mode.
    secure_sampling
        Whether the batches came from the OS CSPRNG (amplification may be credited).
    """

    batch_sizes: np.ndarray
    sampling_rate: float
    noise_multiplier: float
    secure_sampling: bool


class RecordTrainer:
    """H steps of DP-SGD (Poisson batches, per-example clipping) on one device's shard.

    Parameters
    ----------
    model
        A model instance reused across devices (its weights are overwritten). Refused if it
        contains batch normalisation (per-example gradients are undefined).
    x, y
        The device's samples: ``float32`` ``(D, C, H, W)`` and ``int64`` ``(D,)``, ``D >= 1``;
        with ``index``, the shared training set
        (:class:`~edge_device.trainer.DeviceData`).
    index
        ``None``, or the device's rows of ``x`` and ``y``, ``int`` ``(D,)``: nothing is
        copied per device, each batch gathers its rows.
    backend
        Per-example gradient machinery (:mod:`edge_device.per_example`), decided once here:
        ``"auto"`` (default: the layer-wise formulas where they cover every parameterised
        layer of the model, else ``torch.func.vmap``), ``"layers"`` or ``"vmap"``.
    device
        Where the model trains and the per-example gradients are computed
        (``compute.device`` resolved, :func:`testbed.core.compute.resolve_device`);
        ``None``: where the model's parameters are. The model is moved there, each batch is
        gathered on the CPU and moved there; privacy noise is drawn on the CPU (OS CSPRNG)
        and moved there; results come back to the CPU.
    """

    def __init__(
        self,
        model: nn.Module,
        x: np.ndarray | CodedImages,
        y: np.ndarray,
        *,
        index: np.ndarray | None = None,
        backend: Backend = "auto",
        device: torch.device | None = None,
    ) -> None:
        self.data = DeviceData(
            float32_images(x), np.asarray(y, dtype=np.int64), index
        )
        self.device = model_device(model) if device is None else torch.device(device)
        self.model = model.to(self.device)
        self.clipped_sum = ClippedGradientSum(model, backend=backend, device=self.device)
        self.d = self.clipped_sum.d

    @property
    def n_examples(self) -> int:
        """``D``, the number of the device's examples."""
        return len(self.data)

    @property
    def x(self) -> torch.Tensor:
        """The device's images ``(D, C, H, W)`` (gathered, a copy, when its rows are shared)."""
        return self.data.span(0, len(self.data))[0]

    @property
    def y(self) -> torch.Tensor:
        """The device's labels ``(D,)`` (gathered, a copy, when its rows are shared)."""
        return self.data.span(0, len(self.data))[1]

    def train(
        self,
        w_global: np.ndarray,
        *,
        steps: int,
        expected_batch_size: int,
        lr: float,
        example_clip: float,
        noise_multiplier: float,
        secure_sampling: bool = True,
        rng: np.random.Generator | None = None,
    ) -> RecordResult:
        """H DP-SGD steps from ``w_global``.

        Parameters
        ----------
        w_global
            ``(d,)`` global model.
        steps
            H, local steps (``>= 1``).
        expected_batch_size
            ``B`` in ``[1, D]``; the sampling rate is ``q = B / D`` and every step's sum is
            divided by ``B``.
        lr
            Learning rate ``> 0``.
        example_clip
            ``C > 0``: l2 bound of each example's gradient.
        noise_multiplier
            ``z >= 0``: per-step noise ``N(0, (z C)^2 I)`` on the clipped sum; ``0`` for
            upload-noise mode.
        secure_sampling
            ``True``: Poisson inclusions from the OS CSPRNG; ``rng`` must be ``None``.
            ``False``: from ``rng`` (required), reproducible, no amplification to credit.
        rng
            The minibatch generator when ``secure_sampling`` is ``False``.

        Returns
        -------
        RecordResult
        """
        self._check(steps, expected_batch_size, lr, example_clip, noise_multiplier)
        if secure_sampling and rng is not None:
            raise ValueError(
                "secure_sampling=True refuses a generator: batches whose amplification is "
                "credited must come from the OS CSPRNG, not from a reproducible seed"
            )
        if not secure_sampling and not isinstance(rng, np.random.Generator):
            raise ValueError("secure_sampling=False needs rng, a numpy Generator")
        n = self.n_examples
        q = expected_batch_size / n
        sigma_sum = float(noise_multiplier) * float(example_clip)  # std on the clipped sum
        inv_b = 1.0 / expected_batch_size
        set_flat(self.model, w_global)
        self.model.train()
        dev = self.device
        differential = torch.zeros(self.d, dtype=torch.float64, device=dev)
        step, views = self._step_buffer()
        sizes = np.zeros(steps, dtype=np.int64)
        loss_total = torch.zeros((), dtype=torch.float64, device=dev)  # no sync per step
        # the per-step noise: float64 from the OS CSPRNG, rounded once to float32 on the
        # CPU, each step's drawn beside the step before it (edge_device/noise_ahead.py)
        ahead = NoiseAhead(self.d, sigma_sum, steps) if sigma_sum > 0 else None
        with ahead if ahead is not None else nullcontext():
            for t in range(steps):
                idx = poisson_sample(n, q, rng=None if secure_sampling else rng)
                sizes[t] = idx.size
                if idx.size:
                    xb, yb = self.data.batch(torch.from_numpy(idx))
                    total, _, losses = self.clipped_sum(xb.to(dev), yb.to(dev), example_clip)
                    loss_total += losses.double().sum()
                else:
                    total = torch.zeros(self.d, dtype=torch.float32, device=dev)
                if ahead is not None:  # drawn on the CPU (OS CSPRNG), rounded there, moved
                    total.add_(ahead.take().to(dev))  # total: this step's own fresh sum
                torch.mul(total, inv_b, out=step)  # (d,) float32: the noisy gradient
                self._sgd_step(views, lr)
                differential.add_(total, alpha=inv_b)  # float64: total widened, then scaled
        seen = int(sizes.sum())
        return RecordResult(
            weights=get_flat(self.model),
            differential=differential.cpu().numpy(),
            mean_loss=float(loss_total) / seen if seen else math.nan,
            batch_sizes=sizes,
            sampling_rate=q,
            noise_multiplier=float(noise_multiplier),
            secure_sampling=bool(secure_sampling),
        )

    def train_laplace(
        self,
        w_global: np.ndarray,
        *,
        lr: float,
        example_clip: float,
        laplace_scale: float,
        normaliser: int,
        chunk: int = 256,
    ) -> RecordResult:
        """004's Laplace reply: one full-batch step with l1 clipping and Laplace noise.

        Parameters
        ----------
        w_global
            ``(d,)`` global model.
        lr
            Learning rate ``> 0``.
        example_clip
            ``xi_1 > 0``: l1 bound of each example's gradient (loss units per parameter).
        laplace_scale
            ``s >= 0``: Laplace scale per coordinate on the averaged clipped gradient (same
            units; variance ``2 s^2``); ``0`` adds no noise. The caller derives it from
            ``normaliser`` (``s = b xi_1 / D_pub``), never from the records seen.
        normaliser
            ``D_pub >= 1`` (records): the public normaliser, fixed before the run (the
            device's shard size as partitioned, ``RecordSettings.dataset_size``). The clipped
            sum over *all the records this trainer holds* is divided by it, whatever their
            number: a neighbouring data set (one record more or fewer) keeps the same
            ``D_pub``, so the value moves by at most ``xi_1 / D_pub`` in l1.
        chunk
            Examples per per-example-gradient call (bounds memory; the sum is the same).

        Returns
        -------
        RecordResult
            ``differential`` is ``(clipped l1 sum) / D_pub + Lap(0, s)`` in float64;
            ``batch_sizes`` is ``[D]`` (the records seen), ``sampling_rate`` 1,
            ``noise_multiplier`` ``b = s D_pub / xi_1`` and ``secure_sampling`` ``False``
            (nothing is sampled).
        """
        self._check(1, self.n_examples, lr, example_clip, laplace_scale)
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise ValueError(f"chunk={chunk!r} must be an integer >= 1")
        if (
            isinstance(normaliser, bool)
            or not isinstance(normaliser, int | np.integer)
            or normaliser < 1
        ):
            raise ValueError(
                f"normaliser={normaliser!r} must be an integer >= 1 (the public D_i fixed "
                "before the run)"
            )
        n = self.n_examples
        public = int(normaliser)
        set_flat(self.model, w_global)
        self.model.train()
        dev = self.device
        total = torch.zeros(self.d, dtype=torch.float64, device=dev)
        loss_total = 0.0
        for start in range(0, n, chunk):
            xs, ys = self.data.span(start, start + chunk)
            part, _, losses = self.clipped_sum(xs.to(dev), ys.to(dev), example_clip, norm=1)
            total += part.double()
            loss_total += float(losses.double().sum())
        differential = total / public  # never / n: n is the data set's, D_pub is public
        if laplace_scale > 0:
            # drawn on the CPU (OS CSPRNG) in float64, then moved
            differential += torch.from_numpy(laplace_noise(self.d, float(laplace_scale))).to(dev)
        step, views = self._step_buffer()
        step.copy_(differential)  # rounded to float32
        self._sgd_step(views, lr)
        return RecordResult(
            weights=get_flat(self.model),
            differential=differential.cpu().numpy(),
            mean_loss=loss_total / n,
            batch_sizes=np.array([n], dtype=np.int64),
            sampling_rate=1.0,
            noise_multiplier=float(laplace_scale) * public / float(example_clip),
            secure_sampling=False,
        )

    def _step_buffer(self) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """A flat ``(d,)`` step buffer and its views in the parameters' shapes (in
        ``model.parameters()`` order), made once per round: an SGD step is then two tensor
        operations, whatever the number of layers. Not kept between rounds: a run holds one
        trainer per simulated device."""
        params = self.clipped_sum.params
        step = torch.empty(self.d, dtype=params[0].dtype, device=self.device)
        views = [v.view_as(p) for v, p in zip(
            torch.split(step, [p.numel() for p in params]), params, strict=True)]
        return step, views

    def _sgd_step(self, views: list[torch.Tensor], lr: float) -> None:
        """``w -= lr * step`` for the flat step whose parameter-shaped ``views`` are given
        (:meth:`_step_buffer`): one multi-tensor update."""
        with torch.no_grad():
            # torch's stub wants list[Tensor]; lists are invariant, so list[Parameter] fails
            torch._foreach_add_(self.clipped_sum.params, views, alpha=-lr)  # type: ignore[arg-type]

    def _check(
        self, steps: int, batch: int, lr: float, clip: float, noise_multiplier: float
    ) -> None:
        def real(v: object) -> bool:
            return isinstance(v, int | float | np.floating | np.integer) and not isinstance(
                v, bool
            ) and math.isfinite(float(v))  # type: ignore[arg-type]

        if isinstance(steps, bool) or not isinstance(steps, int | np.integer) or steps < 1:
            raise ValueError(f"steps={steps!r} must be an integer >= 1")
        if isinstance(batch, bool) or not isinstance(batch, int | np.integer):
            raise ValueError(f"expected_batch_size={batch!r} must be an integer")
        if not 1 <= batch <= self.n_examples:
            raise ValueError(
                f"expected_batch_size={batch} must be in [1, D={self.n_examples}] (q = B/D <= 1)"
            )
        if not (real(lr) and lr > 0):
            raise ValueError(f"lr={lr!r} must be finite and > 0")
        if not (real(clip) and clip > 0):
            raise ValueError(f"example_clip={clip!r} must be finite and > 0")
        if not (real(noise_multiplier) and noise_multiplier >= 0):
            raise ValueError(f"noise_multiplier={noise_multiplier!r} must be finite and >= 0")
