"""A stationary Gaussian image prior with a power-law spectrum: an exact test oracle.

For this prior every quantity a posterior sampler needs is closed-form (a stationary Gaussian
is diagonal in the Fourier basis): the MMSE denoiser is a per-frequency Wiener gain S/(S+sigma^2), and for a
circulant blur with transfer function H the posterior of x given y = h * x + n is Gaussian with
per-frequency mean and variance. Samplers are tested against these. :meth:`GaussianSpectralPrior.fit`
fits the law to images with :func:`nfc_dps.frequency.fit_power_law` (``exact=True``).

Conventions (all functions of this module):

* Images are real tensors (..., C, h, w) in the model range [-1, 1] ("model units"); sigma and
  sigma_y are standard deviations in the same units (0.05 in model units = 0.025 in [0, 1]).
* Fourier transforms are orthonormal, ``torch.fft.fft2(x, norm="ortho")`` = F x. White noise of
  variance v has E|F n|^2 = v at every frequency, and S(omega) = E|F (x - mean)|^2(omega) is the
  variance of each orthonormal Fourier coefficient. The per-pixel variance is mean_omega S.
* Frequencies omega = (fy, fx) are those of ``torch.fft.fftfreq`` (cycles per pixel, each
  component in [-0.5, 0.5)); |omega| = sqrt(fy^2 + fx^2) is at most ~0.707
  (:func:`nfc_dps.frequency.frequency_radius`). S is :func:`nfc_dps.frequency.smooth_power_law`.
* A circulant blur y = h (*) x (circular convolution) has transfer function
  H = ``torch.fft.fft2`` (unnormalised) of the kernel embedded in an (h, w) array with its centre
  at pixel (0, 0) (see :func:`circulant_transfer`); then F y = H * F x exactly. Channels share S
  and H and are independent.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..frequency import corner_radius, fit_power_law, fourier_filter, fourier_gaussian_mean, smooth_power_law
from .base import Prior


def circulant_transfer(kernel: Tensor, h: int, w: int) -> Tensor:
    """(h, w) complex transfer function of circular convolution with ``kernel`` (kh, kw).

    The kernel's centre pixel (kh // 2, kw // 2) is placed at (0, 0), so a symmetric kernel gives a
    real H and the blurred image is not shifted: ``ifft2(H * fft2(x))`` = kernel (*) x (circular).
    """
    kernel = torch.as_tensor(kernel)
    kh, kw = kernel.shape[-2:]
    if kh > h or kw > w:
        raise ValueError(f"kernel {tuple(kernel.shape[-2:])} larger than the image ({h}, {w})")
    pad = torch.zeros(*kernel.shape[:-2], h, w, dtype=kernel.dtype, device=kernel.device)
    pad[..., :kh, :kw] = kernel
    pad = torch.roll(pad, shifts=(-(kh // 2), -(kw // 2)), dims=(-2, -1))
    return torch.fft.fft2(pad)


class GaussianSpectralPrior(Prior):
    """x ~ N(mean, Cov) with Cov = F^H diag(S) F per channel, S = amplitude (|omega|^2 + omega0^2)^(-alpha/2).

    The image size (h, w) is fixed at construction (S lives on that ``fftfreq`` grid); images are
    (B, C, h, w) in model units. See the module docstring for the conventions.

    Args:
        size: (h, w) of the images this prior models.
        alpha: power-law exponent (2 is typical of natural images).
        amplitude: S scale (model units^2 per orthonormal Fourier coefficient). ``None`` chooses it
            so that the per-pixel standard deviation (mean of S, square-rooted) is ``pixel_std``.
        omega0: low-frequency roll-off (cycles/pixel) keeping S finite at DC; ``None`` = 1/max(h, w).
        mean: the scalar mean of every pixel (model units).
        channels: C; channels are independent with the same S.
        pixel_std: used only when ``amplitude`` is None.
    """

    spectrum_is_exact = True

    def __init__(
        self,
        size: tuple[int, int],
        alpha: float = 2.0,
        amplitude: float | None = None,
        omega0: float | None = None,
        mean: float = 0.0,
        channels: int = 3,
        pixel_std: float = 0.5,
    ) -> None:
        super().__init__()
        h, w = (int(s) for s in size)
        if h < 1 or w < 1:
            raise ValueError(f"size must be positive, got {size}")
        self.size = (h, w)
        self.alpha = float(alpha)
        self.omega0 = float(1.0 / max(h, w) if omega0 is None else omega0)
        if self.omega0 <= 0 and self.alpha > 0:
            raise ValueError("omega0 must be > 0 (S would be infinite at DC)")
        if amplitude is None:
            unit = smooth_power_law(h, w, 1.0, self.alpha, self.omega0)
            amplitude = pixel_std**2 / float(unit.mean())
        if amplitude <= 0:
            raise ValueError(f"amplitude must be > 0, got {amplitude}")
        self.amplitude = float(amplitude)
        self.mean = float(mean)
        self.channels = int(channels)
        self.sigma_min, self.sigma_max, self.size_multiple = 1e-4, 1e4, 1
        self.register_buffer("S", smooth_power_law(h, w, self.amplitude, self.alpha, self.omega0), persistent=False)

    @classmethod
    def fit(
        cls,
        images: Tensor,
        size: tuple[int, int] | None = None,
        omega0: float | None = None,
        mean: float | None = None,
        channels: int | None = None,
        omega_min: float = 0.0,
        omega_max: float = 0.5,
    ) -> "GaussianSpectralPrior":
        """A prior with (amplitude, alpha) from :func:`nfc_dps.frequency.fit_power_law` (``exact=True``)
        on ``images`` (..., C, h, w), using the rings with |omega| in [omega_min, omega_max]
        cycles/pixel (default: all rings up to Nyquist, DC excluded).

        ``size`` defaults to the images' size, ``mean`` to their mean, ``channels`` to their C.
        """
        images = torch.as_tensor(images)
        corner = corner_radius(*images.shape[-2:])
        amp, alpha_t = fit_power_law(images, omega_min / corner, omega_max / corner, exact=True)
        alpha = float(alpha_t)
        amplitude = float(amp) * corner**alpha  # the fit is on the normalised radius, S here in cycles/pixel
        # E|F x|^2 per orthonormal coefficient is the process's power spectral density, a function
        # of omega in cycles/pixel only: the fitted law holds on a grid of any size.
        h, w = size or tuple(images.shape[-2:])
        if channels is None:
            channels = int(images.shape[-3]) if images.ndim >= 3 else 1
        mean = float(images.mean()) if mean is None else mean
        return cls((h, w), alpha=alpha, amplitude=amplitude, omega0=omega0, mean=mean, channels=channels)

    # ----------------------------------------------------------------- spectrum

    def spectrum(self, h: int | None = None, w: int | None = None) -> Tensor:
        """(h, w) float64 tensor S of this power law on an (h, w) ``fftfreq`` grid (default: own size)."""
        if h is None and w is None:
            return self.S.clone()
        h = self.size[0] if h is None else h
        w = self.size[1] if w is None else w
        return smooth_power_law(h, w, self.amplitude, self.alpha, self.omega0, device=self.S.device)

    def extra_repr(self) -> str:
        return (
            f"size={self.size}, alpha={self.alpha:.4g}, amplitude={self.amplitude:.4g}, "
            f"omega0={self.omega0:.4g}, mean={self.mean:.4g}, channels={self.channels}"
        )

    @property
    def fixed_size(self) -> tuple[int, int]:
        return self.size

    def _check_size(self, x: Tensor, what: str = "image") -> None:
        if tuple(x.shape[-2:]) != self.size:
            raise ValueError(
                f"GaussianSpectralPrior was built for {self.size[0]}x{self.size[1]} images, "
                f"got a {what} of size {x.shape[-2]}x{x.shape[-1]} (shape {tuple(x.shape)})"
            )

    def _mean_coefficients(self, like: Tensor) -> Tensor:
        """F(mean * 1): mean * sqrt(h w) at DC, zero elsewhere (complex, (h, w))."""
        m = torch.zeros(self.size, dtype=like.dtype, device=like.device)
        m[0, 0] = self.mean * math.sqrt(self.size[0] * self.size[1])
        return m

    # ----------------------------------------------------------------- sampling, denoising

    def sample(
        self,
        n: int,
        generator: torch.Generator | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> Tensor:
        """(n, C, h, w) samples: mean + F^-1[sqrt(S) F z], z white N(0, 1) (real, exactly Cov)."""
        device = self.S.device if device is None else device
        z = torch.randn(n, self.channels, *self.size, generator=generator, dtype=torch.float64, device=device)
        x = fourier_filter(z, self.S.to(device).sqrt())
        return (x + self.mean).to(dtype)

    def wiener_gain(self, sigma: Tensor | float) -> Tensor:
        """S / (S + sigma^2): the denoiser's per-frequency gain (its Jacobian). (B, h, w) or (h, w)."""
        sigma = torch.as_tensor(sigma, dtype=torch.float64, device=self.S.device)
        s2 = sigma.reshape(*sigma.shape, 1, 1) ** 2
        return self.S / (self.S + s2)

    def denoise(self, x: Tensor, sigma: Tensor) -> Tensor:
        """Exact MMSE denoiser E[x0 | x0 + sigma n = x] = mean + F^-1[S/(S+sigma^2) F(x - mean)].

        x: (B, C, h, w) with the construction size (error otherwise); sigma: (B,) (model units).
        Computed in float64, returned in x's dtype. Differentiable in x.
        """
        if x.ndim != 4:
            raise ValueError(f"denoise expects (B, C, h, w), got shape {tuple(x.shape)}")
        self._check_size(x)
        sigma = torch.as_tensor(sigma, device=x.device)
        if sigma.ndim == 0:
            sigma = sigma.expand(x.shape[0])
        gain = self.wiener_gain(sigma.to(self.S.device)).to(x.device)[:, None]  # (B, 1, h, w)
        return (fourier_filter(x.to(torch.float64) - self.mean, gain) + self.mean).to(x.dtype)

    # ----------------------------------------------------------------- posterior (circulant blur)

    def _transfer(self, H: Tensor | None, device) -> Tensor:
        if H is None:
            return torch.ones(self.size, dtype=torch.complex128, device=device)
        H = torch.as_tensor(H, device=device).to(torch.complex128)
        self._check_size(H, "transfer function H")
        return H

    def posterior_variance(self, H: Tensor | None = None, sigma_y: float = 0.0) -> Tensor:
        """Per-frequency posterior variance S sigma_y^2 / (S |H|^2 + sigma_y^2), float64 (h, w).

        For y = h (*) x + n, n ~ N(0, sigma_y^2 I) (model units), H the (h, w) transfer function
        (``None`` = identity: denoising). The posterior covariance is F^H diag(V) F per channel, so
        the per-pixel posterior variance is V.mean(). Where S|H|^2 + sigma_y^2 = 0 (sigma_y = 0 and
        H = 0) the measurement says nothing and V = S.
        """
        H = self._transfer(H, self.S.device)
        S, s2 = self.S, float(sigma_y) ** 2
        den = S * H.abs() ** 2 + s2
        return torch.where(den > 0, S * s2 / den.clamp_min(1e-300), S)

    def posterior_mean(self, y: Tensor, H: Tensor | None = None, sigma_y: float = 0.0) -> Tensor:
        """E[x | y] = F^-1[(S H^* Y + sigma_y^2 F(mean)) / (S|H|^2 + sigma_y^2)], Y = F y.

        y: (..., h, w) measurement in model units (same grid as x: circulant blur or denoising);
        H: (h, w) transfer function (``None`` = identity); sigma_y: noise std in model units.
        Returns the real part (exact for a real kernel, whose H is Hermitian) in y's dtype.
        """
        self._check_size(y, "measurement y")
        H = self._transfer(H, y.device)
        S = self.S.to(y.device)
        s2 = float(sigma_y) ** 2
        Y = torch.fft.fft2(y.to(torch.float64), norm="ortho")
        X = fourier_gaussian_mean(H, Y, s2, prior_mean=self._mean_coefficients(Y), prior_var=S)
        return torch.fft.ifft2(X, norm="ortho").real.to(y.dtype)

    def posterior_sample(
        self, y: Tensor, H: Tensor | None = None, sigma_y: float = 0.0, generator: torch.Generator | None = None
    ) -> Tensor:
        """One exact posterior sample per measurement: posterior mean + F^-1[sqrt(V) F z]."""
        mean = self.posterior_mean(y, H, sigma_y).to(torch.float64)
        v = self.posterior_variance(H, sigma_y).to(y.device)
        z = torch.randn(mean.shape, generator=generator, dtype=torch.float64, device=y.device)
        return (mean + fourier_filter(z, v.sqrt())).to(y.dtype)

    def mmse(self, H: Tensor | None = None, sigma_y: float = 0.0) -> float:
        """Expected per-pixel squared error of the posterior mean (model units^2): mean of V."""
        return float(self.posterior_variance(H, sigma_y).mean())
