"""Bridges to deepinv, duck-typed: nothing here imports deepinv.

* :func:`from_deepinv_physics`: a linear physics (``A``, ``A_adjoint``, ``noise_model.sigma``;
  a decomposable one's ``U``, ``U_adjoint``, ``V``, ``V_adjoint``, ``mask``) as an operator;
* :func:`from_deepinv_denoiser`: a denoiser ``model(x, sigma)`` ([0, 1] images and sigma) as a
  :class:`~nfc_dps.priors.DenoiserPrior`;
* :class:`DeepinvSolver`: a reconstructor ``model(y, physics)`` running :func:`nfc_dps.restore`,
  what deepinv's trainers and benchmarks call.

Units are deepinv's: images and measurements in [0, 1] image units, sigma in the same units.
"""

from __future__ import annotations

import itertools
import numbers
from typing import Any, Sequence

import torch
from torch import Tensor, nn

from .api import restore
from .noise import PoissonGaussianNoise, PoissonNoise
from .operators import Denoising
from .operators.base import LinearOperator, prox_scales
from .priors.base import Prior
from .priors.denoiser import DenoiserPrior
from .samplers import get_config

__all__ = ["PhysicsOperator", "from_deepinv_physics", "from_deepinv_denoiser", "DeepinvSolver", "physics_noise",
           "nonlinear_physics_problem", "is_identity_physics"]

#: a decomposable physics has these (deepinv's DecomposablePhysics: A = U diag(mask) V^T)
SVD_PARTS = ("U", "U_adjoint", "V", "V_adjoint", "mask")
#: singular values below this count as zero in the pseudo-inverse
SINGULAR_FLOOR = 1e-5


def _device_of(module: Any) -> torch.device:
    """Where ``module``'s first parameter or buffer lives (CPU when it holds none)."""
    if isinstance(module, nn.Module):
        for t in itertools.chain(module.parameters(), module.buffers()):
            return t.device
    return torch.device("cpu")


def _dtype_of(module: Any) -> torch.dtype:
    """The dtype of ``module``'s first floating-point parameter or buffer (torch's default when it
    holds none)."""
    if isinstance(module, nn.Module):
        for t in itertools.chain(module.parameters(), module.buffers()):
            if t.is_floating_point():
                return t.dtype
    return torch.get_default_dtype()


def _inpainting_mask(physics: Any) -> Tensor | None:
    """The (H, W) 0/1 pixel mask of deepinv's ``Inpainting`` (duck-typed: the class name and a
    ``mask`` tensor of 0s and 1s, shaped (..., H, W) with every leading index alike), else None."""
    if type(physics).__name__ != "Inpainting":
        return None
    mask = getattr(physics, "mask", None)
    if not isinstance(mask, Tensor) or mask.ndim < 2 or mask.is_complex() or mask.numel() == 0:
        return None
    mask = mask.detach()
    flat = mask.reshape(-1, *mask.shape[-2:])
    if not bool(((flat == 0) | (flat == 1)).all()) or not bool((flat == flat[:1]).all()):
        return None
    return flat[0].to(torch.float32)


def _noise_sigma(physics: Any) -> float | Tensor | None:
    """``physics.noise_model.sigma`` as a float (or a (B,) tensor when it differs per image), None
    when the physics has no Gaussian sigma."""
    sigma = getattr(getattr(physics, "noise_model", None), "sigma", None)
    if sigma is None:
        return None
    if isinstance(sigma, Tensor):
        flat = sigma.detach().flatten().float().cpu()
        if flat.numel() == 0:
            return None
        return float(flat[0]) if bool((flat == flat[0]).all()) else flat
    if isinstance(sigma, numbers.Real) and not isinstance(sigma, bool):
        return float(sigma)
    raise TypeError(f"physics.noise_model.sigma must be a number or a tensor, got {type(sigma).__name__}")


def physics_noise(physics: Any) -> Any:
    """The noise model of a deepinv-style ``physics.noise_model`` that is not Gaussian, by class
    name: ``PoissonNoise(gain)`` (y = gain Poisson(x / gain)) is ``nfc_dps.noise.PoissonNoise(1 /
    gain)``, ``PoissonGaussianNoise(gain, sigma)`` likewise with its read noise; None otherwise."""

    model = getattr(physics, "noise_model", None)
    kind = type(model).__name__ if model is not None else None
    if kind not in ("PoissonNoise", "PoissonGaussianNoise"):
        return None
    gain = getattr(model, "gain", None)
    gain = float(gain.flatten()[0]) if isinstance(gain, Tensor) else gain
    if not isinstance(gain, numbers.Real) or not gain > 0:
        raise ValueError(f"physics.noise_model is deepinv's {kind} with gain {gain!r}; expected a number > 0")
    if kind == "PoissonNoise":
        return PoissonNoise(1.0 / float(gain))
    sigma = getattr(model, "sigma", 0.0)
    sigma = float(sigma.flatten()[0]) if isinstance(sigma, Tensor) else float(sigma)
    return PoissonGaussianNoise(1.0 / float(gain), sigma)


#: how a nonlinear or complex physics is restored: nfc_dps' own task, or its map as a nonlinear operator
NONLINEAR_ROUTE = ("restore it as a nonlinear map: FunctionOperator(physics.A, image_shape, measurement_shape, "
                   "linear=False) (nfc_dps.operators), which DeepinvSolver and nfc_dps.restore take as the physics")
PHASE_RETRIEVAL_ROUTE = ("nfc_dps' built-in task is phase retrieval from oversampled Fourier amplitudes |F x| "
                         "(nfc_dps.build_operator('phase_retrieval', image_size=(H, W)); a measurement |B x|^2 of a "
                         "Fourier B is its square); ")


def _class_names(obj: Any) -> list[str]:
    """The names of ``obj``'s classes that come from deepinv (a class of the user's own named
    ``Physics`` is not deepinv's)."""
    return [c.__name__ for c in type(obj).__mro__ if c.__module__.split(".")[0] == "deepinv"]


def nonlinear_physics_problem(physics: Any) -> str | None:
    """Why a deepinv-style physics is not a linear one nfc_dps can bridge, naming the route (None
    when it may be): deepinv's ``PhaseRetrieval`` (A(x) = |B x|^2, B complex) and any deepinv
    ``Physics`` that is not a ``LinearPhysics`` (by class name)."""
    names = _class_names(physics)
    kind = type(physics).__name__
    if any("PhaseRetrieval" in n for n in names):
        return (f"{kind} is deepinv's phase retrieval, y = |B x|^2: nonlinear, with a complex B whose adjoint is no "
                f"adjoint of A, so it is not a linear physics; {PHASE_RETRIEVAL_ROUTE}or {NONLINEAR_ROUTE}")
    if "Physics" in names and "LinearPhysics" not in names:
        return f"{kind} is a deepinv Physics that is not a LinearPhysics (a nonlinear map); {NONLINEAR_ROUTE}"
    return None


def is_identity_physics(physics: Any, y: Tensor) -> bool:
    """True when ``physics`` is denoising: A and A_adjoint both return a seeded random image of
    y's shape (B, C, H, W) unchanged (deepinv's ``Denoising``)."""
    if y.ndim != 4 or not y.is_floating_point():
        return False
    x = torch.rand(y.shape, generator=torch.Generator().manual_seed(0), dtype=y.dtype).to(y.device)
    try:
        with torch.no_grad():
            return all(isinstance(out, Tensor) and out.shape == x.shape and torch.equal(out, x)
                       for out in (physics.A(x), physics.A_adjoint(x)))
    except Exception:  # noqa: BLE001 - a physics that fails on the probe is no identity
        return False


class PhysicsOperator(LinearOperator):
    """A deepinv-style linear physics as an operator: ``A`` and ``A_adjoint`` call the physics';
    the shapes come from applying them to zeros (once per shape). A decomposable physics
    (A = U diag(mask) V^T, U and V orthonormal) keeps its SVD: ``A_pinv``, ``prox`` and
    ``normal`` in closed form; any other uses the base class's conjugate gradients.

    ``sigma_y``: the physics' ``noise_model.sigma`` ([0, 1] units: a float, a (B,) tensor when
    it differs per image, or None when it has none).

    Measurements that are not (B, C, h, w) (compressed sensing's (B, m)) are seen as
    (B, 1, n, 1), n their number of values per image: :meth:`as_measurement` turns the physics'
    y into that, and ``A_adjoint`` gives the physics such a y in its own shape.

    deepinv's ``Inpainting`` (a ``mask`` of 0s and 1s, the same for every channel) is of family
    "inpaint" with that mask as its ``pixel_mask()``; any other physics is of family "other".
    ``dtype``: the physics' own (its first floating-point parameter or buffer's, else torch's
    default), what the classical baselines call it in.
    """

    name = "deepinv"

    def __init__(self, physics: Any) -> None:
        super().__init__()
        why = nonlinear_physics_problem(physics)
        if why:
            raise ValueError(why)
        for attr in ("A", "A_adjoint"):
            if not callable(getattr(physics, attr, None)):
                raise TypeError(f"a linear physics needs a callable {attr} (deepinv's LinearPhysics), "
                                f"{type(physics).__name__} has none")
        self.physics = physics
        self.sigma_y = _noise_sigma(physics)
        self.decomposable = all(hasattr(physics, p) for p in SVD_PARTS)
        self._pixel_mask = _inpainting_mask(physics)
        if self._pixel_mask is not None:
            self.family = "inpaint"
        self._shapes: dict[tuple[str, tuple[int, ...]], tuple[int, ...]] = {}
        self._native: tuple[int, ...] | None = None  # one measurement's shape, when it is not (C, h, w)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "physics": type(self.physics).__name__, "decomposable": self.decomposable}

    @property
    def dtype(self) -> torch.dtype:
        """The physics' dtype (see the class docstring)."""
        return _dtype_of(self.physics)

    def pixel_mask(self) -> Tensor | None:
        """The (H, W) float32 0/1 mask of an inpainting physics (1 = observed), else None."""
        return self._pixel_mask

    def as_measurement(self, y: Tensor) -> Tensor:
        """The physics' measurement y (B, ...) as this operator's (B, C, h, w): itself when it has
        four axes, else (B, 1, n, 1)."""
        if y.ndim == 4:
            return y
        if y.ndim < 2:
            raise ValueError(f"a measurement needs a batch axis and values, got shape {tuple(y.shape)}")
        self._native = tuple(y.shape[1:])
        return y.reshape(y.shape[0], 1, -1, 1)

    def _native_measurement(self, y: Tensor) -> Tensor:
        if self._native is None or y.ndim != 4:
            return y
        return y.reshape(y.shape[0], *self._native)

    def A(self, x: Tensor) -> Tensor:
        return self.as_measurement(self._real(self.physics.A(x), "A"))

    def A_adjoint(self, y: Tensor) -> Tensor:
        return self._real(self.physics.A_adjoint(self._native_measurement(y)), "A_adjoint")

    @staticmethod
    def _real(t: Tensor, what: str) -> Tensor:
        if not isinstance(t, Tensor):
            raise TypeError(f"physics.{what} returned {type(t).__name__}, not a tensor (stacked physics are not "
                            f"supported)")
        if t.is_complex():
            raise TypeError(f"physics.{what} returned a complex tensor: nfc_dps restores real images from real "
                            f"linear measurements, and a complex physics (phase retrieval's B, MRI's Fourier "
                            f"sampling) is neither; {NONLINEAR_ROUTE}")
        return t

    def _probe(self, kind: str, shape: Sequence[int]) -> tuple[int, ...]:
        key = (kind, tuple(int(v) for v in shape))
        if key not in self._shapes:
            with torch.no_grad():
                zeros = torch.zeros(key[1], device=_device_of(self.physics))
                self._shapes[key] = tuple((self.A if kind == "A" else self.A_adjoint)(zeros).shape)
        return self._shapes[key]

    def measurement_shape(self, image_shape: Sequence[int]) -> tuple[int, ...]:
        return self._probe("A", image_shape)

    def image_shape(self, measurement_shape: Sequence[int]) -> tuple[int, ...]:
        """The shape of ``A_adjoint(y)`` for a measurement y of ``measurement_shape``."""
        return self._probe("A_adjoint", measurement_shape)

    # --- the SVD of a decomposable physics
    def _mask_power(self) -> Tensor:
        mask = torch.as_tensor(self.physics.mask)
        return (mask.conj() * mask).real if mask.is_complex() else mask * mask

    def _per_image(self, value: Tensor, like: Tensor) -> Tensor:
        """(B, 1, 1, 1) -> (B, 1, ...) with like's number of axes."""
        return value.reshape(value.shape[0], *([1] * (like.ndim - 1)))

    def _image(self, t: Tensor) -> Tensor:
        return t.real if t.is_complex() else t

    def A_pinv(self, y: Tensor) -> Tensor:
        if not self.decomposable:
            return super().A_pinv(y)
        mask = torch.as_tensor(self.physics.mask).to(y.device)
        inv = torch.where(mask.abs() > SINGULAR_FLOOR, 1 / torch.where(mask.abs() > SINGULAR_FLOOR, mask,
                                                                          torch.ones_like(mask)), torch.zeros_like(mask))
        return self._image(self.physics.V(self.physics.U_adjoint(self._native_measurement(y)) * inv))

    def normal(self, x: Tensor) -> Tensor:
        if not self.decomposable:
            return super().normal(x)
        return self._image(self.physics.V(self._mask_power().to(x.device) * self.physics.V_adjoint(x)))

    def prox(self, y: Tensor, z: Tensor, sigma_y: float | Tensor, r: float | Tensor,
             max_iter: int = 100, tol: float = 1e-6) -> Tensor:
        """argmin ||y - A x||^2 / (2 sigma_y^2) + ||x - z||^2 / (2 r^2): in the SVD basis when the
        physics is decomposable (x = V (V^T b / (s^2 + sigma_y^2 / r^2)), b = A^T y + (sigma_y^2 /
        r^2) z), else by conjugate gradients (``max_iter``, ``tol``)."""
        if not self.decomposable:
            return super().prox(y, z, sigma_y, r, max_iter, tol)
        s2, r2 = prox_scales(sigma_y, r, z)
        ratio = s2 / r2  # 0 where r = inf: the pseudo-inverse's least-squares fit, regularised by nothing
        b = self.A_adjoint(y) + ratio * z
        coeff = self.physics.V_adjoint(b)
        power = self._mask_power().to(coeff.device)
        denom = power + self._per_image(ratio, coeff)
        safe = torch.where(denom > 0, denom, torch.ones_like(denom))
        return self._image(self.physics.V(torch.where(denom > 0, coeff / safe, torch.zeros_like(coeff))))


def from_deepinv_physics(physics: Any) -> PhysicsOperator:
    """A deepinv-style linear physics as an operator (:class:`PhysicsOperator`); its noise std,
    when the physics has a Gaussian ``noise_model.sigma``, is the operator's ``sigma_y``. A
    nonlinear or complex one (deepinv's ``PhaseRetrieval``, a ``Physics`` that is no
    ``LinearPhysics``) is a ValueError naming the route (:func:`nonlinear_physics_problem`)."""
    return PhysicsOperator(physics)


#: deepinv denoisers whose second argument is a regularisation weight or threshold, not a noise std
THRESHOLD_DENOISERS = ("TVDenoiser", "TGVDenoiser", "WaveletDenoiser", "WaveletDictDenoiser")


def from_deepinv_denoiser(model: Any, sigma_max: float, channels: int | None = None, sigma_min: float = 0.0,
                          size_multiple: int = 1) -> DenoiserPrior:
    """A deepinv-style denoiser ``model(x, sigma)`` (x (B, C, H, W) in [0, 1], sigma (B,) in [0,
    1] units -> the clean estimate in [0, 1]) as a :class:`~nfc_dps.priors.DenoiserPrior`
    valid up to ``sigma_max`` ([0, 1] units). ``channels``: None reads ``model.in_channels``
    when it has one, else 3. ``size_multiple``: what H and W must be multiples of (DRUNet: 8).

    deepinv's TV, TGV and wavelet denoisers (:data:`THRESHOLD_DENOISERS`, by class name) take a
    regularisation threshold, not a noise std, and are refused (ValueError): wrap one in a function
    that maps the std to its threshold, ``DenoiserPrior(lambda x, sigma: model(x, rule(sigma)), ...)``."""
    threshold = next((c.__name__ for c in type(model).__mro__ if c.__name__ in THRESHOLD_DENOISERS), None)
    if threshold is not None:
        raise ValueError(f"model is deepinv's {threshold} ({type(model).__name__}), whose second argument is a "
                         f"regularisation threshold, not the noise std that from_deepinv_denoiser would pass it; "
                         f"wrap it with your own rule from std to threshold: "
                         f"DenoiserPrior(lambda x, sigma: model(x, rule(sigma)), sigma_max)")
    if channels is None:
        found = getattr(model, "in_channels", None)
        channels = found if isinstance(found, int) and not isinstance(found, bool) else 3
    return DenoiserPrior(model, sigma_max, channels=channels, sigma_min=sigma_min, size_multiple=size_multiple)


class DeepinvSolver(nn.Module):
    """A reconstructor ``model(y, physics)``: :func:`nfc_dps.restore` with ``prior`` and a
    sampler, on a deepinv-style physics.

    Args:
        prior: a :class:`~nfc_dps.priors.base.Prior` (e.g. :func:`from_deepinv_denoiser`).
        method, preset, **overrides: the sampler, as in :func:`nfc_dps.restore` (default: NFC's
            deterministic preset, which a denoiser-only prior fits).
        sigma_y: the measurement noise std ([0, 1] units) for physics without a Gaussian
            ``noise_model.sigma``; a physics that has one uses its own. A physics whose
            ``noise_model`` is deepinv's ``PoissonNoise`` or ``PoissonGaussianNoise`` is restored
            under that model (:func:`physics_noise`); ``noise`` (an ``nfc_dps.noise`` model or
            spec) overrides both.
    A physics whose ``A`` and ``A_adjoint`` return the image unchanged (deepinv's ``Denoising``,
    :func:`is_identity_physics`) is restored as nfc_dps' own denoising task (its ``Denoising``
    operator, family "denoise"), under the physics' noise.
    ``physics`` may also be an nfc_dps operator (a registry task's, a nonlinear one such as
    ``build_operator("phase_retrieval", ...)``): it is used as it is.
        seed: the base seed of the samplers that draw noise (image b uses seed + b).
    """

    def __init__(self, prior: Prior, method: str = "nfc", preset: str | None = None, *, sigma_y: float | None = None,
                 seed: int = 0, noise: Any = None, **overrides: Any) -> None:
        super().__init__()
        if not isinstance(prior, Prior):
            raise TypeError(f"prior must be a nfc_dps Prior (from_deepinv_denoiser(model, sigma_max) wraps a "
                            f"denoiser), got {type(prior).__name__}")
        self.prior = prior
        self.method, self.preset, self.overrides = method, preset, dict(overrides)
        self.config = get_config(method, preset, **overrides)  # a bad method, preset or field fails here
        self.sigma_y, self.seed, self.noise = sigma_y, seed, noise

    def forward(self, y: Tensor, physics: Any) -> Tensor:
        """y: the physics' measurement, (B, C', h, w) or (B, m), [0, 1] units -> (B, C, H, W)
        restoration in [0, 1], its shape that of ``physics.A_adjoint(y)``."""
        if isinstance(physics, LinearOperator):  # an nfc_dps operator (nonlinear ones too)
            noise = self.noise if self.noise is not None else (self.sigma_y if self.sigma_y is not None else None)
            if noise is None:
                raise ValueError("an nfc_dps operator carries no noise model: pass DeepinvSolver(..., noise=...) "
                                 "or sigma_y=...")
            return restore(y, physics, prior=self.prior, method=self.method, noise=noise, seed=self.seed,
                           progress=False, config=self.config).image
        op = from_deepinv_physics(physics)
        y = op.as_measurement(y)
        sigma = op.sigma_y if op.sigma_y is not None else self.sigma_y
        if is_identity_physics(physics, y):  # deepinv's Denoising: restored as nfc_dps' own denoising task
            op = Denoising()
        noise = self.noise if self.noise is not None else physics_noise(physics)
        if noise is not None:
            return restore(y, op, prior=self.prior, method=self.method, noise=noise, seed=self.seed, progress=False,
                           config=self.config).image
        if sigma is None:
            raise ValueError(f"{type(physics).__name__} has no Gaussian noise_model.sigma: pass DeepinvSolver(..., "
                             f"sigma_y=...) in [0, 1] units")
        if isinstance(sigma, Tensor):  # one std per image: one restore per image
            if sigma.numel() != y.shape[0]:
                raise ValueError(f"noise_model.sigma has {sigma.numel()} values for a batch of {y.shape[0]}")
            return torch.cat([self._restore(restore, y[i:i + 1], op, float(sigma[i]), self.seed + i)
                              for i in range(y.shape[0])])
        return self._restore(restore, y, op, float(sigma), self.seed)

    def _restore(self, restore, y: Tensor, op: LinearOperator, sigma: float, seed: int) -> Tensor:
        return restore(y, op, prior=self.prior, method=self.method, sigma_y=sigma, seed=seed, progress=False,
                       config=self.config).image
