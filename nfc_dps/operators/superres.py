"""Super-resolution (downsampling) operators: antialiased bicubic and block averaging.

``method="bicubic"``: MATLAB ``imresize``-style downscaling by an integer factor s, as DPS's
resizer (REFERENCE 5.4). Separable; per axis the output pixel p (0-based) is centred at input
coordinate u = p s + (s - 1) / 2; its weights are the Keys cubic (a = -0.5) stretched by s,
w_j = cubic((u - j) / s) for |u - j| < 2 s (4 s taps: 16 for x4), normalised to sum 1; input
indices outside [0, n) are folded back by half-sample symmetric reflection (the edge pixel is
repeated: ... b a | a b ... , as MATLAB's and Shocher's resizers do). The two axes are explicit
weight matrices D_h (H/s x H) and D_w (W/s x W), cached per size, so
A x = D_h x D_w^T, A^T y = D_h^T y D_w, A^+ y = D_h^+ y (D_w^+)^T (Kronecker pseudo-inverse)
and the prox is closed form in the eigenbases of D_h^T D_h and D_w^T D_w.

``method="average"``: mean over s x s blocks. A A^T = I / s^2, so A^+ = s^2 A^T (nearest
upsampling) and the prox is closed form by Woodbury.

H and W must be divisible by s.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from .base import LinearOperator, check_image, prox_scales

__all__ = ["SuperResolution", "keys_cubic", "bicubic_matrix"]

_METHODS = ("bicubic", "average")


def keys_cubic(x: np.ndarray, a: float = -0.5) -> np.ndarray:
    """Keys cubic convolution kernel (a = -0.5: MATLAB's 'cubic'), support [-2, 2]."""
    ax = np.abs(np.asarray(x, dtype=np.float64))
    ax2, ax3 = ax**2, ax**3
    inner = (a + 2) * ax3 - (a + 3) * ax2 + 1
    outer = a * ax3 - 5 * a * ax2 + 8 * a * ax - 4 * a
    return np.where(ax <= 1, inner, np.where(ax < 2, outer, 0.0))


def _symmetric_index(j: np.ndarray, n: int) -> np.ndarray:
    """Half-sample symmetric reflection into [0, n): period 2n, edge pixel repeated."""
    j = np.mod(j, 2 * n)
    return np.where(j >= n, 2 * n - 1 - j, j)


def bicubic_matrix(n: int, factor: int) -> np.ndarray:
    """(n // factor, n) float64 matrix of antialiased bicubic downscaling along one axis."""
    s = int(factor)
    m = n // s
    u = np.arange(m) * s + 0.5 * (s - 1)  # input coordinate of each output centre
    half = 2 * s  # kernel half-width in input pixels
    left = np.floor(u - half).astype(np.int64)
    taps = np.arange(2 * half + 2)
    j = left[:, None] + taps[None, :]  # candidate input indices (a superset of the support)
    w = keys_cubic((u[:, None] - j) / s)
    w = w / w.sum(axis=1, keepdims=True)
    D = np.zeros((m, n))
    np.add.at(D, (np.repeat(np.arange(m), j.shape[1]), _symmetric_index(j, n).ravel()), w.ravel())
    return D


class SuperResolution(LinearOperator):
    """Downscaling by an integer ``factor`` >= 2 (``method``: 'bicubic' or 'average')."""

    family = "sr"

    def __init__(self, factor: int = 4, method: str = "bicubic") -> None:
        super().__init__()
        if isinstance(factor, bool) or not isinstance(factor, (int, np.integer)) or factor < 2:
            raise ValueError(f"factor must be an int >= 2, got {factor!r}")
        if method not in _METHODS:
            raise ValueError(f"method must be one of {_METHODS}, got {method!r}")
        self.factor = int(factor)
        self.method = method
        self.name = f"sr_{method}"
        self._np_cache: dict[int, dict[str, np.ndarray]] = {}
        self._cache: dict[tuple, Tensor] = {}

    def extra_repr(self) -> str:
        return f"factor={self.factor}, method={self.method!r}"

    @property
    def downsampling_factor(self) -> int:
        return self.factor

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "factor": self.factor, "method": self.method}

    # ------------------------------------------------------------------ shapes and checks
    def _check_image(self, x: Tensor, name: str) -> None:
        check_image(x, name)
        h, w = x.shape[-2:]
        if h % self.factor or w % self.factor:
            raise ValueError(f"{name} size {h}x{w} is not divisible by the SR factor {self.factor}")

    def measurement_shape(self, image_shape: Sequence[int]) -> tuple[int, ...]:
        *lead, h, w = image_shape
        if h % self.factor or w % self.factor:
            raise ValueError(f"image size {h}x{w} is not divisible by the SR factor {self.factor}")
        return (*lead, h // self.factor, w // self.factor)

    def image_shape(self, measurement_shape: Sequence[int]) -> tuple[int, ...]:
        *lead, h, w = measurement_shape
        return (*lead, h * self.factor, w * self.factor)

    # ------------------------------------------------------------------ bicubic matrices
    def _np(self, n: int) -> dict[str, np.ndarray]:
        hit = self._np_cache.get(n)
        if hit is None:
            D = bicubic_matrix(n, self.factor)
            lam, U = np.linalg.eigh(D.T @ D)
            hit = {"D": D, "Dt": D.T.copy(), "pinv": np.linalg.pinv(D), "lam": np.clip(lam, 0, None), "U": U}
            self._np_cache[n] = hit
        return hit

    def _mat(self, n: int, which: str, like: Tensor) -> Tensor:
        key = (n, which, like.dtype, like.device)
        hit = self._cache.get(key)
        if hit is None:
            hit = torch.from_numpy(self._np(n)[which]).to(dtype=like.dtype, device=like.device)
            self._cache[key] = hit
        return hit

    def matrices(self, h: int, w: int) -> tuple[Tensor, Tensor]:
        """Bicubic weight matrices (D_h, D_w), float64, A x = D_h x D_w^T."""
        if self.method != "bicubic":
            raise ValueError(f"matrices() is defined for method='bicubic', this operator is {self.method!r}")
        if h % self.factor or w % self.factor:
            raise ValueError(f"image size {h}x{w} is not divisible by the SR factor {self.factor}")
        return torch.from_numpy(self._np(h)["D"]), torch.from_numpy(self._np(w)["D"])

    def gram_eigenvalues(self, h: int, w: int) -> Tensor:
        """A^T A = (D_h^T D_h) kron (D_w^T D_w) (bicubic): the products of the two factors'
        eigenvalues; average: 1 / s^2 on the (h / s)(w / s) block means, 0 elsewhere."""
        if h % self.factor or w % self.factor:
            raise ValueError(f"image size {h}x{w} is not divisible by the SR factor {self.factor}")
        if self.method == "average":
            lam = torch.zeros(h * w, dtype=torch.float64)
            lam[: (h // self.factor) * (w // self.factor)] = 1.0 / self.factor**2
            return lam
        lh, lw = torch.from_numpy(self._np(h)["lam"]), torch.from_numpy(self._np(w)["lam"])
        return (lh[:, None] * lw[None, :]).flatten()

    # ------------------------------------------------------------------ operator
    def A(self, x: Tensor) -> Tensor:
        self._check_image(x, "x")
        if self.method == "average":
            return F.avg_pool2d(x, self.factor)
        h, w = x.shape[-2:]
        return self._mat(h, "D", x) @ x @ self._mat(w, "Dt", x)

    def A_adjoint(self, y: Tensor) -> Tensor:
        check_image(y, "y")
        s = self.factor
        if self.method == "average":
            return y.repeat_interleave(s, -2).repeat_interleave(s, -1) / (s * s)
        h, w = y.shape[-2] * s, y.shape[-1] * s
        return self._mat(h, "Dt", y) @ y @ self._mat(w, "D", y)

    def A_pinv(self, y: Tensor) -> Tensor:
        """Exact pseudo-inverse: nearest upsampling (average) or D_h^+ y D_w^+^T (bicubic)."""
        check_image(y, "y")
        s = self.factor
        if self.method == "average":
            return y.repeat_interleave(s, -2).repeat_interleave(s, -1)
        h, w = y.shape[-2] * s, y.shape[-1] * s
        return self._mat(h, "pinv", y) @ y @ self._mat(w, "pinv", y).transpose(0, 1)

    def prox(self, y: Tensor, z: Tensor, sigma_y: float | Tensor, r: float | Tensor,
             max_iter: int = 100, tol: float = 1e-6) -> Tensor:
        """Closed form (max_iter and tol unused); r = inf gives the limit z + A^+(y - A z).

        average: Woodbury with A A^T = I / s^2:
            x = r^2 b - r^4 / (sigma_y^2 + r^2 / s^2) A^T A b,  b = A^T y / sigma_y^2 + z / r^2,
            evaluated in the projector form below (stable for large r).
        bicubic: A^T A = (D_h^T D_h) kron (D_w^T D_w) = (U_h kron U_w) diag(l_h l_w^T) (...)^T,
            x = U_h [ (U_h^T b U_w) / (l_h l_w^T / sigma_y^2 + 1 / r^2) ] U_w^T, evaluated in the
            residual form below.
        """
        self._check_image(z, "z")
        check_image(y, "y")
        if tuple(y.shape) != self.measurement_shape(z.shape):
            raise ValueError(f"y has shape {tuple(y.shape)} but z of shape {tuple(z.shape)} needs {self.measurement_shape(z.shape)}")
        s2, r2 = prox_scales(sigma_y, r, z)
        inf = torch.isinf(r2)
        if self.method == "average":
            # With P = s^2 A^T A the orthogonal projector onto range(A^T), Woodbury gives
            # x = (I - P) z + kappa P b, kappa = r^2 s^2 sigma^2 / (s^2 sigma^2 + r^2): no
            # cancellation for large r, and r = inf gives z - P z + A^+ y.
            f2 = float(self.factor**2)
            kappa = torch.where(inf, f2 * s2, f2 * s2 * r2 / (f2 * s2 + r2))
            b = self.A_adjoint(y) / s2 + torch.where(inf, torch.zeros_like(z), z / r2)
            pz = self._project(z)
            return z - pz + kappa * self._project(b)
        # Residual form, x = z + U [(U^T A^T (y - A z) U) g] U^T with g = 1 / (l + sigma_y^2 / r^2)
        # on A's row space (l > 0) and 0 on its null space: the null-space eigenvalues come out of
        # eigh as round-off (~1e-16), which the textbook form above would divide by 1 / r^2, i.e.
        # amplify by r^2 (float32 errors of order 1 at DDNM's r = 157). r = inf needs no branch: g
        # = 1 / l there, the least-squares solution of A x = y closest to z.
        h, w = z.shape[-2:]
        Uh, Uw = self._mat(h, "U", z), self._mat(w, "U", z)
        lam = self._mat(h, "lam", z)[:, None] * self._mat(w, "lam", z)[None, :]
        row_space = lam > 1e-10 * lam.max()
        g = torch.where(row_space, 1.0 / (lam + s2 / r2), torch.zeros((), dtype=z.dtype, device=z.device))  # s2/inf = 0
        ct = Uh.transpose(0, 1) @ self.A_adjoint(y - self.A(z)) @ Uw
        return z + Uh @ (ct * g) @ Uw.transpose(0, 1)

    def _project(self, v: Tensor) -> Tensor:
        """Block means broadcast back (average method): s^2 A^T A, an orthogonal projector."""
        s = self.factor
        return F.avg_pool2d(v, s).repeat_interleave(s, -2).repeat_interleave(s, -1)
