"""Differentiable nonlinear forward models: high dynamic range, phase retrieval, a camera's blur in
linear light, and any function (:class:`NonlinearFunctionOperator`).

A :class:`NonlinearOperator` shares the operators' interface of shapes and declared structure
(family "nonlinear", nothing else declared) but has no adjoint of its own: its Jacobian-vector
and vector-Jacobian products come from autograd (``jvp``, ``vjp``), :meth:`~NonlinearOperator.linearize`
gives the linear operator of its Jacobian at a point, and its proximal solve is Gauss-Newton on
that linearisation. Samplers that take one: NFC (every data step on the linearisation at the
current estimate), DAPS and DPS (likelihood gradients, as published), DPIR (Gauss-Newton prox).
"""

from __future__ import annotations

import math
import operator
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from .base import LinearOperator, check_image
from .blur import BlurOperator


def as_shape(value: Sequence[int], name: str) -> tuple[int, ...]:
    """``value`` as a tuple of positive ints: Python or numpy integers (or integral floats) are
    taken, a non-integral float, a bool or a string is refused naming it."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise ValueError(f"{name} must be a sequence of positive ints, got {value!r}")
    shape = []
    for v in value:
        if isinstance(v, (bool, np.bool_, str, bytes)):
            raise ValueError(f"{name} must be a sequence of positive ints, got {value!r} (holding {v!r})")
        try:
            shape.append(operator.index(v))  # int, numpy integer, integer 0-d tensor
            continue
        except TypeError:
            pass
        try:
            f = float(v)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{name} must be a sequence of positive ints, got {value!r} (holding {v!r})") from e
        if not f.is_integer():
            raise ValueError(f"{name} must be a sequence of positive ints, got {value!r}: {v!r} is not a whole "
                             f"number (a size is not truncated)")
        shape.append(int(f))
    if not shape or any(v < 1 for v in shape):
        raise ValueError(f"{name} must be a non-empty sequence of positive ints, got {value!r}")
    return tuple(shape)


__all__ = ["NonlinearOperator", "LinearizedOperator", "NonlinearWrapper", "WeightedNonlinearOperator", "ModelUnitsOperator",
           "HighDynamicRange", "Exposure", "PhaseRetrieval", "CameraBlur", "NonlinearFunctionOperator", "srgb_to_linear",
           "linear_to_srgb", "is_linear"]


def is_linear(operator: Any) -> bool:
    """True unless ``operator`` declares itself nonlinear."""
    return bool(getattr(operator, "is_linear", True))


class NonlinearOperator(LinearOperator):
    """Base of the differentiable nonlinear forward models y = A(x) (+ noise), images in [0, 1].

    Subclasses implement ``A``, ``measurement_shape`` and ``image_shape``; ``measurement_range``
    is the interval A's values lie in ((0, 1) for an image-valued map, None for any). Gauss-Newton
    runs ``gauss_newton_steps`` linearisations per proximal solve.
    """

    name = "nonlinear"
    family = "nonlinear"
    is_linear = False
    #: where A's values lie; None: anywhere (only finiteness is checked)
    measurement_range: tuple[float, float] | None = (0.0, 1.0)
    gauss_newton_steps = 3
    #: False when :meth:`start` holds no image (phase retrieval): NFC's default then starts high
    start_is_informative = True
    #: True when :meth:`start` is the image itself up to the noise wherever the sensor did not clip
    #: (HDR, exposure): restoring it fills the clipped pixels, and NFC's default starts where it
    #: starts an inpainting
    fills_clipped_pixels = False

    def A_adjoint(self, y: Tensor) -> Tensor:
        raise TypeError(f"{type(self).__name__} is nonlinear: it has no adjoint; use vjp(x, u) at a point x "
                        f"or linearize(x)")

    def A_pinv(self, y: Tensor) -> Tensor:
        raise TypeError(f"{type(self).__name__} is nonlinear: it has no pseudo-inverse; start from start(y)")

    def jvp(self, x: Tensor, v: Tensor) -> Tensor:
        """J(x) v: the directional derivative of A at x."""
        return torch.func.jvp(self.A, (x,), (v,))[1]

    def vjp(self, x: Tensor, u: Tensor) -> Tensor:
        """J(x)^T u: the gradient of <u, A(x)> with respect to x."""
        _, pull = torch.func.vjp(self.A, x)
        return pull(u)[0]

    def linearize(self, x: Tensor) -> "LinearizedOperator":
        """The linear operator J(x) of A's Jacobian at x: A(x + d) ~ A(x) + J(x) d."""
        return LinearizedOperator(self, x)

    def prox(self, y: Tensor, z: Tensor, sigma_y: float | Tensor, r: float | Tensor,
             max_iter: int = 30, tol: float = 1e-6) -> Tensor:
        """argmin_x ||y - A(x)||^2 / (2 sigma_y^2) + ||x - z||^2 / (2 r^2), by ``gauss_newton_steps``
        Gauss-Newton steps from z, each a linearised prox solved by conjugate gradients."""
        check_image(y, "y")
        check_image(z, "z")
        x = z
        for _ in range(self.gauss_newton_steps):
            lin = self.linearize(x)
            residual = y - self.A(x)
            x = x + lin.prox(residual, z - x, sigma_y, r, max_iter, tol)
        return x

    def data_gradient(self, x: Tensor, y: Tensor) -> Tensor:
        """J(x)^T (A(x) - y): the gradient of ||y - A(x)||^2 / 2."""
        with torch.enable_grad():
            x = x.detach().requires_grad_(True)
            ax = self.A(x)
            (g,) = torch.autograd.grad(ax, x, grad_outputs=(ax - y).detach())
        return g

    def start(self, y: Tensor) -> Tensor:
        """A first image estimate in [0, 1] units from the measurement (default: mid-grey)."""
        return torch.full(self.image_shape(y.shape), 0.5, dtype=y.dtype, device=y.device)

    def measure(self, x: Tensor, sigma_y: float | Tensor | None = None,
                generator: torch.Generator | Sequence[torch.Generator] | None = None, *, noise: Any = None) -> Tensor:
        with torch.no_grad():
            return super().measure(x, sigma_y, generator, noise=noise)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "linear": False}


class NonlinearWrapper(NonlinearOperator):
    """A nonlinear operator built on another, ``inner``: it takes the inner operator's name,
    Gauss-Newton steps, start flag, image channels and shapes; subclasses define ``A`` and ``start``."""

    def __init__(self, inner: NonlinearOperator) -> None:
        super().__init__()
        self.inner = inner
        self.name = inner.name
        self.gauss_newton_steps = inner.gauss_newton_steps
        self.start_is_informative = inner.start_is_informative
        self.fills_clipped_pixels = inner.fills_clipped_pixels

    @property
    def image_channels(self) -> int | None:
        return self.inner.image_channels

    def measurement_shape(self, image_shape: Sequence[int]) -> tuple[int, ...]:
        return self.inner.measurement_shape(image_shape)

    def image_shape(self, measurement_shape: Sequence[int]) -> tuple[int, ...]:
        return self.inner.image_shape(measurement_shape)

    def measured_frame(self, image_shape: Sequence[int]) -> tuple[int, int, int, int] | None:
        return self.inner.measured_frame(image_shape)


class WeightedNonlinearOperator(NonlinearWrapper):
    """A'(x) = w * A(x) for a nonlinear A and per-pixel weights w (B|1, C|1, h, w) > 0 on its
    measurement grid: the whitened form of a non-Gaussian measurement of a nonlinear operator (as
    :class:`~nfc_dps.operators.weighted.WeightedOperator` for a linear one)."""

    measurement_range = None

    def __init__(self, inner: NonlinearOperator, weights: Tensor) -> None:
        super().__init__(inner)
        self.register_buffer("weights", weights)

    def A(self, x: Tensor) -> Tensor:
        return self.weights * self.inner.A(x)

    def start(self, y: Tensor) -> Tensor:
        return self.inner.start(y / self.weights)

    def select_images(self, index: Tensor) -> "WeightedNonlinearOperator":
        if self.weights.shape[0] == 1:
            return self
        return WeightedNonlinearOperator(self.inner.select_images(index), self.weights[index])


class LinearizedOperator(LinearOperator):
    """J(x0) of a :class:`NonlinearOperator` at x0 (B, C, H, W): A v = J v, A^T u = J^T u (autograd).
    The prox and pseudo-inverse are the base class's conjugate gradients."""

    name = "linearized"

    def __init__(self, inner: NonlinearOperator, x0: Tensor) -> None:
        super().__init__()
        self.inner = inner
        self.x0 = x0.detach()

    def A(self, v: Tensor) -> Tensor:
        return self.inner.jvp(self.x0, v)

    def A_adjoint(self, u: Tensor) -> Tensor:
        return self.inner.vjp(self.x0, u)

    def measurement_shape(self, image_shape: Sequence[int]) -> tuple[int, ...]:
        return self.inner.measurement_shape(image_shape)

    def image_shape(self, measurement_shape: Sequence[int]) -> tuple[int, ...]:
        return self.inner.image_shape(measurement_shape)


class ModelUnitsOperator(NonlinearWrapper):
    """A nonlinear operator on the prior's [-1, 1] images: A_m(x_m) = 2 A((x_m + 1) / 2) - 1, so that
    y_m = 2 y - 1 is its measurement with noise std 2 sigma_y (``samplers.common.to_model_units``)."""

    def A(self, x: Tensor) -> Tensor:
        return 2 * self.inner.A((x + 1) / 2) - 1

    def start(self, y: Tensor) -> Tensor:
        return 2 * self.inner.start((y + 1) / 2) - 1


class PixelwiseOperator(NonlinearOperator):
    """A nonlinear map applied pixel by pixel (a sensor's response): the measurement has the image's shape."""

    def measurement_shape(self, image_shape: Sequence[int]) -> tuple[int, ...]:
        return tuple(image_shape)

    def image_shape(self, measurement_shape: Sequence[int]) -> tuple[int, ...]:
        return tuple(measurement_shape)


class HighDynamicRange(PixelwiseOperator):
    """DAPS's high dynamic range task: y = clip(scale (x - 1/2) + 1/2, 0, 1) in [0, 1] units (scale 2:
    DAPS's clip(2x, -1, 1) in [-1, 1] units), a contrast stretch about mid-grey that clips shadows
    and highlights alike; the clipped pixels carry no information. A camera's over-exposure is
    :class:`Exposure`."""

    name = "hdr"
    clips_shadows = True

    def __init__(self, scale: float = 2.0) -> None:
        super().__init__()
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"scale must be a finite number > 0, got {scale!r}")
        self.scale = float(scale)

    @property
    def fills_clipped_pixels(self) -> bool:
        """A stretch (scale > 1) clips; a compression leaves every pixel inside (0, 1)."""
        return self.scale > 1

    def A(self, x: Tensor) -> Tensor:
        return (self.scale * (x - 0.5) + 0.5).clamp(0, 1)

    def inverse(self, y: Tensor) -> Tensor:
        """The unclipped inverse: (y - 1/2) / scale + 1/2."""
        return (y - 0.5) / self.scale + 0.5

    def start(self, y: Tensor) -> Tensor:
        """The unclipped inverse where y is inside (0, 1); where the measurement is saturated (y <= 0
        or y >= 1), the saturated value itself (0 or 1), as the sensor shows it: the inverse would
        put every clipped pixel on the clip's edge, while the scene there mostly lies well beyond it
        (chosen on validation images over fills at fractions of the way from the edge to 0 or 1, and
        over thresholds a little inside (0, 1), which also catch the saturated pixels that noise
        pulled back inside but lost)."""
        return torch.where((y <= 0) | (y >= 1), y.clamp(0, 1), self.inverse(y))

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "scale": self.scale}


class Exposure(PixelwiseOperator):
    """A camera's over-exposure by ``ev`` stops: the scene's light times the gain g = 2^ev, clipped
    at the sensor's white and encoded, y = srgb(clip(g srgb^-1(x), 0, 1)), x and y sRGB in [0, 1].
    The highlights (x above srgb(1 / g)) saturate at 1 and carry no information; shadows never
    clip. ``ev`` < 0 is an under-exposure (nothing clips)."""

    name = "exposure"
    clips_shadows = False

    def __init__(self, ev: float = 1.0) -> None:
        super().__init__()
        if isinstance(ev, bool) or not isinstance(ev, (int, float)) or not math.isfinite(ev) or abs(ev) > 16:
            raise ValueError(f"ev must be a finite number of stops in [-16, 16], got {ev!r}")
        self.ev = float(ev)
        self.gain = 2.0 ** self.ev

    @property
    def fills_clipped_pixels(self) -> bool:
        """An over-exposure (ev > 0) clips the highlights; an under-exposure clips nothing."""
        return self.ev > 0

    def A(self, x: Tensor) -> Tensor:
        light = self.gain * srgb_to_linear(x)
        # exactly 1 where saturated (the encoding of 1 rounds below it in float32)
        return torch.where(light >= 1, torch.ones_like(light), linear_to_srgb(light.clamp(0, 1)))

    def inverse(self, y: Tensor) -> Tensor:
        """The unclipped inverse: srgb(srgb^-1(y) / g)."""
        return linear_to_srgb(srgb_to_linear(y) / self.gain)

    def start(self, y: Tensor) -> Tensor:
        """The unclipped inverse, and 1 where the sensor saturated (y >= 1), as :class:`HighDynamicRange`'s
        start takes the saturated value."""
        return torch.where(y >= 1, torch.ones_like(y), self.inverse(y))

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "ev": self.ev}


class PhaseRetrieval(NonlinearOperator):
    """Fourier phase retrieval as DAPS states it: y = |F(pad(x))|, F the orthonormal, centred 2-D DFT,
    pad the zero padding of an (H, W) image by ``oversample`` / 8 of each side on each side
    (``oversample`` 2: a quarter, a 1.5x larger grid). y is (B, C, H', W'), any non-negative values.
    Besides noise, x and its 180-degree rotation give the same y."""

    name = "phase_retrieval"
    measurement_range = None
    image_measurement = False  # Fourier amplitudes: sigma_y="auto" cannot read a noise level from them
    start_is_informative = False

    def __init__(self, oversample: float = 2.0) -> None:
        super().__init__()
        if not (math.isfinite(oversample) and oversample > 0):
            raise ValueError(f"oversample must be a finite number > 0, got {oversample!r}")
        self.oversample = float(oversample)

    def _pad(self, h: int, w: int) -> tuple[int, int]:
        return int(round(self.oversample / 8 * h)), int(round(self.oversample / 8 * w))

    def A(self, x: Tensor) -> Tensor:
        ph, pw = self._pad(*x.shape[-2:])
        padded = F.pad(x, (pw, pw, ph, ph))
        spectrum = torch.fft.fftshift(torch.fft.fft2(padded, norm="ortho"), dim=(-2, -1))
        return spectrum.abs()

    def measurement_shape(self, image_shape: Sequence[int]) -> tuple[int, ...]:
        h, w = image_shape[-2:]
        ph, pw = self._pad(h, w)
        return (*image_shape[:-2], h + 2 * ph, w + 2 * pw)

    def image_shape(self, measurement_shape: Sequence[int]) -> tuple[int, ...]:
        hp, wp = (int(v) for v in measurement_shape[-2:])
        f = 1 + 2 * self.oversample / 8

        def side(padded: int) -> int:  # the image side whose padded grid is ``padded`` (-1: none)
            return next((n for n in range(max(1, int(padded / f) - 2), int(padded / f) + 3)
                         if n + 2 * self._pad(n, n)[0] == padded), -1)

        h, w = side(hp), side(wp)
        if h < 0 or w < 0:
            n = max(1, round(hp / f))  # the image side nearest the measurement's height
            raise ValueError(f"a phase retrieval measurement of size {hp}x{wp} (oversample {self.oversample:g}) "
                             f"is the padded grid of no image; expected (1 + oversample / 4) times the image's size "
                             f"(a {n}x{n} image: {self.measurement_shape((n, n))[-2]}x"
                             f"{self.measurement_shape((n, n))[-1]} Fourier amplitudes, as 'nfc-dps simulate "
                             f"--task phase_retrieval' writes them), not a photo")
        return (*measurement_shape[:-2], h, w)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "oversample": self.oversample}


def srgb_to_linear(v: Tensor) -> Tensor:
    """sRGB's decoding (IEC 61966-2-1), [0, 1] -> [0, 1]."""
    v = v.clamp(0, 1)
    return torch.where(v <= 0.04045, v / 12.92, ((v + 0.055) / 1.055).clamp_min(1e-12) ** 2.4)


def linear_to_srgb(v: Tensor) -> Tensor:
    """sRGB's encoding, [0, 1] -> [0, 1]."""
    v = v.clamp(0, 1)
    return torch.where(v <= 0.0031308, 12.92 * v, 1.055 * v.clamp_min(1e-12) ** (1 / 2.4) - 0.055)


class CameraBlur(NonlinearOperator):
    """Blur as a camera records it: in linear light, then clipped and encoded,
    y = srgb(clip(k * srgb^-1(x), 0, 1)), ``blur`` the :class:`~nfc_dps.operators.BlurOperator` of the
    kernel and boundary."""

    name = "deblur_camera"
    blurred_measurement = True  # no fine texture left: sigma_y="auto" reads every patch, as for the blur family

    def __init__(self, blur: BlurOperator) -> None:
        super().__init__()
        self.blur = blur

    def A(self, x: Tensor) -> Tensor:
        return linear_to_srgb(self.blur.A(srgb_to_linear(x)).clamp(0, 1))

    def measured_frame(self, image_shape: Sequence[int]) -> tuple[int, int, int, int] | None:
        return self.blur.measured_frame(image_shape)

    def blur_kernel(self) -> Tensor | None:
        return None  # in linear light only: on the encoded image A is no convolution

    def start(self, y: Tensor) -> Tensor:
        return y.clone() if tuple(y.shape) == tuple(self.image_shape(y.shape)) else super().start(y)

    def measurement_shape(self, image_shape: Sequence[int]) -> tuple[int, ...]:
        return self.blur.measurement_shape(image_shape)

    def image_shape(self, measurement_shape: Sequence[int]) -> tuple[int, ...]:
        return self.blur.image_shape(measurement_shape)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "blur": self.blur.describe()}


class NonlinearFunctionOperator(NonlinearOperator):
    """A differentiable nonlinear map given as a function (``FunctionOperator(A, ..., linear=False)``):
    ``A`` (B, *image_shape) -> (B, *measurement_shape), torch ops only (autograd differentiates it).
    On construction it is applied to a batch of a mid-grey and a seeded random image in [0, 1] and
    differentiated once (a non-tensor output, another shape or batch, a non-finite value or a map
    autograd cannot differentiate is an error naming it). Its measurement may lie anywhere (only
    finiteness is checked)."""

    measurement_range = None

    def __init__(self, A: Callable[[Tensor], Tensor], image_shape: Sequence[int], measurement_shape: Sequence[int],
                 name: str = "function", device: torch.device | str = "cpu", dtype: torch.dtype | None = None) -> None:
        super().__init__()
        if not callable(A):
            raise TypeError(f"A must be callable on a (B, *image_shape) tensor, got {type(A).__name__}")
        self.fn = A
        self.image_shape_ = as_shape(image_shape, "image_shape")
        self.measurement_shape_ = as_shape(measurement_shape, "measurement_shape")
        self.name = str(name)
        dtype = dtype or torch.get_default_dtype()
        x = torch.rand((2, *self.image_shape_), generator=torch.Generator().manual_seed(0), dtype=dtype).to(device)
        x[0] = 0.5
        y = self.A(x)
        if not torch.isfinite(y).all():
            raise ValueError(f"A gives non-finite values on images in [0, 1] of shape {tuple(x.shape)}")
        try:
            self.vjp(x, torch.ones_like(y))
        except (RuntimeError, TypeError) as e:
            raise TypeError(f"A must be differentiable by autograd (torch operations only): {e}") from e

    def A(self, x: Tensor) -> Tensor:
        out = self.fn(x)
        if not isinstance(out, Tensor):
            raise TypeError(f"A must return a torch.Tensor, got {type(out).__name__}")
        want = (x.shape[0], *self.measurement_shape_)
        if tuple(out.shape) != want:
            raise ValueError(f"A returned shape {tuple(out.shape)} for images of shape {tuple(x.shape)}; expected "
                             f"{want} (batch first, then measurement_shape)")
        return out

    def measurement_shape(self, image_shape: Sequence[int]) -> tuple[int, ...]:
        return (int(image_shape[0]), *self.measurement_shape_)

    def image_shape(self, measurement_shape: Sequence[int]) -> tuple[int, ...]:
        return (int(measurement_shape[0]), *self.image_shape_)
