"""Priors: sigma-form wrappers, the Gaussian spectral oracle, the diffusers loader, tiling."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
import torch

from nfc_dps.frequency import corner_radius, fit_power_law, radial_power_spectrum, smooth_power_law
from nfc_dps.priors import EDMDenoiser, EpsilonDenoiser, Prior, TiledPrior, load_diffusers_prior
from nfc_dps.priors.base import PREDICTION_TYPES, reflect_pad, x0_to_prediction
from nfc_dps.priors.gaussian import GaussianSpectralPrior, circulant_transfer


def linear_alphas_cumprod(n: int = 1000) -> torch.Tensor:
    return torch.cumprod(1 - torch.linspace(1e-4, 0.02, n, dtype=torch.float64), 0)


# ============================================================================ EpsilonDenoiser


class OracleNet:
    """Knows x0 and eps of x = x0 + sigma eps; outputs the exact target of its prediction type."""

    def __init__(self, x0, eps, sigma, ptype, extra_channels=0, n_steps=1000):
        self.x0, self.eps, self.ptype, self.extra, self.n_steps = x0, eps, ptype, extra_channels, n_steps
        s = sigma.view(-1, 1, 1, 1)
        self.alpha, self.sigma_vp = 1 / (1 + s**2).sqrt(), s / (1 + s**2).sqrt()
        self.calls = 0

    def __call__(self, x_t, t):
        self.calls += 1
        # the wrapper must feed x_t = alpha x0 + sigma_vp eps (VP scaling) and a timestep in range
        assert torch.allclose(x_t, self.alpha * self.x0 + self.sigma_vp * self.eps, atol=1e-12)
        assert t.shape == (x_t.shape[0],) and (t >= 0).all() and (t <= self.n_steps - 1).all()
        out = x0_to_prediction(self.x0, self.eps, self.alpha, self.sigma_vp, self.ptype)
        if self.extra:  # learned-variance channels: garbage that must be dropped
            out = torch.cat([out, torch.full_like(out[:, : self.extra], float("nan"))], 1)
        return out


@pytest.mark.parametrize("ptype", PREDICTION_TYPES)
@pytest.mark.parametrize("extra", [0, 3])
def test_epsilon_denoiser_recovers_x0(ptype, extra):
    g = torch.Generator().manual_seed(0)
    x0 = torch.rand(4, 3, 8, 8, generator=g, dtype=torch.float64) * 2 - 1
    eps = torch.randn(x0.shape, generator=g, dtype=torch.float64)
    sigma = torch.tensor([0.0, 0.02, 1.3, 60.0], dtype=torch.float64)
    net = OracleNet(x0, eps, sigma, ptype, extra_channels=extra)
    prior = EpsilonDenoiser(net, linear_alphas_cumprod(), prediction_type=ptype, channels=3)
    out = prior(x0 + sigma.view(-1, 1, 1, 1) * eps, sigma)
    assert net.calls == 1 and out.shape == x0.shape
    assert torch.isfinite(out).all()
    assert (out - x0).abs().max() <= 1e-5


def test_epsilon_denoiser_rejects_unknown_prediction_type():
    with pytest.raises(ValueError, match="prediction_type"):
        EpsilonDenoiser(lambda x, t: x, linear_alphas_cumprod(), prediction_type="score")


def test_sigma_t_round_trip_and_discrete_steps():
    ac = linear_alphas_cumprod()
    prior = EpsilonDenoiser(lambda x, t: x, ac)
    discrete = ((1 - ac) / ac).sqrt()
    # sigma_to_t on the discrete sigmas gives the integers
    t = prior.sigma_to_t(discrete)
    assert torch.allclose(t.double(), torch.arange(1000, dtype=torch.float64), atol=2e-3)
    assert torch.equal(t.round().long(), torch.arange(1000))
    # t_to_sigma on integers gives the discrete sigmas; fractional t round-trips
    assert torch.allclose(prior.t_to_sigma(torch.arange(1000).float()).double(), discrete, rtol=1e-5)
    tf = torch.tensor([0.0, 0.25, 3.5, 120.75, 998.9, 999.0])
    assert torch.allclose(prior.sigma_to_t(prior.t_to_sigma(tf)), tf, atol=2e-3)
    s = torch.tensor([0.012, 0.5, 7.0, 150.0])
    assert torch.allclose(prior.t_to_sigma(prior.sigma_to_t(s)), s, rtol=1e-4)
    # outside the trained range: clamped to the ends
    assert prior.sigma_to_t(torch.tensor([1e-6, 1e4])).tolist() == [0.0, 999.0]
    assert prior.sigma_min == pytest.approx(float(discrete[0])) and prior.sigma_max == pytest.approx(float(discrete[-1]))
    # a float64 copy of the prior keeps working (table dtype follows .double())
    assert torch.allclose(prior.double().sigma_to_t(discrete[:5]), torch.arange(5.0), atol=1e-6)


# ============================================================================ EDMDenoiser


def test_edm_scalings_and_limits():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(3, 3, 1, 1, generator=g, dtype=torch.float64)
    net = lambda x, c: torch.nn.functional.conv2d(x, w) + 0.3 * torch.tanh(c).view(-1, 1, 1, 1)  # noqa: E731
    prior = EDMDenoiser(net, channels=3, sigma_data=0.5)
    sd = torch.tensor([0.5], dtype=torch.float64)
    c_skip, c_out, c_in = prior.scalings(sd)
    assert float(c_skip) == pytest.approx(0.5) and float(c_out) == pytest.approx(0.5 / math.sqrt(2))
    assert float(c_in) == pytest.approx(1 / (0.5 * math.sqrt(2)))
    # sigma -> 0: D(x) -> x whatever the network says
    x = torch.randn(2, 3, 8, 8, generator=g, dtype=torch.float64)
    assert torch.allclose(prior(x, 1e-9), x, atol=1e-8)
    # an ideal network F = (x0 - c_skip x) / c_out gives D = x0
    x0 = torch.rand(2, 3, 8, 8, generator=g, dtype=torch.float64)
    sigma = torch.tensor([0.1, 20.0], dtype=torch.float64)
    xn = x0 + sigma.view(-1, 1, 1, 1) * torch.randn(x0.shape, generator=g, dtype=torch.float64)
    cs, co, ci = (c.view(-1, 1, 1, 1) for c in prior.scalings(sigma))

    def ideal(x_in, c_noise):
        assert torch.allclose(x_in, ci * xn) and torch.allclose(c_noise, 250 * sigma.log())
        return (x0 - cs * xn) / co

    assert torch.allclose(EDMDenoiser(ideal, channels=3)(xn, sigma), x0, atol=1e-10)


# ============================================================================ Gaussian spectral prior


def fftfreq_np(n: int) -> np.ndarray:
    k = np.arange(n)
    return np.where(k < (n + 1) // 2, k, k - n) / n


def dense_stationary(spec: np.ndarray) -> np.ndarray:
    """N x N covariance (row-major pixels) of a stationary field with per-frequency variance spec."""
    h, w = spec.shape
    fy, fx = np.meshgrid(fftfreq_np(h), fftfreq_np(w), indexing="ij")
    iy, ix = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    dy = iy.reshape(-1, 1) - iy.reshape(1, -1)
    dx = ix.reshape(-1, 1) - ix.reshape(1, -1)
    phase = 2 * np.pi * (fy.reshape(-1, 1, 1) * dy[None] + fx.reshape(-1, 1, 1) * dx[None])
    return (spec.reshape(-1, 1, 1) * np.cos(phase)).sum(0) / (h * w)


def dense_circular_conv(kernel: np.ndarray, h: int, w: int) -> np.ndarray:
    """Matrix of circular convolution with kernel centred at (kh//2, kw//2)."""
    kh, kw = kernel.shape
    A = np.zeros((h * w, h * w))
    for i in range(h):
        for j in range(w):
            for a in range(kh):
                for b in range(kw):
                    A[i * w + j, ((i - (a - kh // 2)) % h) * w + (j - (b - kw // 2)) % w] += kernel[a, b]
    return A


H_, W_ = 8, 6


@pytest.fixture(scope="module")
def gprior():
    return GaussianSpectralPrior((H_, W_), alpha=2.2, amplitude=0.03, omega0=0.07, mean=0.3, channels=2)


def test_spectrum_formula(gprior):
    fy, fx = np.meshgrid(fftfreq_np(H_), fftfreq_np(W_), indexing="ij")
    want = 0.03 * (fy**2 + fx**2 + 0.07**2) ** (-1.1)
    np.testing.assert_allclose(gprior.spectrum().numpy(), want, rtol=1e-12)
    np.testing.assert_allclose(gprior.spectrum(5, 7).numpy()[1, 2], 0.03 * (0.2**2 + (2 / 7) ** 2 + 0.07**2) ** -1.1, rtol=1e-12)
    assert gprior.spectrum().shape == (H_, W_)
    # default amplitude: per-pixel std = pixel_std
    p = GaussianSpectralPrior((16, 12), pixel_std=0.4)
    assert math.sqrt(float(p.spectrum().mean())) == pytest.approx(0.4)


def test_gaussian_denoise_equals_dense_solution(gprior):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 2, H_, W_, generator=g, dtype=torch.float64)
    sigma = torch.tensor([0.05, 0.4, 3.0], dtype=torch.float64)
    out = gprior(x, sigma)
    cov = dense_stationary(gprior.spectrum().numpy())
    for b in range(3):
        for c in range(2):
            v = x[b, c].numpy().ravel() - 0.3
            want = 0.3 + cov @ np.linalg.solve(cov + sigma[b].item() ** 2 * np.eye(H_ * W_), v)
            np.testing.assert_allclose(out[b, c].numpy().ravel(), want, atol=1e-10)
    # float32 in, float32 out
    assert gprior(x.float(), sigma.float()).dtype == torch.float32


def test_gaussian_posterior_equals_dense_conditioning(gprior):
    rng = np.random.default_rng(3)
    kernel = rng.random((3, 3))
    kernel *= 0.8 / kernel.sum()  # asymmetric (complex H) and H(0) = 0.8 != 1: tests conj and the mean
    A = dense_circular_conv(kernel, H_, W_)
    H = circulant_transfer(torch.from_numpy(kernel), H_, W_)
    x = torch.from_numpy(rng.standard_normal((2, H_, W_)))
    blurred = torch.fft.ifft2(H * torch.fft.fft2(x)).real
    np.testing.assert_allclose(blurred.numpy().reshape(2, -1), x.numpy().reshape(2, -1) @ A.T, atol=1e-12)

    sigma_y = 0.07
    y = torch.from_numpy(rng.standard_normal((1, 2, H_, W_)) * 0.5 + 0.2)
    cov = dense_stationary(gprior.spectrum().numpy())
    G = A @ cov @ A.T + sigma_y**2 * np.eye(H_ * W_)
    m = 0.3 * np.ones(H_ * W_)
    got = gprior.posterior_mean(y, H, sigma_y)
    for c in range(2):
        want = m + cov @ A.T @ np.linalg.solve(G, y[0, c].numpy().ravel() - A @ m)
        np.testing.assert_allclose(got[0, c].numpy().ravel(), want, atol=1e-10)
    post_cov = cov - cov @ A.T @ np.linalg.solve(G, A @ cov)
    V = gprior.posterior_variance(H, sigma_y)
    np.testing.assert_allclose(dense_stationary(V.numpy()), post_cov, atol=1e-12)
    assert gprior.mmse(H, sigma_y) == pytest.approx(np.trace(post_cov) / (H_ * W_), rel=1e-10)
    # denoising (H = identity) is the same formula as denoise()
    np.testing.assert_allclose(gprior.posterior_mean(y, None, 0.2).numpy(), gprior(y, 0.2).numpy(), atol=1e-12)
    # a measurement that says nothing (H = 0, sigma_y = 0) leaves the prior
    zero = torch.zeros(H_, W_, dtype=torch.complex128)
    np.testing.assert_allclose(gprior.posterior_mean(y, zero, 0.0).numpy(), 0.3, atol=1e-12)
    assert torch.allclose(gprior.posterior_variance(zero, 0.0), gprior.spectrum())


def test_gaussian_sample_statistics(gprior):
    x = gprior.sample(4000, torch.Generator().manual_seed(4), dtype=torch.float64)
    assert x.shape == (4000, 2, H_, W_)
    flat = x.reshape(-1, H_ * W_).numpy()
    emp = np.cov(flat, rowvar=False)
    cov = dense_stationary(gprior.spectrum().numpy())
    assert abs(flat.mean() - 0.3) < 0.02
    assert np.abs(emp - cov).max() < 0.08 * np.abs(cov).max()
    # posterior samples have the posterior variance around the posterior mean
    y = x[:1]
    ps = torch.cat([gprior.posterior_sample(y, None, 0.3, torch.Generator().manual_seed(i)) for i in range(400)])
    pm = gprior.posterior_mean(y, None, 0.3)
    assert float(((ps - pm) ** 2).mean()) == pytest.approx(gprior.mmse(None, 0.3), rel=0.1)


def test_gaussian_size_errors(gprior):
    with pytest.raises(ValueError, match=r"8x6.*10x6"):
        gprior(torch.zeros(1, 2, 10, 6), 0.1)
    with pytest.raises(ValueError, match="2-channel"):
        gprior(torch.zeros(1, 3, 8, 6), 0.1)
    with pytest.raises(ValueError, match="transfer function"):
        gprior.posterior_variance(torch.ones(4, 4), 0.1)


def test_fit_power_law():
    # exact spectrum (non-square grid, DC arbitrary): exact recovery
    spec = smooth_power_law(24, 40, 1e-3, 2.3, 0.0)
    spec[0, 0] = 123.0
    corner = corner_radius(24, 40)
    amp, alpha = fit_power_law(spec, 0.0, 0.5 / corner, exact=True, spectrum=True)
    # the fit is on the normalised radius r = |omega| / corner: a_r = a_omega * corner^-alpha
    assert float(alpha) == pytest.approx(2.3, abs=1e-8) and float(amp) == pytest.approx(1e-3 * corner**-2.3, rel=1e-7)
    # samples of a (nearly pure) power-law prior, fitted in the prior's own units (cycles/pixel)
    p = GaussianSpectralPrior((32, 32), alpha=1.8, amplitude=2e-3, omega0=1e-3, mean=0.1, channels=1)
    x = p.sample(64, torch.Generator().manual_seed(5), dtype=torch.float64)
    fitted = GaussianSpectralPrior.fit(x)
    assert fitted.alpha == pytest.approx(1.8, abs=0.05) and fitted.amplitude == pytest.approx(2e-3, rel=0.15)
    assert fitted.size == (32, 32) and fitted.channels == 1 and fitted.mean == pytest.approx(float(x.mean()))
    radius, power = radial_power_spectrum(x)
    assert radius.min() > 0 and (radius.diff() > 0).all() and power.shape == (64, radius.numel())
    with pytest.raises(ValueError, match="fewer than 2"):
        fit_power_law(x, 0.45 / corner_radius(32, 32), 0.46 / corner_radius(32, 32), exact=True)


# ============================================================================ diffusers loader


def tiny_unet(seed: int = 0):
    from diffusers import UNet2DModel

    torch.manual_seed(seed)
    unet = UNet2DModel(
        sample_size=16, in_channels=3, out_channels=3, block_out_channels=(16, 32), layers_per_block=1,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"), up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=8, attention_head_dim=8,
    )
    with torch.no_grad():
        for p in unet.parameters():  # no zero-initialised layers: outputs depend on everything
            p.add_(0.05 * torch.randn_like(p))
    return unet.eval()


SCHED = {"_class_name": "DDPMScheduler", "num_train_timesteps": 1000, "beta_schedule": "scaled_linear",
         "beta_start": 0.00085, "beta_end": 0.012, "prediction_type": "v_prediction"}


@pytest.fixture(scope="module")
def saved_unet(tmp_path_factory):
    unet = tiny_unet()
    root = tmp_path_factory.mktemp("unets")
    unet.save_pretrained(root / "pipe" / "unet")
    (root / "pipe" / "scheduler").mkdir()
    (root / "pipe" / "scheduler" / "scheduler_config.json").write_text(json.dumps(SCHED))
    unet.save_pretrained(root / "bare")
    return unet, root


def _ref_prior(unet, sched):
    from nfc_dps.priors.diffusers_prior import alphas_cumprod_from_config

    return EpsilonDenoiser(lambda x, t: unet(x, t).sample, alphas_cumprod_from_config(sched),
                           prediction_type=sched["prediction_type"], channels=3, size_multiple=2)


@pytest.mark.parametrize("layout", ["pipe", "bare"])
def test_load_diffusers_prior_matches_network(saved_unet, layout):
    from nfc_dps.priors.diffusers_prior import DEFAULT_SCHEDULE

    unet, root = saved_unet
    prior = load_diffusers_prior(root / layout, precision="float32")
    sched = SCHED if layout == "pipe" else DEFAULT_SCHEDULE
    assert isinstance(prior, EpsilonDenoiser) and prior.prediction_type == sched["prediction_type"]
    assert prior.channels == 3 and prior.size_multiple == 2
    g = torch.Generator().manual_seed(6)
    x = torch.randn(2, 3, 16, 16, generator=g)
    sigma = torch.tensor([0.3, 4.0])
    with torch.no_grad():
        want = _ref_prior(unet, sched)(x, sigma)
        got = prior(x, sigma)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    assert not any(p.requires_grad for p in prior.parameters())


def test_load_diffusers_prior_edm_and_tile(saved_unet, tmp_path):
    import shutil

    from nfc_dps.priors.diffusers_prior import _UNetCall

    unet, root = saved_unet
    shutil.copytree(root / "bare", tmp_path / "m")
    settings = {"parameterization": "edm", "sigma_data": 0.3, "sigma_min": 0.01, "sigma_max": 40.0, "tile": 8}
    (tmp_path / "m" / "nfc_dps_prior.json").write_text(json.dumps(settings))
    prior = load_diffusers_prior(tmp_path / "m")
    assert isinstance(prior, TiledPrior) and isinstance(prior.inner, EDMDenoiser) and prior.tile == 8
    assert not prior.overlap and prior.precision == prior.inner.precision  # one resolved precision
    assert (prior.inner.sigma_data, prior.inner.sigma_min, prior.inner.sigma_max) == (0.3, 0.01, 40.0)
    assert prior(torch.zeros(1, 3, 12, 20), 0.5).shape == (1, 3, 12, 20)
    # every setting of the file reaches the prior: the same as building it by hand
    (tmp_path / "m" / "nfc_dps_prior.json").write_text(json.dumps({**settings, "tile_overlap": True}))
    prior = load_diffusers_prior(tmp_path / "m", precision="float32")
    want = TiledPrior(EDMDenoiser(_UNetCall(unet, "float32", False), channels=3, sigma_data=0.3, size_multiple=2),
                      8, overlap=True)
    assert prior.overlap
    x = torch.randn(1, 3, 12, 20, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(prior(x, 0.5), want(x, 0.5), atol=1e-5, rtol=1e-5)


def test_load_diffusers_prior_errors(saved_unet, tmp_path):
    import shutil

    _, root = saved_unet
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_diffusers_prior(tmp_path / "missing")
    (tmp_path / "file.bin").write_bytes(b"x")
    with pytest.raises(NotADirectoryError, match="not a folder"):
        load_diffusers_prior(tmp_path / "file.bin")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_diffusers_prior(tmp_path / "empty")

    shutil.copytree(root / "bare", tmp_path / "wrongcls")
    cfg = json.loads((tmp_path / "wrongcls" / "config.json").read_text())
    (tmp_path / "wrongcls" / "config.json").write_text(json.dumps(dict(cfg, _class_name="UNet2DConditionModel")))
    with pytest.raises(ValueError, match="only UNet2DModel"):
        load_diffusers_prior(tmp_path / "wrongcls")

    shutil.copytree(root / "bare", tmp_path / "badjson")
    (tmp_path / "badjson" / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_diffusers_prior(tmp_path / "badjson")

    shutil.copytree(root / "bare", tmp_path / "corrupt")
    (tmp_path / "corrupt" / "diffusion_pytorch_model.safetensors").write_bytes(b"\x00garbage" * 20)
    with pytest.raises(OSError, match="could not load"):
        load_diffusers_prior(tmp_path / "corrupt")

    from safetensors.torch import load_file, save_file

    shutil.copytree(root / "bare", tmp_path / "partial")
    wfile = tmp_path / "partial" / "diffusion_pytorch_model.safetensors"
    sd = load_file(str(wfile))
    del sd["conv_in.weight"]
    save_file(sd, str(wfile))
    with pytest.raises(OSError, match=r"missing keys.*conv_in\.weight"):
        load_diffusers_prior(tmp_path / "partial")

    shutil.copytree(root / "bare", tmp_path / "unknown")
    (tmp_path / "unknown" / "nfc_dps_prior.json").write_text(json.dumps({"parametrisation": "edm"}))
    with pytest.raises(ValueError, match=r"unknown keys \['parametrisation'\]"):
        load_diffusers_prior(tmp_path / "unknown")


def test_load_diffusers_prior_refuses_what_it_cannot_map(saved_unet, tmp_path):
    """A typo in the parameterisation, a non-VP scheduler, zero-terminal-SNR betas and a tile the
    network cannot take are errors naming the file, not a silently different prior."""
    import shutil

    _, root = saved_unet
    cases = {
        "param": ({"parameterization": "EDM"}, None, r"nfc_dps_prior.json: parameterization 'EDM' is not one of edm, ddpm"),
        "ve": ({}, {"_class_name": "ScoreSdeVeScheduler", "sigma_max": 1348.0}, r"scheduler_config.json: ScoreSdeVeScheduler"),
        "zsnr": ({}, dict(SCHED, rescale_betas_zero_snr=True), r"scheduler_config.json: rescale_betas_zero_snr"),
        "tile": ({"parameterization": "edm", "tile": 9}, None, r"nfc_dps_prior.json: tile 9 must be a positive multiple of 2"),
    }
    for name, (prior_json, sched, match) in cases.items():
        shutil.copytree(root / "pipe", tmp_path / name)
        if prior_json:
            (tmp_path / name / "nfc_dps_prior.json").write_text(json.dumps(prior_json))
        if sched is not None:
            (tmp_path / name / "scheduler" / "scheduler_config.json").write_text(json.dumps(sched))
        with pytest.raises(ValueError, match=match):
            load_diffusers_prior(tmp_path / name, precision="float32")
    shutil.copytree(root / "pipe", tmp_path / "ddim")  # another VP scheduler of the same betas loads
    (tmp_path / "ddim" / "scheduler" / "scheduler_config.json").write_text(json.dumps(dict(SCHED, _class_name="DDIMScheduler")))
    assert isinstance(load_diffusers_prior(tmp_path / "ddim", precision="float32"), EpsilonDenoiser)


def test_native_bfloat16_on_cuda_needs_ampere(monkeypatch):
    """torch's is_bf16_supported() counts emulation as support; auto precision must not."""
    from nfc_dps.priors import diffusers_prior

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for major, native in ((7, False), (8, True), (9, True)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, m=major: (m, 5))
        assert diffusers_prior.native_bfloat16("cuda") is native
        assert diffusers_prior.resolve_precision("auto", "cuda") == ("bfloat16" if native else "float32")


def test_channel_mismatch_is_reported(saved_unet):
    _, root = saved_unet
    prior = load_diffusers_prior(root / "bare")
    with pytest.raises(ValueError, match="3-channel images, got 1 channels"):
        prior(torch.zeros(1, 1, 16, 16), 0.5)
    with pytest.raises(ValueError, match="multiple of 2"):
        prior(torch.zeros(1, 3, 15, 16), 0.5)


# ============================================================================ TiledPrior


class PointwisePrior(Prior):
    """Acts pixel by pixel: tiling must not change it."""

    channels = 3

    def __init__(self):
        super().__init__()
        self.shapes = []

    def denoise(self, x, sigma):
        self.shapes.append(tuple(x.shape))
        return torch.tanh(x) / (1 + sigma.view(-1, 1, 1, 1) ** 2)


class NonlocalPrior(PointwisePrior):
    """Depends on the whole input (like GroupNorm): shows the tiling."""

    def denoise(self, x, sigma):
        self.shapes.append(tuple(x.shape))
        s = sigma.view(-1, 1, 1, 1)
        return x - x.mean(dim=(-2, -1), keepdim=True) + torch.sin(x) * s + x.std(dim=(-2, -1), keepdim=True)


@pytest.mark.parametrize("overlap", [False, True])
def test_tiled_batch_independent(overlap):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(3, 3, 50, 70, generator=g, dtype=torch.float64)
    sigma = torch.tensor([0.1, 0.7, 0.1], dtype=torch.float64)
    tp = TiledPrior(NonlocalPrior(), 16, overlap=overlap)
    both = tp(x, sigma)
    assert both.shape == x.shape
    for b in range(3):
        assert torch.allclose(both[b : b + 1], tp(x[b : b + 1], sigma[b : b + 1]), atol=1e-12)
    assert all(s[-2:] == (16, 16) for s in tp.inner.shapes)
    assert torch.equal(tp(x, sigma), both)  # deterministic


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("size,tile", [((50, 70), 16), ((50, 70), 15), ((7, 9), 16), ((7, 40), 16)])
def test_tiled_non_multiple_sizes_exact_for_pointwise(size, tile, overlap):
    x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    sigma = torch.tensor([0.2, 1.5], dtype=torch.float64)
    inner = PointwisePrior()
    out = TiledPrior(inner, tile, overlap=overlap)(x, sigma)
    assert torch.allclose(out, inner.denoise(x, sigma), atol=1e-12)
    assert all(s[-2:] == (tile, tile) for s in inner.shapes[:-1])


@pytest.mark.parametrize("overlap", [False, True])
def test_tiled_calls_the_network_on_at_most_max_tiles(overlap):
    """Chunking the tiles bounds each network call and changes no value (a per-tile network)."""
    x = torch.randn(2, 3, 50, 70, generator=torch.Generator().manual_seed(11), dtype=torch.float64)
    sigma = torch.tensor([0.2, 1.5], dtype=torch.float64)
    whole = TiledPrior(NonlocalPrior(), 16, overlap=overlap)(x, sigma)
    chunked = TiledPrior(NonlocalPrior(), 16, overlap=overlap, max_tiles=5)
    assert torch.equal(chunked(x, sigma), whole)
    assert max(s[0] for s in chunked.inner.shapes) == 5 and len(chunked.inner.shapes) > 2
    with pytest.raises(ValueError, match="max_tiles"):
        TiledPrior(NonlocalPrior(), 16, max_tiles=0)


def test_tiled_equals_inner_at_tile_size():
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    sigma = torch.tensor([0.3, 0.9], dtype=torch.float64)
    inner = NonlocalPrior()
    assert torch.equal(TiledPrior(inner, 16)(x, sigma), inner.denoise(x, sigma))
    # a larger image is really tiled (differs from the whole-image call)
    big = torch.randn(1, 3, 40, 40, generator=torch.Generator().manual_seed(10), dtype=torch.float64)
    assert not torch.allclose(TiledPrior(inner, 16)(big, 0.3), inner.denoise(big, torch.tensor([0.3], dtype=torch.float64)))


@pytest.mark.parametrize("tile", [8, 16, 48])
def test_tiled_layout_is_the_fewest_tiles_that_overlap_flush_with_the_edges(tile):
    """Every axis: first and last tile flush with the image, the nominal overlap at least tile // 8
    with no fewer tiles reaching it, neighbours overlapping by at least half that after any move with
    sigma, and blending weights that cross-fade to a sum of one where two tiles meet."""
    tp = TiledPrior(PointwisePrior(), tile)
    least = max(1, tile // 8)
    sigmas = torch.logspace(-2, 2, 50).tolist()
    for n in range(tile + 1, 6 * tile, 3):
        k = tp.tiles_along(n)
        assert (k * tile - n) / (k - 1) >= least and (k == 2 or ((k - 1) * tile - n) / (k - 2) < least)
        for sigma, axis in itertools.product(sigmas, (0, 1)):
            pad, starts, weights = tp.layout(n, sigma, axis)
            assert pad == 0 and len(starts) == k and starts[0] == 0 and starts[-1] == n - tile
            assert all(tile - (b - a) >= (least + 1) // 2 for a, b in zip(starts, starts[1:]))
            total, cover = torch.zeros(n, dtype=torch.float64), torch.zeros(n)
            for start, w in zip(starts, weights):
                total[start:start + tile] += w
                cover[start:start + tile] += 1
            assert total.min() > 0
            assert torch.allclose(total[cover <= 2], torch.ones_like(total[cover <= 2]), atol=1e-12)


def test_tiled_blends_low_precision_in_float32():
    """bfloat16 in, bfloat16 out, and an identity network's output is its input bit for bit."""

    class Identity(PointwisePrior):
        def denoise(self, x, sigma):
            return x

    x = torch.randn(2, 3, 70, 101, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    out = TiledPrior(Identity(), 16)(x, torch.tensor([0.1, 0.5]))
    assert out.dtype == torch.bfloat16 and torch.equal(out, x)


def test_tiled_seams_move_with_sigma_and_blend_across_the_overlaps():
    """The inner tiles move with sigma; a prior that answers one constant per tile (the tile's mean)
    changes gradually across each overlap instead of jumping at a seam."""
    tp = TiledPrior(PointwisePrior(), 32)
    layouts = {tuple(tp.layout(100, s)[1]) for s in (0.05, 0.1, 0.2, 0.4, 0.8)}
    assert len(layouts) > 1

    class TileMean(PointwisePrior):
        def denoise(self, x, sigma):
            return x.mean(dim=(-2, -1), keepdim=True).expand_as(x)

    ramp = torch.linspace(0, 1, 100, dtype=torch.float64).expand(1, 3, 100, 100)
    for s in (0.05, 0.2):
        out = TiledPrior(TileMean(), 32)(ramp, s)[0, 0, 0]
        _, starts, _ = tp.layout(100, s, axis=1)
        means = torch.stack([ramp[0, 0, 0, a:a + 32].mean() for a in starts])
        assert torch.all(out.diff() >= 0) and out.diff().max() <= 0.3 * means.diff().min()


def test_tiled_is_differentiable():
    x = torch.randn(1, 3, 20, 30, generator=torch.Generator().manual_seed(11), dtype=torch.float64, requires_grad=True)
    for overlap in (False, True):
        out = TiledPrior(PointwisePrior(), 8, overlap=overlap)(x, 0.5)
        (grad,) = torch.autograd.grad(out.sum(), x)
        assert torch.allclose(grad, (1 - torch.tanh(x.detach()) ** 2) / 1.25, atol=1e-12)


# ============================================================================ reflect_pad


@pytest.mark.parametrize("h,w", [(1, 5), (2, 3), (3, 4), (5, 5)])
@pytest.mark.parametrize("pads", [(0, 0, 0, 0), (2, 1, 0, 3), (10, 1, 7, 0), (1, 10, 0, 13), (13, 17, 9, 5)])
def test_reflect_pad_matches_numpy(h, w, pads):
    x = np.random.default_rng(12).standard_normal((2, h, w))
    top, bottom, left, right = pads
    got = reflect_pad(torch.from_numpy(x), top, bottom, left, right).numpy()
    want = np.pad(x, ((0, 0), (top, bottom), (0, 0)), mode="reflect" if h > 1 else "edge")
    want = np.pad(want, ((0, 0), (0, 0), (left, right)), mode="reflect" if w > 1 else "edge")
    assert got.shape == (2, h + top + bottom, w + left + right)
    np.testing.assert_array_equal(got, want)


def test_tile_counts_and_moves():
    tp = TiledPrior(PointwisePrior(), 48)
    # fewest tiles overlapping by >= tile/8 pixels; a single covering tile has no seam
    assert [tp.tiles_along(n) for n in (256, 240, 64, 96, 40, 48, 20)] == [6, 6, 2, 3, 1, 1, 1]
    x = torch.zeros(1, 3, 256, 256, dtype=torch.float64)
    tp(x, 0.3)
    assert tp.inner.shapes == [(36, 3, 48, 48)]
    sigmas = torch.logspace(-2, 2, 50).tolist()
    for axis in (0, 1):  # inner seams move with sigma; a small image's padding too
        assert len({tuple(tp.layout(256, s, axis)[1]) for s in sigmas}) >= 5
        pads = {tp.layout(20, s, axis)[0] for s in sigmas}
        assert all(0 <= p <= 28 for p in pads) and len(pads) > 10


def test_seams_differ_between_noise_levels():
    """A non-local inner prior shows where the seams are: they must not sit still."""
    x = torch.randn(1, 3, 40, 40, generator=torch.Generator().manual_seed(12), dtype=torch.float64)
    tp, inner = TiledPrior(NonlocalPrior(), 16), NonlocalPrior()
    patterns = []
    for s in (0.1, 0.2, 0.3, 0.5, 0.8):
        residual = tp(x, s) - inner.denoise(x, torch.tensor([s], dtype=torch.float64))
        if not any(torch.allclose(residual, p, atol=1e-3) for p in patterns):
            patterns.append(residual)
    assert len(patterns) >= 3


def test_precision_option(saved_unet):
    from nfc_dps.priors.diffusers_prior import resolve_precision

    _, root = saved_unet
    with pytest.raises(ValueError, match="precision must be one of"):
        load_diffusers_prior(root / "bare", precision="float16")
    assert resolve_precision("float32", "cpu") == "float32"
    assert resolve_precision("auto", "cpu") in ("float32", "bfloat16")
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(13))
    sigma = torch.tensor([0.3, 4.0])
    full = load_diffusers_prior(root / "bare", precision="float32")
    half = load_diffusers_prior(root / "bare", precision="bfloat16")
    assert full.precision == "float32" and half.precision == "bfloat16"
    with torch.no_grad():
        want, got = full(x, sigma), half(x, sigma)
    assert got.dtype == torch.float32  # the sampler side stays in the input's dtype
    rel = float((got - want).norm() / want.norm())
    assert 0 < rel < 2e-2, rel  # bfloat16 really ran, and it is close


def test_prior_device_is_where_its_tensors_live():
    """``prior_device`` (where ``restore`` moves a measurement): a declared ``device`` attribute,
    else a network's parameters or an oracle's buffers; None for a prior holding no tensor; a
    wrapper answers for what it wraps."""
    from nfc_dps.priors.base import prior_device

    class Bare(Prior):
        def denoise(self, x, sigma):
            return x

    class Declared(Bare):
        def __init__(self):
            super().__init__()
            self.device = "meta"  # a subclass may set its own attribute of that name

    net = EDMDenoiser(torch.nn.Conv2d(1, 1, 1), sigma_data=0.5)
    assert prior_device(net) == torch.device("cpu")
    assert prior_device(GaussianSpectralPrior((8, 8), channels=1)) == torch.device("cpu")
    assert prior_device(Bare()) is None
    assert prior_device(Declared()) == torch.device("meta")
    meta = EDMDenoiser(torch.nn.Conv2d(1, 1, 1, device="meta"), sigma_data=0.5)
    assert prior_device(meta) == torch.device("meta") and prior_device(TiledPrior(meta, tile=8)) == torch.device("meta")
