"""Blur (convolution) operator with circular, mirror-reflect or unknown ("valid") boundaries.

Convention: **true convolution** (as ``scipy.ndimage.convolve``), one 2-D kernel shared by all
channels, kernel centre at ``(kh // 2, kw // 2)``:

    (A x)[i, j] = sum_{a, b} k[a, b] * x[i - a + kh // 2, j - b + kw // 2]

with out-of-range indices resolved by the boundary rule. The output has the input's size.

* ``boundary="circular"``: periodic wrap (scipy mode ``"grid-wrap"``). Implemented by FFT; the
  operator is circulant, ``A x = ifft2(H * fft2(x)).real`` with ``H = transfer_function(h, w)``:
  its decomposition is Fourier, and prox / pinv are closed form. Kernels larger than the image wrap around.
* ``boundary="reflect"``: mirror padding without repeating the edge pixel (``d c b | a b c d``),
  which is what DPS's ``nn.ReflectionPad2d`` does and scipy calls ``mode="mirror"``. Implemented
  as: gather the mirror-padded image, linear convolution on the padded grid by FFT, crop. Its
  adjoint is exact (zero-embed, correlate with the kernel on the padded grid, fold the padding
  back onto the pixels it copied). Prox and pinv use conjugate gradients, so they are
  approximate (see ``prox``'s max_iter / tol). Pads larger than the image reflect repeatedly, as
  scipy does. The FFTs run on grids of fast lengths (:func:`fast_fft_size`).
* ``boundary="valid"``: nothing is assumed beyond the border. The measurement is the part of the
  convolution that the image fully determines (scipy ``convolve2d(mode="valid")``): an (H, W)
  image gives an (H - kh + 1, W - kw + 1) measurement, and the image that a measurement of (h, w)
  restores is (h + kh - 1, w + kw - 1): the measured scene plus a band of (kh - 1) // 2 px (top)
  / kh // 2 (bottom), likewise for columns, that the blur mixed into the measured pixels. This is
  how a photograph is blurred (the scene continues past the frame). Measurement pixel (i, j) sits
  over image pixel (i + kh - 1 - kh // 2, j + kw - 1 - kw // 2). Implemented by FFT on the image
  grid (the valid part never wraps); prox and pinv by conjugate gradients preconditioned with the
  circular blur's closed form.

DPS itself applies a cross-correlation; for the symmetric Gaussian kernel this is the same, for a
random motion kernel it is the kernel rotated by 180 degrees (same distribution).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
from torch import Tensor

from .base import LinearOperator, check_image, conjugate_gradient, normal_equations_prox, prox_scales
from .decomposition import FourierDecomposition
from .kernels import normalize_kernel

__all__ = ["BlurOperator", "KernelLargerThanMeasurement", "fast_fft_size", "mirror_indices"]

_BOUNDARIES = ("circular", "reflect", "valid")
#: relative residual at which the conjugate-gradient prox of a reflect or valid blur stops, per
#: boundary: tight enough that NFC's and DPIR's restorations keep the PSNR of a converged solve,
#: loose enough that the solve costs a fraction of a network call. A valid blur's band beyond the
#: measured pixels is determined only weakly and needs the tighter solve.
PROX_TOL = {"reflect": 3e-4, "valid": 1e-4}


def mirror_indices(n: int, before: int, after: int) -> np.ndarray:
    """Source index of each pixel of a length-n signal mirror-padded by (before, after).

    Mirror = reflect about the edge pixel without repeating it (period 2(n - 1)).
    """
    idx = np.arange(-before, n + after)
    if n == 1:
        return np.zeros_like(idx)
    period = 2 * (n - 1)
    idx = np.mod(idx, period)
    return np.where(idx >= n, period - idx, idx)


def fast_fft_size(n: int) -> int:
    """The smallest m >= n whose prime factors are 2, 3 and 5: an FFT length that is fast (a prime
    factor such as 79 in 316 = 4 * 79 makes an FFT several times slower)."""
    m = max(int(n), 1)
    while True:
        k = m
        for p in (2, 3, 5):
            while k % p == 0:
                k //= p
        if k == 1:
            return m
        m += 1


class KernelLargerThanMeasurement(ValueError):
    """A valid-boundary blur whose kernel is larger than its image or measurement."""


def _complex_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.complex128 if dtype == torch.float64 else torch.complex64


class BlurOperator(LinearOperator):
    """Same-size blur by a 2-D kernel shared across channels (see module docstring).

    Args:
        kernel: (kh, kw) tensor or array; normalised to sum 1 (its sum must be positive).
        boundary: ``"circular"`` (FFT, circulant), ``"reflect"`` (mirror padding as DPS) or
            ``"valid"`` (the scene beyond the border unknown: the measurement is smaller).
    """

    name = "blur"
    family = "blur"

    def __init__(self, kernel: Tensor | np.ndarray, boundary: str = "circular") -> None:
        super().__init__()
        if boundary not in _BOUNDARIES:
            raise ValueError(f"boundary must be one of {_BOUNDARIES}, got {boundary!r}")
        k = normalize_kernel(kernel, "BlurOperator kernel")
        self.boundary = boundary
        self.register_buffer("kernel", k)
        k64 = k.double().numpy()
        self._k64 = k64 / k64.sum()  # exact DC gain 1 in float64
        self._cache: dict[tuple, Tensor] = {}

    @property
    def is_circulant(self) -> bool:
        return self.boundary == "circular"

    def blur_kernel(self) -> Tensor:
        """The (kh, kw) float32 kernel, normalised to sum 1 (the ``kernel`` buffer)."""
        return self.kernel

    def approximate_gram_eigenvalues(self, h: int, w: int) -> Tensor:
        """Circular: the exact |H|^2. Reflect: those of the circular blur with the same kernel; the
        two operators differ only within the kernel's half-width of the border. Valid: those too,
        with the smallest set to 0 so that as many are nonzero as there are measurements (the rank
        of A)."""
        gram = self._embedded_fft(int(h), int(w), True, torch.float64, None).abs().square().flatten()
        if self.boundary != "valid":
            return gram
        mh, mw = self.measurement_shape((int(h), int(w)))
        order = torch.argsort(gram, descending=True)
        return gram.clone().index_fill_(0, order[mh * mw:], 0.0)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "kernel_shape": list(self.kernel.shape), "boundary": self.boundary}

    def extra_repr(self) -> str:
        return f"kernel={tuple(self.kernel.shape)}, boundary={self.boundary!r}"

    # ------------------------------------------------------------------ transfer functions
    def _embedded_fft(self, h: int, w: int, centred: bool, dtype: torch.dtype, device) -> Tensor:
        """fft2 of the kernel embedded in an h x w grid; ``centred``: its centre at the origin
        (circular convolution), else its [0, 0] entry at the origin (linear convolution)."""
        key = (h, w, centred, dtype, torch.device(device) if device is not None else torch.device("cpu"))
        hit = self._cache.get(key)
        if hit is None:
            kh, kw = self._k64.shape
            ch, cw = (kh // 2, kw // 2) if centred else (0, 0)
            grid = np.zeros((h, w))
            rows = np.mod(np.arange(kh) - ch, h)
            cols = np.mod(np.arange(kw) - cw, w)
            np.add.at(grid, (rows[:, None], cols[None, :]), self._k64)  # wraps kernels larger than the grid
            hit = torch.fft.fft2(torch.from_numpy(grid)).to(_complex_dtype(dtype)).to(key[-1])
            self._cache[key] = hit
        return hit

    def transfer_function(self, h: int, w: int, dtype: torch.dtype = torch.float32,
                          device: torch.device | str | None = None) -> Tensor:
        """Complex (h, w) transfer function H of the circular blur: A x = ifft2(H * fft2(x)).real.

        fft2 of the kernel embedded in an h x w grid with its centre (kh//2, kw//2) at the
        origin; cached per shape (shared: do not modify in place). complex64 unless ``dtype``
        is float64. Circular only.
        """
        if self.boundary != "circular":
            raise ValueError(f"transfer_function is defined for boundary='circular' only, this operator has boundary={self.boundary!r}")
        return self._embedded_fft(int(h), int(w), True, dtype, device)

    def _half(self, h: int, w: int, centred: bool, x: Tensor) -> Tensor:
        return self._embedded_fft(h, w, centred, x.dtype, x.device)[:, : w // 2 + 1]

    # ------------------------------------------------------------------ checks and shapes
    def _check(self, x: Tensor, name: str) -> None:
        check_image(x, name)
        if self.boundary == "reflect" and min(x.shape[-2:]) < 1:
            raise ValueError(f"{name} must be non-empty, got shape {tuple(x.shape)}")

    def measurement_shape(self, image_shape: Sequence[int]) -> tuple[int, ...]:
        if self.boundary != "valid":
            return tuple(image_shape)
        kh, kw = self._k64.shape
        h, w = image_shape[-2] - kh + 1, image_shape[-1] - kw + 1
        if h < 1 or w < 1:
            raise KernelLargerThanMeasurement(
                f"boundary='valid': the {kh}x{kw} blur kernel is larger than the {image_shape[-2]}x{image_shape[-1]} "
                f"image, which leaves no measurement (use a smaller kernel or boundary 'reflect')")
        return (*image_shape[:-2], h, w)

    def image_shape(self, measurement_shape: Sequence[int]) -> tuple[int, ...]:
        """The image a measurement of ``measurement_shape`` is of. Valid boundary: larger by the kernel
        less one; a :class:`KernelLargerThanMeasurement` error when the kernel is larger than the
        measurement (most of the image would be scene the measurement never saw)."""
        if self.boundary != "valid":
            return tuple(measurement_shape)
        kh, kw = self._k64.shape
        mh, mw = measurement_shape[-2], measurement_shape[-1]
        if kh > mh or kw > mw:
            raise KernelLargerThanMeasurement(
                f"boundary='valid': the {kh}x{kw} blur kernel is larger than the {mh}x{mw} measurement (the "
                f"{mh + kh - 1}x{mw + kw - 1} restoration would be mostly scene it never saw); use a smaller kernel, "
                f"a larger image or boundary 'reflect'")
        return (*measurement_shape[:-2], mh + kh - 1, mw + kw - 1)

    def measured_frame(self, image_shape: Sequence[int]) -> tuple[int, int, int, int] | None:
        """(top, left, height, width) of the image region a valid-boundary measurement lies over (the
        photograph's frame; beyond it the restoration is the scene the blur mixed in); None for the
        other boundaries, whose measurement covers the whole image."""
        if self.boundary != "valid":
            return None
        h, w = self.measurement_shape(image_shape)[-2:]
        top, _, left, _ = self._pads()
        return top, left, h, w

    def _pads(self) -> tuple[int, int, int, int]:
        kh, kw = self._k64.shape
        ch, cw = kh // 2, kw // 2
        return kh - 1 - ch, ch, kw - 1 - cw, cw  # top, bottom, left, right

    def _mirror(self, h: int, w: int, device) -> tuple[Tensor, Tensor]:
        key = ("mirror", h, w, torch.device(device))
        hit = self._cache.get(key)
        if hit is None:
            t, b, l, r = self._pads()
            hit = (torch.from_numpy(mirror_indices(h, t, b)).to(device),
                   torch.from_numpy(mirror_indices(w, l, r)).to(device))
            self._cache[key] = hit
        return hit

    # ------------------------------------------------------------------ operator
    def A(self, x: Tensor) -> Tensor:
        self._check(x, "x")
        h, w = x.shape[-2:]
        if self.boundary == "circular":
            X = torch.fft.rfft2(x)
            return torch.fft.irfft2(X * self._half(h, w, True, x), s=(h, w))
        kh, kw = self._k64.shape
        if self.boundary == "valid":  # linear convolution of the image; its valid part
            self.measurement_shape(x.shape)
            return self._linear_valid(x)
        t, b, l, r = self._pads()
        if max(t, b) < h and max(l, r) < w:  # one reflection: torch's own padding
            return self._linear_valid(torch.nn.functional.pad(x, (l, r, t, b), mode="reflect"))
        ih, iw = self._mirror(h, w, x.device)
        return self._linear_valid(x.index_select(-2, ih).index_select(-1, iw))

    def _linear_valid(self, xp: Tensor) -> Tensor:
        """The valid part of the linear convolution of xp with the kernel, (ph - kh + 1, pw - kw + 1),
        by FFT on a grid of at least (ph, pw) (the valid part never wraps) of fast length."""
        kh, kw = self._k64.shape
        ph, pw = xp.shape[-2:]
        gh, gw = fast_fft_size(ph), fast_fft_size(pw)
        full = torch.fft.irfft2(torch.fft.rfft2(xp, s=(gh, gw)) * self._half(gh, gw, False, xp), s=(gh, gw))
        return full[..., kh - 1:ph, kw - 1:pw]

    def A_adjoint(self, y: Tensor) -> Tensor:
        self._check(y, "y")
        h, w = y.shape[-2:]
        if self.boundary == "circular":
            Y = torch.fft.rfft2(y)
            return torch.fft.irfft2(Y * self._half(h, w, True, y).conj(), s=(h, w))
        kh, kw = self._k64.shape
        ph, pw = h + kh - 1, w + kw - 1
        gh, gw = fast_fft_size(ph), fast_fft_size(pw)
        # zero-embed y where A's valid part sits, correlate with the kernel (the conjugate transfer
        # function) on a fast grid of at least (ph, pw): the correlation reaches back kh - 1 rows
        # and kw - 1 columns, into the zeros, never around the grid
        yp = torch.nn.functional.pad(y, (kw - 1, gw - pw, kh - 1, gh - ph))
        zp = torch.fft.irfft2(torch.fft.rfft2(yp) * self._half(gh, gw, False, y).conj(), s=(gh, gw))[..., :ph, :pw]
        if self.boundary == "valid":
            return zp
        ih, iw = self._mirror(h, w, y.device)
        out = y.new_zeros((*y.shape[:-1], pw)).index_add_(-2, ih, zp)
        return y.new_zeros(y.shape).index_add_(-1, iw, out)

    def decomposition(self) -> FourierDecomposition | None:
        """Circular: F^H diag(H) F (its prox and pseudo-inverse are then closed form). Reflect and
        valid: None."""
        return FourierDecomposition(self.transfer_function) if self.boundary == "circular" else None

    def A_pinv(self, y: Tensor) -> Tensor:
        """Pseudo-inverse. Circular: closed form in Fourier (:meth:`Decomposition.pinv`). Reflect
        and valid: unpreconditioned conjugate gradients on the normal equations (100 iterations
        from 0: an early-stopped, so regularised, pseudo-inverse)."""
        if self.boundary == "circular":
            return super().A_pinv(y)
        z = torch.zeros(self.image_shape(y.shape), dtype=y.dtype, device=y.device)
        return normal_equations_prox(self, y, z, 1.0, 1e4)

    def prox(self, y: Tensor, z: Tensor, sigma_y: float | Tensor, r: float | Tensor,
             max_iter: int = 100, tol: float | None = None) -> Tensor:
        """argmin_x ||y - A x||^2/(2 sigma_y^2) + ||x - z||^2/(2 r^2).

        Circular: exact, in Fourier (max_iter and tol unused; r = inf allowed). Reflect and valid:
        conjugate gradients from z, preconditioned by the circular blur's closed form
        (|H|^2 / sigma_y^2 + 1 / r^2)^-1 on the image grid, until the residual is below ``tol``
        times the right-hand side or for ``max_iter`` iterations (r = inf: unpreconditioned).
        ``tol`` None: the boundary's :data:`PROX_TOL`, what a restoration needs, not machine precision.
        """
        if self.boundary == "circular":
            return super().prox(y, z, sigma_y, r)
        return self._prox_cg(y, z, sigma_y, r, max_iter, PROX_TOL[self.boundary] if tol is None else tol)

    def _prox_cg(self, y: Tensor, z: Tensor, sigma_y: float | Tensor, r: float | Tensor, max_iter: int,
                 tol: float) -> Tensor:
        self._check(y, "y")
        self._check(z, "z")
        if tuple(y.shape) != tuple(self.measurement_shape(z.shape)):
            raise ValueError(f"y {tuple(y.shape)} is not the measurement of z {tuple(z.shape)} for this blur")
        s2, r2 = prox_scales(sigma_y, r, z)
        if bool(torch.isinf(r2).any()):
            return normal_equations_prox(self, y, z, sigma_y, r, max_iter, tol)
        h, w = z.shape[-2:]
        gram = self._half(h, w, True, z).abs().square()
        gain = 1.0 / (gram / s2 + 1.0 / r2)  # (B, 1, h, w // 2 + 1)
        rhs = self.A_adjoint(y) / s2 + z / r2
        return conjugate_gradient(lambda v: self.normal(v) / s2 + v / r2, rhs, z.clone(), max_iter, tol,
                                  precondition=lambda v: torch.fft.irfft2(torch.fft.rfft2(v) * gain, s=(h, w)))
