"""The Gaussian-mixture oracle: denoiser vs Monte Carlo, posterior vs dense Bayes, prior draws,
calibration of exact posterior draws, and exact-inner NFC/DAPS recovering the posterior weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nfc_dps.frequency import frequency_radius
from nfc_dps.metrics import coverage, expected_coverage
from nfc_dps.operators import BlurOperator, Denoising, Inpainting, gaussian_kernel
from nfc_dps.priors import GaussianMixturePrior
from nfc_dps.samplers import Measurement
from nfc_dps.samplers.nfc import NFCConfig, sample_daps, sample_nfc

F64 = torch.float64


def dft_matrix(h: int, w: int) -> np.ndarray:
    """Orthonormal 2-D DFT of row-major flattened (h, w) images, built from its definition."""
    def one(n: int) -> np.ndarray:
        j = np.arange(n)
        return np.exp(-2j * np.pi * np.outer(j, j) / n) / np.sqrt(n)
    return np.kron(one(h), one(w))


def dense_covariance(spectrum: torch.Tensor) -> np.ndarray:
    """F^H diag(S) F as a dense real matrix, for an (h, w) spectrum."""
    h, w = spectrum.shape
    f = dft_matrix(h, w)
    cov = f.conj().T @ np.diag(spectrum.numpy().ravel()) @ f
    assert np.abs(cov.imag).max() < 1e-12
    return cov.real


def dense_operator(op, h: int, w: int) -> np.ndarray:
    """The operator's matrix on gray (h, w) images, column j = A e_j."""
    eye = torch.eye(h * w, dtype=F64).view(h * w, 1, h, w)
    return op.A(eye).reshape(h * w, h * w).T.numpy()


def gaussian_log_density(v: np.ndarray, mean: np.ndarray, cov: np.ndarray) -> float:
    d = v - mean
    _, logdet = np.linalg.slogdet(cov)
    return float(-0.5 * (d @ np.linalg.solve(cov, d) + logdet + len(v) * np.log(2 * np.pi)))


def dense_mixture_posterior(pi, mus, covs, A, noise_cov, y):
    """Brute-force Bayes for y = A x + n, x ~ sum_k pi_k N(mu_k, cov_k), n ~ N(0, noise_cov)."""
    log_w, means, posts = [], [], []
    for p, mu, cov in zip(pi, mus, covs):
        marg = A @ cov @ A.T + noise_cov
        log_w.append(np.log(p) + gaussian_log_density(y, A @ mu, marg))
        gain = cov @ A.T @ np.linalg.inv(marg)
        means.append(mu + gain @ (y - A @ mu))
        posts.append(cov - gain @ A @ cov)
    log_w = np.array(log_w)
    weights = np.exp(log_w - log_w.max())
    return weights / weights.sum(), means, posts


def tiny_prior(setting: str = "poor", size: int = 4) -> GaussianMixturePrior:
    return GaussianMixturePrior.structured(size, 1, setting, torch.Generator().manual_seed(5))


# ============================================================================ denoiser


@pytest.mark.parametrize("sigma", [0.4, 1.0])
def test_denoiser_matches_monte_carlo_conditional_mean(sigma):
    """D(x, sigma) against self-normalised importance sampling of E[x0 | x0 + sigma n = x] with
    400k prior draws on 4x4 gray; tolerance: 5 Monte-Carlo standard errors per pixel."""
    prior = tiny_prior("poor")
    g = torch.Generator().manual_seed(1)
    x0_true = prior.sample_prior(3, g)
    x = x0_true + sigma * torch.randn(x0_true.shape, generator=g, dtype=F64)
    draws = prior.sample_prior(400_000, g)
    exact = prior.denoise(x, torch.full((3,), sigma, dtype=F64))
    flat = draws.flatten(1)
    for b in range(3):
        logw = -((flat - x[b].flatten()) ** 2).sum(1) / (2 * sigma**2)
        w = torch.softmax(logw, 0)
        est = (w[:, None] * flat).sum(0)
        se = ((w[:, None] ** 2) * (flat - est) ** 2).sum(0).sqrt()  # delta-method SE of the ratio estimator
        ess = float(1 / (w**2).sum())
        assert ess > 300, ess
        err = (exact[b].flatten() - est).abs()
        assert bool((err <= 5 * se + 1e-4).all()), (err / se).max()
        # the test has power: responsibilities frozen at the prior weights are far off
        frozen = sum(float(pi) * (prior.means[k] + torch.fft.ifft2(
            torch.fft.fft2(x[b] - prior.means[k], norm="ortho") * prior.spectra[k] / (prior.spectra[k] + sigma**2),
            norm="ortho").real) for k, pi in enumerate(prior.weights))
        assert float(((frozen.flatten() - est).abs() / se).max()) > 10


def test_denoiser_is_differentiable_and_stable_at_extremes():
    prior = tiny_prior("well", 8)
    x = (prior.sample_prior(2, torch.Generator().manual_seed(0)) * 50).requires_grad_(True)  # far from every mode
    out = prior.denoise(x, torch.tensor([1e-4, 1e3], dtype=F64))
    assert torch.isfinite(out).all()
    out.sum().backward()
    assert torch.isfinite(x.grad).all()
    # sigma -> infinity returns the prior mean; sigma -> 0 returns x
    x1 = prior.sample_prior(1, torch.Generator().manual_seed(1))
    mean = (prior.weights.view(-1, 1, 1, 1) * prior.means).sum(0, keepdim=True)
    assert torch.allclose(prior.denoise(x1, torch.tensor([1e6], dtype=F64)), mean, atol=1e-6)
    assert torch.allclose(prior.denoise(x1, torch.tensor([1e-7], dtype=F64)), x1, atol=1e-6)


# ============================================================================ exact posterior


@pytest.mark.parametrize("channels", [1, 2])
def test_posterior_matches_dense_bayes(channels):
    """Weights, means and covariances of p(x | y) and E[x0 | x_sigma, y] against dense linear
    algebra on 4x4 images with an asymmetric circulant blur (channels are independent given k)."""
    h = w = 4
    prior = GaussianMixturePrior.structured(h, channels, "poor", torch.Generator().manual_seed(2))
    kernel = torch.tensor([[0.0, 0.1, 0.0], [0.3, 0.4, 0.05], [0.0, 0.15, 0.0]], dtype=F64)
    op = BlurOperator(kernel, "circular")
    sigma_y, sigma_k = 0.3, 0.4
    g = torch.Generator().manual_seed(3)
    x = prior.sample_prior(2, g)
    y = op.A(x) + sigma_y * torch.randn(x.shape, generator=g, dtype=F64)
    x_k = x + sigma_k * torch.randn(x.shape, generator=g, dtype=F64)
    post = prior.posterior(op, y, sigma_y)
    cond = post.conditional_mean(x_k, sigma_k)

    n = h * w
    a1 = dense_operator(op, h, w)
    A = np.kron(np.eye(channels), a1)  # channel-major flattening of (C, h, w)
    covs = [np.kron(np.eye(channels), dense_covariance(prior.spectra[k, 0])) for k in range(prior.num_components)]
    mus = [prior.means[k].numpy().ravel() for k in range(prior.num_components)]
    pi = prior.weights.numpy()
    var_dense = [np.kron(np.eye(channels), dense_covariance(post.variances[k, 0])) for k in range(prior.num_components)]
    for b in range(2):
        weights, means, posts = dense_mixture_posterior(pi, mus, covs, A, sigma_y**2 * np.eye(channels * n),
                                                        y[b].numpy().ravel())
        assert weights.max() < 0.999, weights  # a mixed posterior: the weights are really tested
        np.testing.assert_allclose(post.weights[b].numpy(), weights, atol=1e-10)
        for k in range(prior.num_components):
            np.testing.assert_allclose(post.means[b, k].numpy().ravel(), means[k], atol=1e-10)
            np.testing.assert_allclose(var_dense[k], posts[k], atol=1e-10)
        np.testing.assert_allclose(post.mean()[b].numpy().ravel(), sum(wk * m for wk, m in zip(weights, means)),
                                   atol=1e-10)
        # E[x0 | x_k, y]: two observations of x0, stacked
        A2 = np.vstack([np.eye(channels * n), A])
        noise2 = np.diag(np.r_[np.full(channels * n, sigma_k**2), np.full(channels * n, sigma_y**2)])
        w2, m2, _ = dense_mixture_posterior(pi, mus, covs, A2, noise2, np.r_[x_k[b].numpy().ravel(), y[b].numpy().ravel()])
        np.testing.assert_allclose(cond[b].numpy().ravel(), sum(wk * m for wk, m in zip(w2, m2)), atol=1e-10)
        # the per-pixel posterior variance (MMSE) from the dense covariances
        total = sum(wk * (np.trace(c) + ((m - post.mean()[b].numpy().ravel()) ** 2).sum())
                    for wk, m, c in zip(weights, means, posts)) / (channels * n)
        assert float(post.mmse()[b]) == pytest.approx(total, rel=1e-10)


def test_denoiser_equals_the_denoising_posterior_mean():
    prior = tiny_prior("well", 8)
    x = prior.sample_prior(3, torch.Generator().manual_seed(4)) + 0.2
    d = prior.denoise(x, torch.full((3,), 0.5, dtype=F64))
    assert torch.allclose(d, prior.posterior(Denoising(), x, 0.5).mean(), atol=1e-12)
    assert torch.allclose(prior.responsibilities(x, 0.5), prior.posterior(Denoising(), x, 0.5).weights, atol=1e-12)


def test_posterior_errors_name_the_value():
    prior = tiny_prior("well", 8)
    y = torch.zeros(1, 1, 8, 8, dtype=F64)
    with pytest.raises(ValueError, match="circulant"):
        prior.posterior(Inpainting(torch.ones(1, 1, 8, 8)), y, 0.1)
    with pytest.raises(ValueError, match="sigma_y_m"):
        prior.posterior(Denoising(), y, 0.0)
    with pytest.raises(ValueError, match=r"\(1, 8, 8\)"):
        prior.posterior(Denoising(), torch.zeros(1, 1, 4, 4, dtype=F64), 0.1)
    with pytest.raises(ValueError, match="symmetric"):
        GaussianMixturePrior(torch.zeros(1, 1, 4, 4), torch.rand(1, 1, 4, 4) + 0.1, torch.ones(1))
    with pytest.raises(ValueError, match="setting"):
        GaussianMixturePrior.structured(8, 1, "medium")


# ============================================================================ prior draws


def test_sample_prior_statistics():
    """Component frequencies within 4 binomial standard errors of pi; per component, the mean
    within 4 standard errors of mu_k (pixel variance = mean of S_k) and the ring-averaged power
    within 6 % of S_k (a ring holds >= 8 frequencies of >= 5000 draws: ~1 % standard error)."""
    prior = tiny_prior("poor", 8)
    n = 20_000
    x, comp = prior.sample_prior(n, torch.Generator().manual_seed(6), return_components=True)
    pi = prior.weights
    freq = torch.bincount(comp, minlength=prior.num_components).to(F64) / n
    assert bool(((freq - pi).abs() <= 4 * (pi * (1 - pi) / n).sqrt()).all()), (freq, pi)
    r = frequency_radius(8, 8)
    for k in range(prior.num_components):
        xk = x[comp == k]
        se = (prior.spectra[k].mean() / len(xk)).sqrt()
        assert float((xk.mean(0) - prior.means[k]).abs().max()) <= 4 * float(se)
        power = (torch.fft.fft2(xk - prior.means[k], norm="ortho").abs() ** 2).mean(0)[0]
        for lo, hi in [(0.0, 0.2), (0.2, 0.4), (0.4, 0.8)]:
            sel = (r >= lo) & (r < hi)
            assert abs(float(power[sel].mean() / prior.spectra[k, 0][sel].mean()) - 1) < 0.06, (k, lo)
    # well-separated modes: every draw is assigned to the component it came from
    well = tiny_prior("well", 16)
    xw, cw = well.sample_prior(2000, torch.Generator().manual_seed(7), return_components=True)
    assert bool((well.assign(xw) == cw).all())


# ============================================================================ calibration of exact draws


def test_exact_posterior_std_is_calibrated():
    """K = 32 exact posterior draws per measurement, 600 measurements (8x8, blur std 0.5 px,
    one-hot posterior weights, so every pixel's posterior is Gaussian): the fraction of pixels
    within 1 and 2 sample stds of the sample mean matches the Student-t value
    P(|T_{K-1}| <= c / sqrt(1 + 1/K)) (66.8 / 94.2 %; 68.3 / 95.4 % as K grows) within 1.5
    points (about 3 standard errors of a fraction over ~2000 effectively independent pixels)."""
    prior = tiny_prior("well", 8)
    op = BlurOperator(gaussian_kernel(3, 0.5), "circular")
    g = torch.Generator().manual_seed(8)
    x = prior.sample_prior(600, g)
    sigma_y = 0.1
    y = op.A(x) + sigma_y * torch.randn(x.shape, generator=g, dtype=F64)
    post = prior.posterior(op, y, sigma_y)
    assert bool((post.weights.max(1).values > 0.9999).all())
    kk = 32
    draws = post.sample(kk, g)
    got = coverage(draws, x).mean(0)
    for i, c in enumerate((1.0, 2.0)):
        want = expected_coverage(kk, c)
        assert abs(float(got[i]) - want) <= 0.015, (c, float(got[i]), want)
    # the test has power: draws 20 % too narrow around their mean are caught
    narrow = coverage(draws.mean(0) + 0.8 * (draws - draws.mean(0)), x).mean(0)
    assert float((narrow - torch.tensor([expected_coverage(kk, 1.0), expected_coverage(kk, 2.0)], dtype=F64)).abs().min()) > 0.03


# ============================================================================ samplers


@pytest.mark.parametrize("sampler", [sample_nfc, sample_daps])
def test_exact_inner_samplers_recover_the_posterior_weights(sampler):
    """Well-separated modes (16x16 gray, blur std 1 px, sigma_y 0.1 model units, whose exact
    posterior puts > 99 % on one component for these measurements): with the exact inner step
    and 40 levels, the fraction of 16 chains per measurement assigned to each component is within
    TV 0.1 of pi' on average over 4 measurements (a sampler ignoring y would score ~0.5)."""
    prior = tiny_prior("well", 16)
    op = BlurOperator(gaussian_kernel(7, 1.0), "circular")
    g = torch.Generator().manual_seed(9)
    b, n, sigma_y = 4, 16, 0.1
    x = prior.sample_prior(b, g)
    y_m = op.A(x) + sigma_y * torch.randn(x.shape, generator=g, dtype=F64)
    post = prior.posterior(op, y_m, sigma_y)
    assert bool((post.weights.max(1).values > 0.99).all())
    cfg = NFCConfig(num_levels=40, ode_steps=1, ode_sigma_min=1e-5, inner="exact", prior_covariance="spectral",
                    spectrum="prior", final_step="sample")
    gens = [torch.Generator().manual_seed(100 + i) for i in range(b * n)]
    y = ((y_m + 1) / 2).repeat_interleave(n, 0)
    out = sampler(prior, Measurement(op, y, sigma_y / 2, (b * n, 1, 16, 16)).in_model_units(), cfg, gens)
    comp = prior.assign(out).view(b, n)
    frac = torch.stack([torch.bincount(comp[i], minlength=prior.num_components) for i in range(b)]).to(F64) / n
    tv = 0.5 * (frac - post.weights).abs().sum(1)
    assert float(tv.mean()) <= 0.1, tv
