"""A Gaussian-mixture image prior with stationary components: an exact non-Gaussian oracle.

p(x) = sum_k pi_k N(x; mu_k, Sigma_k), Sigma_k = F^H diag(S_k) F per channel (F the orthonormal
2-D DFT), so every quantity a posterior sampler needs stays closed-form with FFTs while the
denoiser is non-linear: at noise sigma it averages the components with responsibilities
r_k(x, sigma) computed from their evidences, as in the Gaussian-mixture benchmarks of Cardoso et
al. (2023, "Monte Carlo guided diffusion for Bayesian linear inverse problems").

* log N(x; mu_k, Sigma_k + sigma^2 I) = -1/2 sum_omega [|F(x - mu_k)|^2 / (S_k + sigma^2)
  + log(2 pi (S_k + sigma^2))], summed over channels; responsibilities are its softmax over k
  (with log pi_k), in float64 with logsumexp.
* D(x, sigma) = sum_k r_k [mu_k + F^H (S_k / (S_k + sigma^2)) F (x - mu_k)].
* For y = h (*) x + n (circulant blur or denoising, transfer function h, n ~ N(0, sigma_y^2 I))
  the posterior is again a mixture of Fourier-diagonal Gaussians (:class:`MixturePosterior`):
  weights pi'_k ∝ pi_k N(y; h mu_k, |h|^2 S_k + sigma_y^2), means
  m_k = mu_k + F^H [S_k h^* / (|h|^2 S_k + sigma_y^2)] F (y - h mu_k) and variances
  V_k = S_k sigma_y^2 / (|h|^2 S_k + sigma_y^2).

Conventions are those of :mod:`nfc_dps.priors.gaussian`: images (B, C, H, W) in model units
([-1, 1] plus whatever the components spread), sigmas in the same units, orthonormal FFTs on the
unshifted ``fftfreq`` grid, spectra symmetric (S(omega) = S(-omega), as a real image's are).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ..frequency import fourier_filter, frequency_radius, smooth_power_law
from ..operators.base import LinearOperator
from .base import Prior

__all__ = ["GaussianMixturePrior", "MixturePosterior", "MIXTURE_SETTINGS"]

#: the structured settings of :meth:`GaussianMixturePrior.structured`
MIXTURE_SETTINGS = ("well", "poor")


def _mixture_log_evidence(x: Tensor, sigma: Tensor, log_weights: Tensor, means: Tensor, spectra: Tensor
                          ) -> tuple[Tensor, Tensor, Tensor]:
    """(log_ev (B, K), R (B, K, C, H, W) complex, v (B, K, 1|C, H, W)) of x under each component at noise sigma.

    x: (B, C, H, W) float64; sigma: (B,); log_weights: (K,) or (B, K); means: (K, C, H, W) or
    (B, K, C, H, W); spectra: (K, 1|C, H, W). R = F(x - mu_k), v = S_k + sigma^2.
    """
    c, h, w = x.shape[-3:]
    resid = torch.fft.fft2(x[:, None] - means, norm="ortho")
    v = spectra + sigma.view(-1, 1, 1, 1, 1) ** 2
    quad = (resid.real**2 + resid.imag**2).div(v).sum((-3, -2, -1))
    logdet = v.log().sum((-3, -2, -1)) * (c // spectra.shape[-3])
    log_ev = log_weights - 0.5 * (quad + logdet + c * h * w * math.log(2 * math.pi))
    return log_ev, resid, v


def _mixture_denoise(x: Tensor, sigma: Tensor, log_weights: Tensor, means: Tensor, spectra: Tensor) -> Tensor:
    """E[x0 | x0 + sigma n = x] for x0 ~ sum_k w_k N(means_k, F^H diag(spectra_k) F); shapes as
    :func:`_mixture_log_evidence`, returns (B, C, H, W) float64."""
    log_ev, resid, v = _mixture_log_evidence(x, sigma, log_weights, means, spectra)
    resp = torch.softmax(log_ev, dim=1)
    shrunk = torch.fft.ifft2(resid * (spectra / v), norm="ortho").real
    return (resp[:, :, None, None, None] * (means + shrunk)).sum(1)


def _check_spectra(spectra: Tensor) -> None:
    if not bool(torch.isfinite(spectra).all()) or not bool((spectra > 0).all()):
        raise ValueError(f"spectra must be finite and > 0 everywhere (min {float(spectra.min()):.3g})")
    mirrored = torch.roll(torch.flip(spectra, dims=(-2, -1)), shifts=(1, 1), dims=(-2, -1))  # S(-omega)
    if not torch.allclose(spectra, mirrored, rtol=1e-9, atol=0.0):
        raise ValueError("spectra must be symmetric, S(omega) = S(-omega) (the power spectrum of a real image)")


class GaussianMixturePrior(Prior):
    """x ~ sum_k pi_k N(mu_k, F^H diag(S_k) F) on (C, H, W) images in model units (see module doc).

    Args:
        means: (K, C, H, W) component means mu_k (model units).
        spectra: (K, 1|C, H, W) per-frequency variances S_k on the full ``fftfreq`` grid (model
            units^2 per orthonormal Fourier coefficient; one channel = shared by all channels).
        weights: (K,) positive mixture weights (normalised here).
    Stored in float64; the image size is fixed at construction.
    """

    def __init__(self, means: Tensor, spectra: Tensor, weights: Tensor) -> None:
        super().__init__()
        means = torch.as_tensor(means, dtype=torch.float64)
        spectra = torch.as_tensor(spectra, dtype=torch.float64)
        weights = torch.as_tensor(weights, dtype=torch.float64)
        if means.ndim != 4:
            raise ValueError(f"means must be (K, C, H, W), got shape {tuple(means.shape)}")
        k, c, h, w = means.shape
        if spectra.ndim != 4 or spectra.shape[0] != k or spectra.shape[1] not in (1, c) or spectra.shape[-2:] != (h, w):
            raise ValueError(f"spectra must be ({k}, 1 or {c}, {h}, {w}) for means of shape {tuple(means.shape)}, "
                             f"got {tuple(spectra.shape)}")
        if weights.shape != (k,) or not bool(torch.isfinite(weights).all()) or not bool((weights > 0).all()):
            raise ValueError(f"weights must be ({k},) finite and > 0, got {weights.tolist()}")
        if not bool(torch.isfinite(means).all()):
            raise ValueError("means contain NaN or Inf")
        _check_spectra(spectra)
        self.register_buffer("means", means, persistent=False)
        self.register_buffer("spectra", spectra, persistent=False)
        self.register_buffer("log_weights", (weights / weights.sum()).log(), persistent=False)
        self.channels, self.size = c, (h, w)
        self.sigma_min, self.sigma_max, self.size_multiple = 1e-4, 1e4, 1

    @property
    def fixed_size(self) -> tuple[int, int]:
        return self.size

    @property
    def num_components(self) -> int:
        return int(self.means.shape[0])

    @property
    def weights(self) -> Tensor:
        """(K,) float64 mixture weights pi_k (sum 1)."""
        return self.log_weights.exp()

    def extra_repr(self) -> str:
        return f"components={self.num_components}, channels={self.channels}, size={self.size}"

    # ----------------------------------------------------------------- construction

    @classmethod
    def structured(cls, size: int | tuple[int, int], channels: int = 1, setting: str = "well",
                   generator: torch.Generator | None = None) -> "GaussianMixturePrior":
        """Three components with distinct structured means and their own power law S_k.

        ``setting``:
        * "well": a disk, horizontal stripes and diagonal stripes (period size/4), amplitude
          ~0.4, each with a pixel std of 0.10-0.15 (alpha 2, 2.5, 3): the means differ at low
          frequencies, far beyond the components' spread (RMS distance ~0.4 vs std ~0.15).
        * "poor": one smooth blob shared by all, plus a vertical and a horizontal grating at
          ~0.34 cycles/pixel (period ~3 px) and a band-passed random texture (0.3-0.5
          cycles/pixel, drawn from ``generator``), amplitude 0.25; power laws with alpha 1.5,
          2, 2.5 that agree at |omega| = 0.08 cycles/pixel (the alpha-2 one has pixel std 0.2).
          Means and spectra differ mainly at high frequency, where a blur removes them.
        RGB (``channels=3``): the means are tinted per component, the spectra shared by channels.
        Weights (0.45, 0.35, 0.2) ("well") and (0.4, 0.35, 0.25) ("poor").
        """
        h, w = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
        if min(h, w) < 4:
            raise ValueError(f"structured settings need images of at least 4x4, got {h}x{w}")
        if setting not in MIXTURE_SETTINGS:
            raise ValueError(f"setting must be one of {MIXTURE_SETTINGS}, got {setting!r}")
        if channels < 1:
            raise ValueError(f"channels must be >= 1, got {channels}")
        g = generator if generator is not None else torch.Generator().manual_seed(0)
        yy = torch.arange(h, dtype=torch.float64)[:, None].expand(h, w)
        xx = torch.arange(w, dtype=torch.float64)[None, :].expand(h, w)
        two_pi = 2 * math.pi
        if setting == "well":
            radius = ((yy - h / 2) ** 2 + (xx - w / 2) ** 2).sqrt()
            disk = 0.4 * torch.tanh((0.3 * min(h, w) - radius) / 1.0)
            horizontal = 0.4 * torch.cos(two_pi * 4 * yy / h)
            diagonal = 0.4 * torch.cos(two_pi * 4 * (yy / h + xx / w))
            bases = [disk, horizontal, diagonal]
            laws = [(2.0, 0.12), (2.5, 0.15), (3.0, 0.10)]
            weights = [0.45, 0.35, 0.2]
        else:
            blob = 0.3 * torch.exp(-((yy - h / 2) ** 2 + (xx - w / 2) ** 2) / (2 * (0.25 * min(h, w)) ** 2)) - 0.1
            fy, fx = max(1, round(0.34 * h)), max(1, round(0.34 * w))  # on the grid: periodic images
            vertical = 0.25 * torch.cos(two_pi * fx * xx / w)
            horizontal = 0.25 * torch.cos(two_pi * fy * yy / h)
            r = frequency_radius(h, w)
            band = ((r >= 0.3) & (r <= 0.5)).to(torch.float64)
            noise = fourier_filter(torch.randn(h, w, generator=g, dtype=torch.float64), band)
            texture = 0.25 * noise / noise.pow(2).mean().sqrt().clamp_min(1e-12) / math.sqrt(2)
            bases = [blob + vertical, blob + horizontal, blob + texture]
            laws = [(1.5, 0.2), (2.0, 0.2), (2.5, 0.2)]
            weights = [0.4, 0.35, 0.25]
        tints = torch.tensor([[1.0, 0.6, 0.3], [0.4, 1.0, 0.6], [0.6, 0.4, 1.0]], dtype=torch.float64)
        means = torch.stack([
            torch.stack([b * (float(tints[i, ch % 3]) if channels > 1 else 1.0) for ch in range(channels)])
            for i, b in enumerate(bases)])
        omega0 = 1.0 / max(h, w)
        spectra = []
        for alpha, pixel_std in laws:
            unit = smooth_power_law(h, w, 1.0, alpha, omega0)
            spectra.append(unit * (pixel_std**2 / float(unit.mean())))
        if setting == "poor":  # the same variance at |omega| = 0.08 as the alpha-2 law: they part at high frequency
            r2 = frequency_radius(h, w) ** 2
            pivot = float(spectra[1].flatten()[0]) * ((0.08**2 + omega0**2) / omega0**2) ** (-laws[1][0] / 2)
            spectra = [pivot * ((r2 + omega0**2) / (0.08**2 + omega0**2)) ** (-alpha / 2) for alpha, _ in laws]
        return cls(means, torch.stack(spectra)[:, None], torch.tensor(weights))

    # ----------------------------------------------------------------- evidences, denoising

    def _check_images(self, x: Tensor, what: str = "image") -> None:
        if x.ndim != 4 or x.shape[1] != self.channels or tuple(x.shape[-2:]) != self.size:
            raise ValueError(f"GaussianMixturePrior models ({self.channels}, {self.size[0]}, {self.size[1]}) "
                             f"images, got a {what} of shape {tuple(x.shape)}")

    def _sigma(self, sigma: Tensor | float, x: Tensor) -> Tensor:
        sigma = torch.as_tensor(sigma, dtype=torch.float64, device=x.device)
        sigma = sigma.expand(x.shape[0]) if sigma.ndim == 0 else sigma
        if sigma.shape != (x.shape[0],) or bool((sigma < 0).any()):
            raise ValueError(f"sigma must be >= 0, a scalar or ({x.shape[0]},), got {sigma.tolist()}")
        return sigma

    def log_evidence(self, x: Tensor, sigma: Tensor | float) -> Tensor:
        """(B, K) float64 log pi_k + log N(x; mu_k, Sigma_k + sigma^2 I); x (B, C, H, W) model units."""
        self._check_images(x)
        return _mixture_log_evidence(x.to(torch.float64), self._sigma(sigma, x), self.log_weights,
                                     self.means, self.spectra)[0]

    def responsibilities(self, x: Tensor, sigma: Tensor | float) -> Tensor:
        """(B, K) float64 p(k | x0 + sigma n = x): the softmax of :meth:`log_evidence`."""
        return torch.softmax(self.log_evidence(x, sigma), dim=1)

    def assign(self, x: Tensor) -> Tensor:
        """(B,) long: the component of largest p(k | x) = pi_k N(x; mu_k, Sigma_k) / p(x) (sigma 0)."""
        return self.log_evidence(x, 0.0).argmax(1)

    def denoise(self, x: Tensor, sigma: Tensor) -> Tensor:
        """Exact MMSE denoiser D(x, sigma) (module doc); x (B, C, H, W), sigma (B,), model units.
        Computed in float64, returned in x's dtype; differentiable in x."""
        self._check_images(x)
        out = _mixture_denoise(x.to(torch.float64), self._sigma(sigma, x), self.log_weights, self.means, self.spectra)
        return out.to(x.dtype)

    def spectrum(self, h: int | None = None, w: int | None = None) -> Tensor:
        """(H, W) float64 Fourier diagonal of the mixture's covariance, channel-averaged:
        sum_k pi_k (S_k + |F(mu_k - mean)|^2). The best stationary approximation, not the exact
        covariance (which is not Fourier-diagonal), so ``spectrum_is_exact`` stays False."""
        if (h, w) not in ((None, None), self.size):
            raise ValueError(f"GaussianMixturePrior is built for {self.size}, asked for a spectrum at {(h, w)}")
        pi = self.weights.view(-1, 1, 1, 1)
        centred = torch.fft.fft2(self.means - (pi * self.means).sum(0), norm="ortho").abs() ** 2
        return (pi * (self.spectra + centred)).sum(0).mean(0)

    # ----------------------------------------------------------------- sampling, posterior

    def _draw(self, component: Tensor, means: Tensor, spectra: Tensor, generator: torch.Generator | None) -> Tensor:
        """means[component] + F^H sqrt(spectra[component]) F z, z white (real); component (...,) long."""
        z = torch.randn((*component.shape, self.channels, *self.size), generator=generator, dtype=torch.float64,
                        device=self.means.device)
        return means + fourier_filter(z, spectra[component].sqrt())

    def sample_prior(self, n: int, generator: torch.Generator | None = None, return_components: bool = False,
                     dtype: torch.dtype = torch.float64) -> Tensor | tuple[Tensor, Tensor]:
        """(n, C, H, W) exact draws from p(x) (model units); with ``return_components`` also their (n,) components."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        comp = torch.multinomial(self.weights, n, replacement=True, generator=generator)
        x = self._draw(comp, self.means[comp], self.spectra, generator).to(dtype)
        return (x, comp) if return_components else x

    def posterior(self, operator: LinearOperator, y_m: Tensor, sigma_y_m: float) -> "MixturePosterior":
        """Exact p(x | y) for y_m = h (*) x + n, n ~ N(0, sigma_y_m^2 I), all in model units.

        operator: a :class:`~nfc_dps.operators.base.LinearOperator` that declares itself circulant
        (``is_circulant``: ``BlurOperator(..., "circular")``, ``Denoising``); its
        ``transfer_function`` gives h; y_m: (B, C, H, W); sigma_y_m > 0.
        """
        if not (isinstance(operator, LinearOperator) and operator.is_circulant):
            raise ValueError(f"the exact mixture posterior needs a circulant operator with a transfer function "
                             f"(circular blur or denoising), got {type(operator).__name__}")
        if not (math.isfinite(sigma_y_m) and sigma_y_m > 0):
            raise ValueError(f"sigma_y_m must be finite and > 0 (model units), got {sigma_y_m}")
        self._check_images(y_m, "measurement y_m")
        hf = operator.transfer_function(*self.size, dtype=torch.float64, device=y_m.device).to(torch.complex128)
        s2 = float(sigma_y_m) ** 2
        S, M = self.spectra, torch.fft.fft2(self.means, norm="ortho")
        den = (hf.real**2 + hf.imag**2) * S + s2  # (K, 1|C, H, W)
        resid = torch.fft.fft2(y_m.to(torch.float64), norm="ortho")[:, None] - hf * M  # (B, K, C, H, W)
        c, h, w = y_m.shape[-3:]
        quad = (resid.real**2 + resid.imag**2).div(den).sum((-3, -2, -1))
        logdet = den.log().sum((-3, -2, -1)) * (c // S.shape[-3])
        log_w = torch.log_softmax(self.log_weights - 0.5 * (quad + logdet), dim=1)
        means = torch.fft.ifft2(M + S * hf.conj() / den * resid, norm="ortho").real
        return MixturePosterior(self, log_w, means, S * s2 / den)


@dataclass(frozen=True)
class MixturePosterior:
    """p(x | y) of a :class:`GaussianMixturePrior`: sum_k pi'_k N(m_k, F^H diag(V_k) F), per measurement.

    log_weights: (B, K) float64 log pi'_k; means: (B, K, C, H, W) m_k; variances: (K, 1|C, H, W) V_k
    (the same for every measurement). Model units throughout.
    """

    prior: GaussianMixturePrior
    log_weights: Tensor
    means: Tensor
    variances: Tensor

    @property
    def weights(self) -> Tensor:
        """(B, K) float64 posterior component weights pi'_k."""
        return self.log_weights.exp()

    def mean(self) -> Tensor:
        """(B, C, H, W) float64 E[x | y] = sum_k pi'_k m_k (the MMSE estimate)."""
        return (self.weights[:, :, None, None, None] * self.means).sum(1)

    def mmse(self) -> Tensor:
        """(B,) float64 per-pixel posterior variance tr Cov(x | y) / (C H W): the expected squared
        error of :meth:`mean`; an exact posterior sample has twice it."""
        pi = self.weights
        within = self.variances.mean((-3, -2, -1))  # (K,)
        spread = (self.means - self.mean()[:, None]).pow(2).mean((-3, -2, -1))  # (B, K)
        return (pi * (within + spread)).sum(1)

    def sample(self, n: int, generator: torch.Generator | None = None, return_components: bool = False
               ) -> Tensor | tuple[Tensor, Tensor]:
        """(n, B, C, H, W) float64 exact posterior draws: k ~ pi', then N(m_k, V_k) filtered in Fourier;
        with ``return_components`` also the (n, B) drawn components."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        b = self.means.shape[0]
        comp = torch.multinomial(self.weights, n, replacement=True, generator=generator).T  # (n, B)
        means = self.means[torch.arange(b, device=comp.device)[None, :], comp]
        x = self.prior._draw(comp, means, self.variances, generator)
        return (x, comp) if return_components else x

    def assign(self, x: Tensor) -> Tensor:
        """(B,) long components of samples x (B, C, H, W): argmax p(k | x), which y does not change."""
        return self.prior.assign(x)

    def conditional_mean(self, x: Tensor, sigma: float | Tensor) -> Tensor:
        """(B, C, H, W) float64 E[x0 | x0 + sigma n = x, y]: the posterior mixture denoised at sigma.

        Per component the two observations (x at noise sigma, y through h) are Fourier-diagonal:
        p(x | y, k) = N(m_k, V_k + sigma^2), so the responsibilities and means are those of a
        mixture with means m_k and spectra V_k. x: (B, C, H, W), one per measurement, model units.
        """
        self.prior._check_images(x)
        if x.shape[0] != self.means.shape[0]:
            raise ValueError(f"x has {x.shape[0]} images for {self.means.shape[0]} measurements")
        return _mixture_denoise(x.to(torch.float64), self.prior._sigma(sigma, x), self.log_weights, self.means,
                                self.variances)
