"""Blur (convolution) operator with circular or mirror-reflect boundaries.

Convention: **true convolution** (as ``scipy.ndimage.convolve``), one 2-D kernel shared by all
channels, kernel centre at ``(kh // 2, kw // 2)``:

    (A x)[i, j] = sum_{a, b} k[a, b] * x[i - a + kh // 2, j - b + kw // 2]

with out-of-range indices resolved by the boundary rule. The output has the input's size.

* ``boundary="circular"``: periodic wrap (scipy mode ``"grid-wrap"``). Implemented by FFT; the
  operator is circulant, ``A x = ifft2(H * fft2(x)).real`` with ``H = transfer_function(h, w)``,
  and prox / pinv are closed form. Kernels larger than the image wrap around.
* ``boundary="reflect"``: mirror padding without repeating the edge pixel (``d c b | a b c d``),
  which is what DPS's ``nn.ReflectionPad2d`` does and scipy calls ``mode="mirror"``. Implemented
  as: gather the mirror-padded image, linear convolution on the padded grid by FFT, crop. Its
  adjoint is exact (zero-embed, correlate with the kernel on the padded grid, fold the padding
  back onto the pixels it copied). Prox and pinv use conjugate gradients (base class), so
  they are approximate for ill-conditioned kernels (see ``prox``'s max_iter / tol). Pads
  larger than the image reflect repeatedly, as scipy does.

DPS itself applies a cross-correlation; for the symmetric Gaussian kernel this is the same, for a
random motion kernel it is the kernel rotated by 180 degrees (same distribution).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
from torch import Tensor

from ..frequency import fourier_gaussian_mean
from .base import LinearOperator, check_image, prox_scales
from .kernels import normalize_kernel

__all__ = ["BlurOperator", "mirror_indices"]

_BOUNDARIES = ("circular", "reflect")


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


def _complex_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.complex128 if dtype == torch.float64 else torch.complex64


class BlurOperator(LinearOperator):
    """Same-size blur by a 2-D kernel shared across channels (see module docstring).

    Args:
        kernel: (kh, kw) tensor or array; normalised to sum 1 (its sum must be positive).
        boundary: ``"circular"`` (FFT, circulant) or ``"reflect"`` (mirror padding as DPS).
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
        two operators differ only within the kernel's half-width of the border."""
        return self._embedded_fft(int(h), int(w), True, torch.float64, None).abs().square().flatten()

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
        return tuple(image_shape)

    def image_shape(self, measurement_shape: Sequence[int]) -> tuple[int, ...]:
        return tuple(measurement_shape)

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
        ih, iw = self._mirror(h, w, x.device)
        xp = x.index_select(-2, ih).index_select(-1, iw)
        ph, pw = xp.shape[-2:]
        full = torch.fft.irfft2(torch.fft.rfft2(xp) * self._half(ph, pw, False, x), s=(ph, pw))
        return full[..., kh - 1:, kw - 1:]

    def A_adjoint(self, y: Tensor) -> Tensor:
        self._check(y, "y")
        h, w = y.shape[-2:]
        if self.boundary == "circular":
            Y = torch.fft.rfft2(y)
            return torch.fft.irfft2(Y * self._half(h, w, True, y).conj(), s=(h, w))
        kh, kw = self._k64.shape
        ih, iw = self._mirror(h, w, y.device)
        ph, pw = h + kh - 1, w + kw - 1
        yp = torch.nn.functional.pad(y, (kw - 1, 0, kh - 1, 0))
        zp = torch.fft.irfft2(torch.fft.rfft2(yp) * self._half(ph, pw, False, y).conj(), s=(ph, pw))
        out = y.new_zeros((*y.shape[:-1], pw)).index_add_(-2, ih, zp)
        return y.new_zeros(y.shape).index_add_(-1, iw, out)

    def A_pinv(self, y: Tensor, rcond: float | None = None) -> Tensor:
        """Pseudo-inverse. Circular: closed form in Fourier, frequencies with
        |H| <= rcond * max|H| are dropped (default rcond = sqrt(eps) of y's dtype: truncation and
        round-off errors of A A^+ A then both stay ~sqrt(eps)). Reflect: conjugate gradients."""
        if self.boundary != "circular":
            return super().A_pinv(y)
        self._check(y, "y")
        h, w = y.shape[-2:]
        H = self._half(h, w, True, y)
        if rcond is None:
            rcond = float(torch.finfo(y.dtype).eps) ** 0.5
        mag = H.abs()
        keep = mag > rcond * mag.max()
        inv = torch.where(keep, 1.0 / torch.where(keep, H, torch.ones_like(H)), torch.zeros_like(H))
        return torch.fft.irfft2(torch.fft.rfft2(y) * inv, s=(h, w))

    def prox(self, y: Tensor, z: Tensor, sigma_y: float | Tensor, r: float | Tensor,
             max_iter: int = 100, tol: float = 1e-6) -> Tensor:
        """argmin_x ||y - A x||^2/(2 sigma_y^2) + ||x - z||^2/(2 r^2).

        Circular: exact, by FFT (max_iter and tol unused; r = inf allowed). Reflect: conjugate
        gradients (base class; a circulant preconditioner was measured not to help here).
        """
        if self.boundary != "circular":
            return super().prox(y, z, sigma_y, r, max_iter, tol)
        self._check(y, "y")
        self._check(z, "z")
        if y.shape != z.shape:
            raise ValueError(f"y and z must have the same shape for a blur, got {tuple(y.shape)} and {tuple(z.shape)}")
        s2, r2 = prox_scales(sigma_y, r, z)
        inv_r2 = torch.where(torch.isinf(r2), torch.zeros_like(r2), 1.0 / r2)
        h, w = z.shape[-2:]
        H = self._half(h, w, True, z)
        X = fourier_gaussian_mean(H, torch.fft.rfft2(y), s2, prior_mean=torch.fft.rfft2(z), prior_precision=inv_r2)
        return torch.fft.irfft2(X, s=(h, w))
