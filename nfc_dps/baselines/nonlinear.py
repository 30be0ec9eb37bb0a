"""Classical answers to the nonlinear and Poisson problems: what a user would try without a prior.

* :func:`richardson_lucy`: Poisson deblurring, Richardson-Lucy's multiplicative EM iterations
  x <- x A^T(y / A x) / A^T 1 from the measurement's mean (flat, as scikit-image starts); the
  iteration count (its only regulariser) is :data:`RL_ITERATIONS` per peak, chosen on training
  images (:func:`tune_poisson`; at these photon counts the best is the first iteration).
* :func:`anscombe_tv`: Poisson denoising, the Anscombe transform 2 sqrt(peak y + 3/8) (noise of
  about unit variance), scikit-image's TV denoiser at :data:`ANSCOMBE_TV_WEIGHT` per unit of
  noise, chosen on training images, and the transform's closed-form unbiased inverse.
* :func:`hio_er`: Fourier phase retrieval, Fienup's hybrid input-output (beta 0.9) then error
  reduction, on the padded grid with the image's support and [0, 1] as constraints, from
  ``starts`` seeded random images, keeping the one whose amplitudes fit y best.
* :func:`hdr_inverse_inpaint`: HDR, the unclipped inverse of the pixels that are not clipped, the
  clipped ones filled by biharmonic inpainting and held on their side of the clip.
* :func:`camera_tv`: blur in linear light, sRGB decoded, TV-deconvolved, encoded.

Every function takes y (B, C, h, w) and returns (B, C, H, W) in [0, 1].
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np
import torch
from torch import Tensor

from ..metrics import psnr
from ..noise import PoissonNoise
from ..operators import Inpainting, LinearOperator, build_operator
from ..operators.nonlinear import CameraBlur, Exposure, HighDynamicRange, PhaseRetrieval, linear_to_srgb, srgb_to_linear
from ..priors.training_data import center_crop, load_skimage_image
from .linear import biharmonic_inpaint, tv_restore

__all__ = ["richardson_lucy", "anscombe_tv", "hio_er", "hdr_inverse_inpaint", "camera_tv", "tune_poisson",
           "RL_ITERATIONS", "ANSCOMBE_TV_WEIGHT"]

#: Richardson-Lucy iterations per Poisson peak, chosen by :func:`tune_poisson` on training images
#: (the count of its grid with the best mean PSNR)
RL_ITERATIONS: dict[float, int] = {10.0: 1, 50.0: 1}
#: scikit-image TV weight per unit of Anscombe-domain noise, chosen by :func:`tune_poisson` alike
ANSCOMBE_TV_WEIGHT: dict[float, float] = {10.0: 1.0, 50.0: 1.0}


def _nearest(table: dict[float, float], peak: float) -> float:
    return table[min(table, key=lambda p: abs(math.log(p) - math.log(peak)))]


def richardson_lucy(operator: LinearOperator, y: Tensor, peak: float, iterations: int | None = None) -> Tensor:
    """Richardson-Lucy for y ~ Poisson(peak A x) / peak, any non-negative linear A (blur)."""
    iterations = int(_nearest(RL_ITERATIONS, peak)) if iterations is None else int(iterations)
    y = y.double().clamp_min(0)
    shape = operator.image_shape(y.shape)
    norm = operator.A_adjoint(torch.ones_like(y)).clamp_min(1e-12)
    x = y.mean(dim=(-2, -1), keepdim=True).expand(shape).clone().clamp_min(1e-3)  # scikit-image's flat start
    for _ in range(iterations):
        x = x * operator.A_adjoint(y / operator.A(x).clamp_min(1e-6)) / norm
    return x.clamp(0, 1).float()


def anscombe_tv(y: Tensor, peak: float, weight: float | None = None) -> Tensor:
    """Anscombe transform, TV denoising (scikit-image, channel-wise) and the unbiased inverse."""
    from skimage.restoration import denoise_tv_chambolle

    weight = _nearest(ANSCOMBE_TV_WEIGHT, peak) if weight is None else float(weight)
    z = 2 * np.sqrt(np.clip(y.double().cpu().numpy(), 0, None) * peak + 3 / 8)
    out = np.empty_like(z)
    for b in range(z.shape[0]):
        for c in range(z.shape[1]):
            out[b, c] = denoise_tv_chambolle(z[b, c], weight=weight)
    # the closed-form approximation of the exact unbiased inverse (Makitalo and Foi 2011)
    d = np.maximum(out, 1e-3)
    counts = d**2 / 4 + math.sqrt(3 / 2) / (4 * d) - 11 / (8 * d**2) + 5 * math.sqrt(3 / 2) / (8 * d**3) - 1 / 8
    return torch.from_numpy(np.clip(counts / peak, 0, 1)).to(dtype=y.dtype, device=y.device)


def hio_er(operator: PhaseRetrieval, y: Tensor, hio_iterations: int = 300, er_iterations: int = 100,
           starts: int = 4, beta: float = 0.9, seed: int = 0) -> Tensor:
    """Fienup's HIO then ER on the padded grid (support: the image's region; values in [0, 1]),
    from ``starts`` seeded random images; per image, the result whose amplitudes fit y best."""
    y = y.double()
    h, w = operator.image_shape(y.shape)[-2:]
    ph, pw = operator._pad(h, w)
    support = torch.zeros(y.shape[-2:], dtype=torch.bool)
    support[ph:ph + h, pw:pw + w] = True
    amplitude = torch.fft.ifftshift(y, dim=(-2, -1))
    best, best_fit = None, None
    gen = torch.Generator().manual_seed(seed)
    for _ in range(starts):
        g = torch.rand(y.shape, generator=gen, dtype=torch.float64) * support
        for k in range(hio_iterations + er_iterations):
            spectrum = torch.fft.fft2(g, norm="ortho")
            g_new = torch.fft.ifft2(amplitude * torch.exp(1j * spectrum.angle()), norm="ortho").real
            valid = support & (g_new >= 0) & (g_new <= 1)
            if k < hio_iterations:
                g = torch.where(valid, g_new, g - beta * g_new)
            else:
                g = torch.where(valid, g_new, torch.where(support, g_new.clamp(0, 1), torch.zeros_like(g_new)))
        x = g[..., ph:ph + h, pw:pw + w].clamp(0, 1)
        fit = (operator.A(x) - y).pow(2).flatten(1).sum(1)
        if best is None:
            best, best_fit = x, fit
        else:
            better = (fit < best_fit).view(-1, 1, 1, 1)
            best, best_fit = torch.where(better, x, best), torch.minimum(fit, best_fit)
    return best.float()


def hdr_inverse_inpaint(operator: HighDynamicRange | Exposure, y: Tensor, margin: float = 0.02) -> Tensor:
    """The unclipped inverse where y is not clipped (within ``margin`` of 1, or of 0 for an operator
    that ``clips_shadows``); the clipped pixels filled by scikit-image's biharmonic inpainting, then
    held on their side of the clip (a pixel clipped at 0 is at most the inverse of 0, one clipped at
    1 at least that of 1)."""
    inverse = operator.inverse(y)
    observed = ((y > margin) if operator.clips_shadows else torch.ones_like(y, dtype=torch.bool)) & (y < 1 - margin)
    filled = torch.stack([torch.cat([biharmonic_inpaint(Inpainting(observed[i, c].float()), inverse[i:i + 1, c:c + 1])
                                     for c in range(y.shape[1])], 1)[0] for i in range(y.shape[0])])
    low, high = operator.inverse(torch.zeros(())), operator.inverse(torch.ones(()))
    if operator.clips_shadows:
        filled = torch.where(y <= margin, torch.minimum(filled, low), filled)
    filled = torch.where(y >= 1 - margin, torch.maximum(filled, high), filled)
    return filled.clamp(0, 1).float()


def camera_tv(operator: CameraBlur, y: Tensor, sigma_y: float) -> Tensor:
    """sRGB-decode y, TV-deconvolve with the operator's blur in linear light, encode."""
    linear = srgb_to_linear(y.double())
    # the noise's std in linear light, at mid-grey: the decoding's slope there times sigma_y
    slope = float((srgb_to_linear(torch.tensor(0.51, dtype=torch.float64))
                   - srgb_to_linear(torch.tensor(0.49, dtype=torch.float64))) / 0.02)
    return linear_to_srgb(tv_restore(operator.blur, linear, sigma_y * slope)).float()


def tune_poisson(image_names: Iterable[str] = ("rocket", "brick", "coins", "retina"), size: int = 64,
                 peaks: Sequence[float] = (10.0, 50.0), rl_grid: Sequence[int] = (1, 2, 3, 5, 10, 20, 40),
                 tv_grid: Sequence[float] = (0.3, 0.5, 0.7, 1.0, 1.5, 2.0), seed: int = 0) -> dict[str, dict]:
    """The iteration count of :func:`richardson_lucy` (on the Poisson deblurring tier's blur) and the
    TV weight of :func:`anscombe_tv` with the best mean PSNR on centre crops of TRAINING images."""

    x = torch.stack([torch.from_numpy(center_crop(load_skimage_image(n), size)).permute(2, 0, 1)
                     for n in image_names]).float()
    blur = build_operator("deblur_gaussian", size, kernel_size=25, kernel_std=2.0, boundary="circular")
    out: dict[str, dict] = {"richardson_lucy": {}, "anscombe_tv": {}}
    for peak in peaks:
        gens = [torch.Generator().manual_seed(seed + i) for i in range(len(x))]
        y_blur = blur.measure(x, noise=PoissonNoise(peak), generator=gens)
        y_id = PoissonNoise(peak).sample(x, [torch.Generator().manual_seed(seed + 100 + i) for i in range(len(x))])
        out["richardson_lucy"][peak] = {k: float(psnr(richardson_lucy(blur, y_blur, peak, k), x).mean())
                                        for k in rl_grid}
        out["anscombe_tv"][peak] = {wt: float(psnr(anscombe_tv(y_id, peak, wt), x).mean()) for wt in tv_grid}
    return out
