"""The classical answers of the nonlinear and Poisson tier (nfc_dps.baselines.nonlinear) and the
tier's protocol (nfc_dps.bench.nonlinear) on a tiny run."""

from __future__ import annotations

import pytest
import torch

from nfc_dps import build_operator
from nfc_dps.baselines import anscombe_tv, camera_tv, hdr_inverse_inpaint, hio_er, richardson_lucy
from nfc_dps.metrics import psnr
from nfc_dps.noise import PoissonNoise


def _smooth(n=2, size=24, seed=0, amplitude=0.3):
    g = torch.Generator().manual_seed(seed)
    yy, xx = torch.meshgrid(torch.linspace(0, 1, size), torch.linspace(0, 1, size), indexing="ij")
    phase = torch.rand(n, 3, 1, 1, generator=g) * 6
    return (0.5 + amplitude * torch.sin(4 * xx + phase) * torch.cos(3 * yy + phase)).float()


def _gens(n, seed=1):
    return [torch.Generator().manual_seed(seed + i) for i in range(n)]


def test_richardson_lucy_iterates_towards_the_sharp_image_without_noise():
    blur = build_operator("deblur_gaussian", 24, kernel_size=9, kernel_std=1.5)
    x = _smooth()
    y = blur.A(x)
    few, many = richardson_lucy(blur, y, 1e6, 2), richardson_lucy(blur, y, 1e6, 50)
    assert float(psnr(many, x).mean()) > float(psnr(few, x).mean()) > 0


def test_anscombe_tv_denoises_counts():
    x = _smooth()
    y = PoissonNoise(20).sample(x, _gens(2))
    assert float(psnr(anscombe_tv(y, 20.0), x).mean()) > float(psnr(y.clamp(0, 1), x).mean()) + 3


def test_hio_er_fits_the_amplitudes():
    op = build_operator("phase_retrieval", 16)
    x = _smooth(1, 16)
    y = op.A(x)
    out = hio_er(op, y, hio_iterations=100, er_iterations=50, starts=2)
    assert out.shape == x.shape and float(out.min()) >= 0 and float(out.max()) <= 1
    fit = float((op.A(out) - y).norm() / y.norm())
    assert fit < float((op.A(torch.full_like(x, float(x.mean()))) - y).norm() / y.norm())


def test_hdr_inverse_inpaint_keeps_the_unclipped_pixels_and_fills_the_clipped():
    op = build_operator("hdr", 24)
    x = _smooth(amplitude=0.48)  # clipped regions with curvature the inpainting can follow
    y = op.A(x)
    out = hdr_inverse_inpaint(op, y)
    seen = ((y > 0.02) & (y < 0.98)).all(1, keepdim=True).expand_as(x)
    assert float((out - x)[seen].abs().max()) < 0.05
    # the clipped pixels stay on their side of the clip: no worse than the clip value itself
    assert float(psnr(out, x).mean()) >= float(psnr(op.start(y).clamp(0, 1), x).mean()) - 0.05
    low = y <= 0.02
    assert bool((out[low] <= 0.25 + 1e-6).all()) and bool((out[y >= 0.98] >= 0.75 - 1e-6).all())


def test_camera_tv_deblurs_in_linear_light():
    op = build_operator("deblur_camera", 24, kernel_size=9, kernel_std=1.5, boundary="circular")
    x = _smooth()
    y = op.measure(x, 0.01, torch.Generator().manual_seed(0))
    assert float(psnr(camera_tv(op, y, 0.01), x).mean()) > float(psnr(y.clamp(0, 1), x).mean())


@pytest.mark.slow
def test_the_tier_runs_resumes_and_tables_its_rows(tmp_path):
    from nfc_dps.bench.cli import main

    args = ["--protocol", "nonlinear", "--size", "16", "--zoom", "4", "--num-images", "1", "--tasks",
            "hdr,poisson_denoise_10", "--methods", "nfc,nfc-gaussian,classical", "--out", str(tmp_path / "o")]
    assert main(args) == 0
    rows = (tmp_path / "o" / "results.csv").read_text().splitlines()
    assert len(rows) == 1 + 2 + 3  # hdr: nfc, classical; Poisson: nfc, nfc-gaussian, classical
    summary = (tmp_path / "o" / "summary.md").read_text()
    assert "| nfc-gaussian | 8 | – |" in summary and "Anscombe + TV" in summary  # 8 calls on denoising
    assert main(args) == 0  # a rerun adds nothing
    assert (tmp_path / "o" / "results.csv").read_text().splitlines() == rows


def test_the_gaussian_likelihood_row_takes_photon_spikes_past_the_gaussian_range(tiny_prior):
    """At peak 10 a bright pixel's counts / 10 reach past what Gaussian noise of the reference std
    explains; the row clips them into restore's range rather than failing on every image."""
    from types import SimpleNamespace

    import nfc_dps
    from nfc_dps.bench.nonlinear import SETTINGS, NonlinearTier

    setting = SETTINGS["poisson_deblur_10"]
    op = build_operator("deblur_gaussian", 16, kernel_size=5, kernel_std=1.0, boundary="circular")
    y = op.measure(_smooth(1, 16), noise=setting.noise, generator=torch.Generator().manual_seed(0))
    y[..., 3, 3] = 3.0  # a spike: 30 photons where about 10 are expected
    with pytest.raises(ValueError, match="outside the"):
        nfc_dps.restore(y, op, prior=str(tiny_prior), noise=nfc_dps.noise.GaussianNoise(setting.noise.reference_std()),
                        progress=False)
    tier = object.__new__(NonlinearTier)
    tier.spec, tier.names, tier.prior = SimpleNamespace(seed=0), ["a"], nfc_dps.load_prior(str(tiny_prior))
    est, nfe = tier._estimate(SimpleNamespace(setting=setting, op=op, y=y), "nfc-gaussian")
    assert est.shape == y.shape and nfe == 16 and bool(torch.isfinite(est).all())
