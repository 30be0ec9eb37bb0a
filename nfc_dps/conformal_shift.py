"""Calibrated intervals for images unlike the calibration images (covariate shift).

The ``pooled`` rule of :mod:`nfc_dps.conformal` estimates the coverage of images exchangeable with
the calibration images. When the images to restore come from another source, two adaptations are
offered, each fitted from what is known without the truth of the target images:

* **weighted** (Tibshirani, Barber, Candès, Ramdas, "Conformal Prediction Under Covariate Shift",
  NeurIPS 2019): each calibration image i weighs w(X_i), the odds that a classifier between
  calibration and target images (:func:`fit_logistic` on :func:`image_features`) gives to "target"
  for its features X_i, an estimate of the likelihood ratio of target to calibration. q for a target
  image x is the smallest value whose weight of scores above it, the target image's own weight
  w(x) placed at +infinity, is at most alpha (:func:`weighted_quantile`). With equal weights and no
  test weight it is the ``pooled`` q. The weights' effective sample size (:func:`effective_sample_size`)
  says how many calibration images the fit rests on; below a floor (:func:`tempered_weights`) the
  weights are tempered, w^lambda with lambda halved until the floor is met (lambda = 0: pooled).
* **scaled**: an adaptive score, normalised by the image's own difficulty d (its mean spread, what
  the sampler tells about it): s' = s / d^beta, beta fitted on the calibration images by least
  squares of log (each image's 1 - alpha score quantile) on log d (:func:`fit_scale_exponent`).

Neither is conditional on the image: both target the mean coverage over the target images.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from .conformal import CalibrationError, check_coverage, edge_strength, min_images

__all__ = ["FEATURE_NAMES", "image_features", "haar_noise_estimate", "fit_logistic", "ShiftWeights", "shift_weights",
           "effective_sample_size", "tempered_weights", "weighted_quantile", "fit_scale_exponent"]

FEATURE_NAMES = ("log_mean_std", "log_edge_energy", "log_residual", "log_noise_estimate", "std_variation")
#: L2 penalty of the classifier on standardised features (per unit of log-likelihood summed over images)
DEFAULT_L2 = 1.0
_TINY = 1e-8


def image_features(mean: torch.Tensor, std: torch.Tensor, y: torch.Tensor, operator: Any) -> np.ndarray:
    """(B, len(FEATURE_NAMES)) float64 per image of a batch: log of the mean sample std, log of the
    mean edge energy of the restoration (:func:`~nfc_dps.conformal.edge_strength`), log of the RMS
    measurement residual A(mean) - y, log of the measurement's noise estimate (:func:`haar_noise_estimate`),
    and the std's coefficient of variation over pixels.
    mean, std: (B, C, H, W) in [0, 1] units; y: (B, ...) the measurement of ``operator``."""
    mean, std, y = (t.detach().double().cpu() for t in (mean, std, y))
    flat_std = std.flatten(1)
    residual = (operator.A(mean.float()).double() - y).flatten(1)
    columns = [
        flat_std.mean(1).clamp_min(_TINY).log(),
        edge_strength(mean).flatten(1).mean(1).clamp_min(_TINY).log(),
        residual.square().mean(1).sqrt().clamp_min(_TINY).log(),
        torch.from_numpy(haar_noise_estimate(y.numpy())).clamp_min(_TINY).log(),
        flat_std.std(1) / flat_std.mean(1).clamp_min(_TINY),
    ]
    return torch.stack(columns, 1).numpy()


def haar_noise_estimate(y: np.ndarray) -> np.ndarray:
    """(B,) Donoho's robust noise std of each measurement y (B, C, h, w), h, w >= 2: the median
    absolute finest Haar diagonal detail / 0.6745. Defined at any size (the 12 px measurement of a
    48 px SR tile), it reads texture as noise too: a feature, not a noise level to restore with."""
    h, w = (y.shape[-2] // 2) * 2, (y.shape[-1] // 2) * 2
    t = y[..., :h, :w]
    diagonal = (t[..., 0::2, 0::2] - t[..., 0::2, 1::2] - t[..., 1::2, 0::2] + t[..., 1::2, 1::2]) / 2
    return np.median(np.abs(diagonal.reshape(y.shape[0], -1)), axis=1) / 0.6745


def fit_logistic(features: np.ndarray, labels: np.ndarray, l2: float = DEFAULT_L2, iterations: int = 50
                 ) -> tuple[np.ndarray, float, np.ndarray, np.ndarray]:
    """L2-penalised logistic regression by Newton's method: (coef (F,), intercept, centre (F,),
    scale (F,)) with P(label 1 | x) = sigmoid(((x - centre) / scale) @ coef + intercept).
    features: (N, F); labels: (N,) in {0, 1}; the intercept is not penalised."""
    x = np.asarray(features, dtype=np.float64)
    t = np.asarray(labels, dtype=np.float64)
    centre = x.mean(0)
    scale = x.std(0)
    scale[scale < _TINY] = 1.0
    z = np.hstack([(x - centre) / scale, np.ones((len(x), 1))])
    beta = np.zeros(z.shape[1])
    penalty = np.full(z.shape[1], float(l2))
    penalty[-1] = 0.0
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-np.clip(z @ beta, -50, 50)))
        grad = z.T @ (p - t) + penalty * beta
        hess = (z * (p * (1 - p))[:, None]).T @ z + np.diag(penalty) + 1e-9 * np.eye(z.shape[1])
        step = np.linalg.solve(hess, grad)
        beta -= step
        if np.abs(step).max() < 1e-10:
            break
    return beta[:-1], float(beta[-1]), centre, scale


def effective_sample_size(weights: np.ndarray) -> float:
    """(sum w)^2 / sum w^2: n for equal weights, 1 when one weight carries everything."""
    w = np.asarray(weights, dtype=np.float64)
    w = w / max(w.max(), 1e-300)  # on the largest weight's scale: no overflow
    return float(w.sum() ** 2 / max(np.square(w).sum(), 1e-300))


@dataclass(frozen=True)
class ShiftWeights:
    """Likelihood-ratio weights of the calibration images (n,) and the target images (m,), on one
    scale; ``ess``: the calibration weights' effective sample size; ``tempering``: the lambda the
    weights were raised to (1: as estimated; 0: equal weights, the pooled rule)."""

    calibration: np.ndarray
    target: np.ndarray
    ess: float
    tempering: float


def shift_weights(calibration: np.ndarray, target: np.ndarray, l2: float = DEFAULT_L2,
                  ess_floor: float | None = None) -> ShiftWeights:
    """Weights (module doc) from the features of n calibration images (n, F) and m target images
    (m, F): the classifier's odds of "target", times n / m; tempered to ``ess_floor``
    (:func:`tempered_weights`) when given."""
    n, m = len(calibration), len(target)
    coef, intercept, centre, scale = fit_logistic(np.vstack([calibration, target]),
                                                  np.r_[np.zeros(n), np.ones(m)], l2)
    def odds(x: np.ndarray) -> np.ndarray:
        return np.exp(np.clip(((x - centre) / scale) @ coef + intercept, -50, 50)) * n / m
    w_cal, w_target = odds(np.asarray(calibration, float)), odds(np.asarray(target, float))
    if ess_floor is None:
        return ShiftWeights(w_cal, w_target, effective_sample_size(w_cal), 1.0)
    return tempered_weights(w_cal, w_target, ess_floor)


def tempered_weights(calibration: np.ndarray, target: np.ndarray, ess_floor: float, halvings: int = 6
                     ) -> ShiftWeights:
    """The weights raised to lambda = 1, 1/2, 1/4, ... (``halvings`` times, then 0), the first whose
    calibration ESS reaches ``ess_floor``; lambda = 0 gives equal weights (the pooled rule)."""
    for i in range(halvings + 1):
        lam = 0.5 ** i
        w_cal = np.power(calibration, lam)
        if effective_sample_size(w_cal) >= ess_floor - 1e-9:
            return ShiftWeights(w_cal, np.power(target, lam), effective_sample_size(w_cal), lam)
    ones = np.ones(len(calibration))
    return ShiftWeights(ones, np.ones(len(target)), float(len(calibration)), 0.0)


def weighted_quantile(scores: Sequence[np.ndarray], weights: np.ndarray, coverage: float,
                      test_weight: float = 0.0) -> float:
    """The smallest q whose weight of scores above it is at most alpha = 1 - coverage, image i's
    pixel scores sharing weights[i] / (sum(weights) + test_weight) and the mass
    test_weight / (...) sitting at +infinity (inf if that mass alone exceeds alpha).
    scores: one vector per calibration image (>= 0); weights: (n,) >= 0, not all 0."""
    alpha = 1.0 - check_coverage(coverage)
    w_img = np.asarray(weights, dtype=np.float64)
    if len(scores) != len(w_img) or (w_img < 0).any() or not np.isfinite(w_img).all() or w_img.sum() <= 0:
        raise CalibrationError(f"weights must be {len(scores)} finite numbers >= 0, not all 0")
    if len(scores) < min_images(coverage):
        raise CalibrationError(f"{len(scores)} calibration image(s) for coverage {coverage:g}: at least "
                               f"{min_images(coverage)} are needed")
    total = w_img.sum() + float(test_weight)
    if float(test_weight) / total > alpha + 1e-12:
        return float("inf")
    parts = [np.asarray(s, dtype=np.float64).ravel() for s in scores]
    s = np.concatenate(parts)
    w = np.concatenate([np.full(p.size, wi / (total * p.size)) for p, wi in zip(parts, w_img)])
    order = np.argsort(s, kind="stable")
    s, w = s[order], w[order]
    above = np.cumsum(w[::-1])[::-1] - w + float(test_weight) / total
    tail = above[np.searchsorted(s, s, side="right") - 1]  # ties: the weight strictly above s[i]
    ok = np.nonzero(tail <= alpha + 1e-10)[0]
    return float(s[ok[0]]) if ok.size else float("inf")


def fit_scale_exponent(scores: Sequence[np.ndarray], difficulty: np.ndarray, coverage: float) -> float:
    """beta of the scaled rule (module doc): the least-squares slope of log(image i's
    ``coverage`` quantile of its scores) on log(difficulty[i]); 0 when the difficulties do not vary."""
    d = np.log(np.maximum(np.asarray(difficulty, dtype=np.float64), _TINY))
    if len(d) < 2 or np.ptp(d) < 1e-9:
        return 0.0
    per_image = np.log(np.maximum([np.quantile(np.asarray(s, float), coverage) for s in scores], _TINY))
    dc = d - d.mean()
    return float(dc @ (per_image - per_image.mean()) / (dc @ dc))
