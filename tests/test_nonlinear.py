"""Nonlinear forward models through restore(): the methods that take them run end to end, the
others refuse up front naming why, and bad measurements get clear errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import nfc_dps
from nfc_dps import build_operator
from nfc_dps.metrics import psnr
from nfc_dps.operators import FunctionOperator
from nfc_dps.priors.gaussian import GaussianSpectralPrior

SIZE = 16
FEW = {"nfc": {}, "daps": {"preset": "fast", "num_levels": 3, "langevin_steps": 5},
       "dps": {"preset": "fast", "num_steps": 5}, "dpir": {}}


@pytest.fixture(scope="module")
def prior():
    return GaussianSpectralPrior((SIZE, SIZE), channels=1)


def _truth(prior, n=2):
    return ((prior.sample(n, torch.Generator().manual_seed(0)) + 1) / 2).clamp(0, 1).float()


@pytest.mark.parametrize("task", ["hdr", "phase_retrieval", "deblur_camera"])
@pytest.mark.parametrize("method", sorted(FEW))
def test_the_methods_that_take_a_nonlinear_operator_run_end_to_end(prior, task, method):
    params = {"kernel_size": 5} if task == "deblur_camera" else {}
    op = build_operator(task, SIZE, **params)
    x = _truth(prior)
    y = op.measure(x, 0.02, torch.Generator().manual_seed(1))
    out = nfc_dps.restore(y, op, prior=prior, method=method, sigma_y=0.02, progress=False, **FEW[method])
    assert out.image.shape == x.shape and torch.isfinite(out.image).all()


def test_nfc_fits_an_hdr_measurement_to_its_noise(prior):
    """NFC's Gauss-Newton data steps on HDR: A(x_hat) matches y to about the noise, and the
    pixels HDR leaves unclipped are restored better than the measurement's own inverse gives them."""
    op = build_operator("hdr", SIZE)
    x = _truth(prior, 4)
    y = op.measure(x, 0.01, torch.Generator().manual_seed(1))
    out = nfc_dps.restore(y, op, prior=prior, sigma_y=0.01, progress=False)
    assert float((op.A(out.image) - y).pow(2).mean().sqrt()) < 0.03
    seen = (op.A(x) > 0) & (op.A(x) < 1)
    start = op.start(y)
    assert float((out.image - x)[seen].pow(2).mean()) < float((start - x)[seen].pow(2).mean())


def test_a_users_nonlinear_map_runs_through_restore(prior):
    op = FunctionOperator(lambda v: torch.sqrt(v.clamp_min(0) + 0.01), (1, SIZE, SIZE), (1, SIZE, SIZE), linear=False)
    x = _truth(prior)
    y = op.measure(x, 0.01, torch.Generator().manual_seed(1))
    out = nfc_dps.restore(y, op, prior=prior, sigma_y=0.01, progress=False)
    assert float(psnr(out.image, x).mean()) > 20


@pytest.mark.parametrize("method", ["ddnm", "ddrm", "diffpir"])
def test_methods_without_a_nonlinear_data_step_refuse_up_front(prior, method):
    op = build_operator("hdr", SIZE)
    y = op.measure(_truth(prior), 0.02, torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match=r"needs a linear operator.*use nfc, daps, dps, dpir"):
        nfc_dps.restore(y, op, prior=prior, method=method, sigma_y=0.02, progress=False)


def test_nfc_posterior_presets_say_what_a_nonlinear_operator_lacks(prior):
    op = build_operator("phase_retrieval", SIZE)
    y = op.measure(_truth(prior), 0.05, torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match="spectral prior covariance.*use NFC's default"):
        nfc_dps.restore(y, op, prior=prior, preset="fast", sigma_y=0.05, progress=False)


def test_a_phase_retrieval_measurement_of_the_wrong_shape_is_refused(prior):
    op = build_operator("phase_retrieval", SIZE)
    with pytest.raises(ValueError, match="padded grid of no image"):
        nfc_dps.restore(torch.rand(1, 1, 4, 24), op, prior=prior, sigma_y=0.05, progress=False)


def test_cli_simulates_and_restores_poisson_and_phase_retrieval(tmp_path, tiny_prior):
    """simulate -> restore -> PSNR against --gt: a Poisson measurement (a float TIFF: counts / peak
    leave [0, 1]) and phase retrieval's amplitudes; the twin rotation is scored as well as the image."""
    import numpy as np

    from nfc_dps import io as nio
    from nfc_dps.cli import main

    photos = tmp_path / "photos"
    photos.mkdir()
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:16, 0:16] / 16
    nio.write_image(photos / "a.png", np.clip(0.5 + 0.3 * np.sin(5 * xx)[..., None] * np.cos(3 * yy)[..., None]
                                              + 0.02 * rng.standard_normal((16, 16, 3)), 0, 1))
    for name, flags in (("poisson", ["--task", "deblur_gaussian", "--param", "kernel_size=5", "--noise", "poisson:20"]),
                        ("pr", ["--task", "phase_retrieval", "--noise-sigma", "0.05"])):
        sim, out = tmp_path / f"sim_{name}", tmp_path / f"out_{name}"
        assert main(["simulate", "--input", str(photos), "--output", str(sim), *flags, "-q"]) == 0
        (measurement,) = (sim / "measurements").iterdir()
        assert measurement.suffix == ".tif"
        assert main(["restore", "--input", str(sim / "measurements"), "--config", str(sim / "simulation.json"),
                     "--output", str(out), "--gt", str(sim / "ground_truth"), "--prior", str(tiny_prior), "-q"]) == 0
        rows = (out / "results.csv").read_text().splitlines()
        assert rows[1].split(",")[2] == "done" and float(rows[1].split(",")[5]) > 5
    record = json.loads((tmp_path / "sim_poisson" / "simulation.json").read_text())
    assert record["task"]["noise"] == "poisson:20"


@pytest.mark.parametrize("flags, message", [
    (["--noise", "poisson:0"], "peak must be > 0"),
    (["--noise", "poisson:20", "--noise-sigma", "0.1"], "pass one of --noise and --noise-sigma"),
    (["--noise", "laplace:1"], "unknown kind 'laplace'"),
])
def test_cli_refuses_a_bad_noise_in_words(tmp_path, capsys, flags, message):
    from nfc_dps.cli import main

    photos = tmp_path / "photos"
    photos.mkdir()
    from nfc_dps import io as nio

    nio.write_image(photos / "a.png", np.full((8, 8), 0.5, np.float32))
    assert main(["simulate", "--input", str(photos), "--output", str(tmp_path / "o"), "--task", "denoise", *flags]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_restarts_keep_the_chain_the_measurement_fits_best(prior):
    op = build_operator("phase_retrieval", SIZE)
    x = _truth(prior)
    y = op.measure(x, 0.05, torch.Generator().manual_seed(1))
    kw = dict(prior=prior, method="daps", preset="fast", num_levels=3, langevin_steps=5, sigma_y=0.05, progress=False)
    chains = nfc_dps.restore(y, op, num_samples=3, **kw).samples  # (K, B, ...): the same chains
    best = nfc_dps.restore(y, op, restarts=3, **kw)
    fits = torch.stack([(op.A(chains[j]) - y).pow(2).flatten(1).sum(1) for j in range(3)], 1)
    torch.testing.assert_close(best.image, chains[fits.argmin(1), torch.arange(2)])
    with pytest.raises(ValueError, match="deterministic"):
        nfc_dps.restore(y, op, prior=prior, restarts=2, sigma_y=0.05, progress=False)
    with pytest.raises(ValueError, match="restarts must be an int >= 1"):
        nfc_dps.restore(y, op, restarts=0, **kw)


def test_cli_refuses_restarts_that_cannot_work(tmp_path, capsys, tiny_prior):
    from nfc_dps import io as nio
    from nfc_dps.cli import main

    photos = tmp_path / "photos"
    photos.mkdir()
    nio.write_image(photos / "a.png", np.full((16, 16, 3), 0.5, np.float32))
    for flags, message in ((["--restarts", "0"], "--restarts must be >= 1"),
                           (["--restarts", "2"], "needs a stochastic sampler")):
        assert main(["restore", "--input", str(photos), "--output", str(tmp_path / "o"), "--task", "denoise",
                     "--prior", str(tiny_prior), *flags]) == 2
        assert message in capsys.readouterr().err
    assert main(["restore", "--input", str(photos), "--output", str(tmp_path / "o"), "--task", "denoise",
                 "--prior", str(tiny_prior), "--method", "daps", "--steps", "2", "--set", "langevin_steps=2",
                 "--restarts", "2", "-q"]) == 0
    assert json.loads((tmp_path / "o" / "summary.json").read_text())["restarts"] == 2


def test_phase_retrieval_starts_nfc_high_within_a_denoisers_range():
    """Its first estimate holds no image: NFC's default starts at AUTO_SIGMA_MAX_UNINFORMED (capped
    at a denoiser-only prior's range), the other operators where they did."""
    from nfc_dps.operators.nonlinear import ModelUnitsOperator
    from nfc_dps.samplers.nfc_continuation import (
        AUTO_SIGMA_MAX,
        AUTO_SIGMA_MAX_INPAINT,
        AUTO_SIGMA_MAX_UNINFORMED,
        top_sigma,
    )

    pr, hdr = build_operator("phase_retrieval", SIZE), build_operator("hdr", SIZE)
    assert top_sigma("auto", ModelUnitsOperator(pr), 0.1) == AUTO_SIGMA_MAX_UNINFORMED > AUTO_SIGMA_MAX
    camera = build_operator("deblur_camera", SIZE, kernel_size=5)
    assert top_sigma("auto", ModelUnitsOperator(camera), 0.1) == AUTO_SIGMA_MAX
    # a clipped sensor's measurement fills its clipped pixels: the inpainting range, never below the noise
    for clipped in (hdr, build_operator("exposure", SIZE, ev=1.0)):
        assert top_sigma("auto", ModelUnitsOperator(clipped), 0.1) == AUTO_SIGMA_MAX_INPAINT < AUTO_SIGMA_MAX
        assert top_sigma("auto", ModelUnitsOperator(clipped), 0.3) == 0.3
    assert top_sigma(2.0, ModelUnitsOperator(pr), 0.1) == 2.0
    from nfc_dps.priors.denoiser import DenoiserPrior

    denoiser = DenoiserPrior(lambda x, s: x, sigma_max=0.2, channels=1)
    y = pr.measure(torch.full((1, 1, SIZE, SIZE), 0.5), 0.05, torch.Generator().manual_seed(0))
    seen = []
    nfc_dps.restore(y, pr, prior=denoiser, sigma_y=0.05, progress=False, callback=seen.append)
    assert seen[0]["sigma"] <= 2 * 0.2 + 1e-9  # model units: twice the denoiser's [0, 1] range


@pytest.mark.parametrize("task", ["hdr", "deblur_camera"])
def test_poisson_noise_on_a_nonlinear_operator_restores(prior, task):
    """A non-Gaussian measurement of a nonlinear operator is whitened into a weighted nonlinear one."""
    params = {"kernel_size": 5} if task == "deblur_camera" else {}
    op = build_operator(task, SIZE, **params)
    x = _truth(prior)
    y = op.measure(x, noise="poisson:30", generator=[torch.Generator().manual_seed(i) for i in range(2)])
    for method, kw in (("nfc", {}), ("dps", {"preset": "fast", "num_steps": 3})):
        out = nfc_dps.restore(y, op, prior=prior, method=method, noise="poisson:30", progress=False, **kw)
        assert torch.isfinite(out.image).all()


def test_daps_draws_do_not_depend_on_the_batch_on_weighted_and_nonlinear_operators(prior):
    """The Langevin step's bound is per image: an image alone draws what it draws in a batch."""
    kw = dict(prior=prior, method="daps", preset="fast", num_levels=3, langevin_steps=5, progress=False, seed=[3, 4])
    x = _truth(prior)
    for task, noise in (("deblur_gaussian", "poisson:30"), ("phase_retrieval", "gaussian:0.05")):
        op = build_operator(task, SIZE, **({"kernel_size": 5} if task == "deblur_gaussian" else {}))
        y = op.measure(x, noise=noise, generator=[torch.Generator().manual_seed(i) for i in range(2)])
        both = nfc_dps.restore(y, op, noise=noise, **kw).image
        alone = nfc_dps.restore(y, op, noise=noise, max_batch=1, **kw).image
        torch.testing.assert_close(both, alone, atol=1e-5, rtol=0)


def test_hdr_starts_saturated_pixels_at_the_saturated_value():
    """Where the sensor saturated the scene mostly lies well past the clip: the first estimate takes
    the saturated reading (0 or 1) there, the unclipped inverse elsewhere; the inverse itself stays."""
    op = build_operator("hdr", 4)
    y = torch.tensor([-0.03, 0.0, 0.2, 0.5, 0.9, 1.0, 1.04]).view(1, 1, 1, 7)
    torch.testing.assert_close(op.inverse(y), (y - 0.5) / 2 + 0.5)
    torch.testing.assert_close(op.start(y), torch.tensor([0.0, 0.0, 0.35, 0.5, 0.7, 1.0, 1.0]).view(1, 1, 1, 7))


# -- a camera's over-exposure


def test_exposure_is_a_gain_in_linear_light_clipped_at_white():
    from nfc_dps.operators.nonlinear import Exposure, linear_to_srgb, srgb_to_linear

    op = build_operator("exposure", 16, ev=2.0)
    assert isinstance(op, Exposure) and op.gain == 4.0 and op.describe()["ev"] == 2.0
    x = torch.linspace(0, 1, 3 * 16 * 16).reshape(1, 3, 16, 16)
    y = op.A(x)
    expected = linear_to_srgb((4.0 * srgb_to_linear(x)).clamp(0, 1))
    assert torch.allclose(y, expected)
    knee = float(linear_to_srgb(torch.tensor(0.25)))  # above srgb(1/4) the sensor saturates
    assert torch.all(y[x >= knee + 1e-4] == 1) and torch.all(y[x < knee - 1e-3] < 1)
    assert torch.all(y[x == 0] == 0)  # shadows never clip
    unclipped = x < knee - 1e-3
    assert torch.allclose(op.inverse(y)[unclipped], x[unclipped], atol=1e-5)
    start = op.start(y)
    assert torch.all(start[y >= 1] == 1) and torch.allclose(start[unclipped], x[unclipped], atol=1e-5)


def test_exposure_refuses_a_non_number_of_stops():
    from nfc_dps.operators.nonlinear import Exposure

    for bad in (float("nan"), float("inf"), True, "2", 17.0):
        with pytest.raises(ValueError, match="ev must be a finite number of stops"):
            Exposure(bad)
    assert Exposure(-1.0).gain == 0.5  # an under-exposure: nothing clips


def test_exposure_classical_answer_keeps_the_shadows():
    """The classical answer inpaints only the highlights: dark pixels (which never clip) keep the
    unclipped inverse, unlike HDR's, which holds pixels near 0 below the inverse of 0."""
    from nfc_dps.baselines import hdr_inverse_inpaint

    op = build_operator("exposure", 32, ev=1.0)
    yy, xx = torch.meshgrid(torch.linspace(0, 1, 32), torch.linspace(0, 1, 32), indexing="ij")
    x = (0.6 * xx + 0.4 * yy).expand(1, 3, 32, 32).contiguous()
    y = op.A(x)
    out = hdr_inverse_inpaint(op, y)
    dark = y < 0.02
    assert dark.any() and torch.allclose(out[dark], op.inverse(y)[dark], atol=1e-6)
    bright = y >= 0.98
    assert bright.any() and torch.all(out[bright] >= op.inverse(torch.ones(())) - 1e-6)


def test_only_a_measurement_that_clips_starts_at_the_inpainting_range():
    from nfc_dps.operators.nonlinear import ModelUnitsOperator
    from nfc_dps.samplers.nfc_continuation import AUTO_SIGMA_MAX, AUTO_SIGMA_MAX_INPAINT, top_sigma

    for op, clips in ((build_operator("exposure", SIZE, ev=-1.0), False), (build_operator("exposure", SIZE, ev=0.5), True),
                      (build_operator("hdr", SIZE, scale=0.5), False), (build_operator("hdr", SIZE, scale=2.0), True)):
        assert op.fills_clipped_pixels is clips
        assert top_sigma("auto", ModelUnitsOperator(op), 0.05) == (AUTO_SIGMA_MAX_INPAINT if clips else AUTO_SIGMA_MAX)
