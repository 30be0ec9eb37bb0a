"""noise="poisson-gaussian:auto" / "poisson:auto": the local mean-variance fit of nfc_dps.noise_level
(peak and read std recovered on a piecewise-smooth image with known Poisson-Gaussian noise, observed
pixels only for inpainting, refusals in words), restore() using one estimated model per image and
recording it, and the command line (results.csv, the manifest, the console; refused outside restore)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import nfc_dps
from nfc_dps.noise import EstimatedNoise, PoissonGaussianNoise, PoissonNoise
from nfc_dps.noise_level import (
    PEAK_CAP,
    _mean_variance_fit,
    estimate_shot_noise,
    estimated_models,
    measurement_shot_noise,
)
from nfc_dps.operators import Inpainting


def piecewise_smooth(size: int = 128) -> torch.Tensor:
    """Four vertical bands, each a gentle ramp, per channel at other intensities: (3, size, size) in [0, 0.97]."""
    t = torch.linspace(0, 1, size, dtype=torch.float64)
    yy, xx = torch.meshgrid(t, t, indexing="ij")
    steps = torch.floor(4 * xx) / 4 + 0.15 * yy
    return torch.stack([0.05 + 0.8 * steps, 0.1 + 0.7 * (1 - steps), 0.05 + 0.6 * steps.flip(1)]).clamp(0, 1)


def noisy(peak: float, sigma: float, seed: int = 0, size: int = 128) -> torch.Tensor:
    return PoissonGaussianNoise(peak, sigma).sample(piecewise_smooth(size)[None], torch.Generator().manual_seed(seed))


def test_peak_and_read_noise_are_recovered_on_a_piecewise_smooth_image():
    """Var[y | x] = x / peak + sigma^2: peak within 10 %, the read std within 15 % (seeded draws)."""
    y = noisy(100, 0.03)[0]
    peak, sigma = estimate_shot_noise(y)
    assert peak == pytest.approx(100, rel=0.10) and sigma == pytest.approx(0.03, rel=0.15)
    peak, sigma = estimate_shot_noise(y, weak_texture=False)  # a blurred measurement's read: every patch
    assert peak == pytest.approx(100, rel=0.10) and sigma == pytest.approx(0.03, rel=0.15)
    peak, sigma = estimate_shot_noise(noisy(30, 0.0, seed=1)[0], read_noise=False)  # poisson:auto
    assert peak == pytest.approx(30, rel=0.10) and sigma == 0.0


def test_no_shot_noise_gives_the_capped_peak():
    """A variance that does not grow with the intensity fits slope 0: the peak is PEAK_CAP, the read
    std the variance's root."""
    means, counts = np.array([0.1, 0.3, 0.5, 0.7]), np.ones(4)
    assert _mean_variance_fit(means, np.full(4, 4e-4), counts, True) == (0.0, pytest.approx(4e-4))
    assert _mean_variance_fit(means, 4e-4 - means * 1e-4, counts, True) == (0.0, pytest.approx(3.6e-4))
    assert _mean_variance_fit(means, means / 50, counts, True) == (pytest.approx(1 / 50), pytest.approx(0, abs=1e-12))
    assert _mean_variance_fit(means, means / 50 - 1e-4, counts, True)[1] == 0.0  # a negative offset: b = 0
    x = piecewise_smooth()
    y = x + 0.02 * torch.randn(x.shape, generator=torch.Generator().manual_seed(2), dtype=x.dtype)
    peak, sigma = estimate_shot_noise(y, weak_texture=False)
    assert peak == PEAK_CAP and sigma == pytest.approx(0.02, rel=0.1)
    flat = 0.5 + 1e-3 * torch.randn(3, 64, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="too flat to fit"):
        estimate_shot_noise(flat)  # one intensity: slope and offset cannot be told apart
    peak, _ = estimate_shot_noise(flat, read_noise=False)  # poisson:auto: all of the variance is shot noise
    assert peak == pytest.approx(0.5 / 1e-3**2, rel=0.1)


def test_inpainting_is_fitted_at_the_observed_pixels_only():
    """The missing pixels (zeros, no noise) would read as a dark, noise-free intensity."""
    x = piecewise_smooth(128)[None].float()
    mask = torch.ones(128, 128)
    mask[32:80, 40:88] = 0
    op = Inpainting(mask)
    y = op.measure(x, noise=PoissonGaussianNoise(100, 0.03), generator=torch.Generator().manual_seed(3))
    (peak, sigma), = measurement_shot_noise(y, op)
    assert peak == pytest.approx(100, rel=0.10) and sigma == pytest.approx(0.03, rel=0.10)
    assert estimate_shot_noise(y[0])[1] < 0.8 * 0.03  # the hole read too
    assert estimated_models(y, op, EstimatedNoise("poisson-gaussian")) == [PoissonGaussianNoise(peak, sigma)]
    assert estimated_models(y, op, EstimatedNoise("poisson")) == [PoissonNoise(measurement_shot_noise(y, op, False)[0][0])]


def test_what_cannot_be_fitted_is_refused_naming_the_image():
    with pytest.raises(ValueError, match=r"poisson-gaussian:auto: the measurement \(4x4\) is too small to fit its "
                                         r"shot noise: give the noise \(e.g. poisson-gaussian:30,0.01\)"):
        measurement_shot_noise(torch.rand(1, 3, 4, 4), nfc_dps.build_operator("denoise", 4))
    with pytest.raises(ValueError, match="poisson:auto: a PhaseRetrieval measurement is not an image"):
        measurement_shot_noise(torch.rand(1, 3, 24, 24), nfc_dps.build_operator("phase_retrieval", 16), False)
    flat = torch.full((1, 3, 48, 48), 0.4) + 0.01 * torch.randn(1, 3, 48, 48, generator=torch.Generator().manual_seed(0))
    batch = torch.cat([noisy(100, 0.03, size=48).float(), flat])
    with pytest.raises(ValueError, match="poisson-gaussian:auto: image 1 of 2 is too flat to fit its shot noise"):
        measurement_shot_noise(batch, nfc_dps.build_operator("denoise", 48))
    clipped = noisy(10, 0.02, size=48).clamp(0, 1)  # clipped at both ends, too noisy for bins far from them
    with pytest.raises(ValueError, match="it is clipped at 0 and 1"):
        measurement_shot_noise(clipped, nfc_dps.build_operator("denoise", 48))
    with pytest.raises(ValueError, match="NaN"):
        estimate_shot_noise(torch.full((3, 32, 32), float("nan")))


# ---------------------------------------------------------------- restore()


def test_restore_uses_and_records_one_estimated_model_per_image(tiny_prior):
    op = nfc_dps.build_operator("denoise", 64)
    y = torch.cat([noisy(100, 0.03, seed=4, size=64), noisy(20, 0.01, seed=5, size=64)]).float()
    models = estimated_models(y, op, EstimatedNoise("poisson-gaussian"))
    out = nfc_dps.restore(y, op, prior=str(tiny_prior), noise="poisson-gaussian:auto", num_levels=2, progress=False,
                          seed=5)
    assert out.noise == models and out.noise_sigma is None and models[1].peak < models[0].peak
    for b in range(2):  # image b is restore() of image b alone with its own model and seed
        alone = nfc_dps.restore(y[b:b + 1], op, prior=str(tiny_prior), noise=models[b], num_levels=2, progress=False,
                                seed=5 + b)
        assert torch.equal(out.image[b:b + 1], alone.image) and alone.noise == models[b]
    counts = noisy(30, 0.0, size=64).float()  # poisson:auto: a measurement of counts (>= 0)
    one = nfc_dps.restore(counts[0].numpy().transpose(1, 2, 0), op, prior=str(tiny_prior), noise="poisson:auto",
                          num_levels=2, progress=False)
    assert isinstance(one.image, np.ndarray) and one.noise == estimated_models(counts, op, EstimatedNoise("poisson"))[0]
    with pytest.raises(ValueError, match="cannot be negative.*with read noise use poisson-gaussian"):
        nfc_dps.restore(y[:1], op, prior=str(tiny_prior), noise="poisson:auto", num_levels=2, progress=False)
    gauss = nfc_dps.restore(y[:1], op, prior=str(tiny_prior), sigma_y="auto", num_levels=2, progress=False)
    assert gauss.noise == [nfc_dps.noise.GaussianNoise(gauss.noise_sigma[0])]  # the Gaussian auto: the same record


def test_restore_refuses_an_estimated_noise_where_it_cannot_work(tiny_prior):
    op = nfc_dps.build_operator("denoise", 32)
    y = noisy(30, 0.01, size=32).float()
    with pytest.raises(TypeError, match="one of sigma_y and noise"):
        nfc_dps.restore(y, op, prior=str(tiny_prior), sigma_y=0.1, noise="poisson:auto")
    with pytest.raises(ValueError, match="noise='poisson-gaussian:auto' with a calibration"):
        nfc_dps.restore(y, op, prior=str(tiny_prior), noise="poisson-gaussian:auto", calibration="c.json", num_samples=2)
    with pytest.raises(ValueError, match="auto stands for all"):
        nfc_dps.restore(y, op, prior=str(tiny_prior), noise="poisson-gaussian:auto,0.01")


# ---------------------------------------------------------------- the command line


def _simulated(tmp_path, noise: str = "poisson-gaussian:60,0.02"):
    from test_cli import make_images, run

    make_images(tmp_path / "clean", 2, h=64, w=64)
    sim = tmp_path / "sim"
    assert run("simulate", "-i", tmp_path / "clean", "-o", sim, "--task", "denoise", "--noise", noise) == 0
    return sim


def test_cli_restore_records_and_prints_each_images_estimate(tmp_path, prior_dir, capsys):
    from test_cli import rows

    from nfc_dps.cli import main

    sim = _simulated(tmp_path)
    capsys.readouterr()
    out = tmp_path / "out"
    assert main(["restore", "-i", str(sim / "measurements"), "-o", str(out), "--task", "denoise", "--noise",
                 "poisson-gaussian:auto", "--steps", "2", "--prior", str(prior_dir)]) == 0
    err = capsys.readouterr().err
    r = rows(out)
    assert [x["status"] for x in r] == ["done", "done"] and all(x["noise_sigma"] == "" for x in r)
    manifest = json.loads((out / "manifest.json").read_text())
    for row in r:
        kind, _, values = row["noise"].partition(":")
        peak, sigma = (float(v) for v in values.split(","))
        assert kind == "poisson-gaussian" and 30 < peak < 120 and sigma < 0.05
        assert f"{row['name']}: noise estimated at {row['noise']} (peak: photons" in err, err
        assert manifest["images"][row["name"]]["noise"] == row["noise"]
    resolved = json.loads((out / "resolved_config.json").read_text())
    assert resolved["task"]["noise"] == "poisson-gaussian:auto"
    assert main(["restore", "-i", str(sim / "measurements"), "-o", str(out), "--task", "denoise", "--noise",
                 "poisson-gaussian:auto", "--steps", "2", "--prior", str(prior_dir), "--quiet"]) == 0
    assert [(x["status"], x["noise"]) for x in rows(out)] == [("skipped", x["noise"]) for x in r]  # resumed, kept


@pytest.mark.parametrize("command", ["simulate", "calibrate"])
def test_cli_refuses_an_estimated_noise_outside_restore_naming_the_flag_and_value(tmp_path, capsys, command):
    from test_cli import make_images, run

    make_images(tmp_path / "clean", 1)
    io = ["--images", tmp_path / "clean", "--out", tmp_path / "o", "--samples", "2"] if command == "calibrate" \
        else ["-i", tmp_path / "clean", "-o", tmp_path / "o"]
    assert run(command, *io, "--task", "denoise", "--noise", "poisson-gaussian:auto") == 2
    err = capsys.readouterr().err
    assert "--noise 'poisson-gaussian:auto': poisson-gaussian's peak,sigma are read from each measurement by " \
           "restore only" in err, err
    assert not (tmp_path / "o").exists()
    config = tmp_path / "task.yaml"
    config.write_text("task: denoise\nnoise: poisson:auto\n")
    assert run(command, *io, "--config", config) == 2
    err = capsys.readouterr().err
    assert f"{config}: noise poisson:auto is restore's" in err and f"{command} needs a stated noise" in err, err


def test_cli_restore_refuses_auto_beside_a_calibration_and_a_malformed_spec(tmp_path, capsys):
    from test_cli import make_images, run

    make_images(tmp_path / "clean", 1)
    assert run("restore", "-i", tmp_path / "clean", "-o", tmp_path / "o", "--task", "denoise", "--noise",
               "poisson:auto", "--calibration", tmp_path / "c.json", "--samples", "2", "--preset", "fast") == 2
    assert "with --noise poisson:auto: a calibration holds at the noise level" in capsys.readouterr().err
    assert run("restore", "-i", tmp_path / "clean", "-o", tmp_path / "o", "--task", "denoise", "--noise",
               "poisson:30,auto") == 2
    assert "--noise 'poisson:30,auto': auto stands for all of poisson's peak" in capsys.readouterr().err


# ---------------------------------------------------------------- the noise-level tier's shot-noise grid


def test_the_shot_noise_grid_writes_its_rows_and_table(tmp_path, capsys):
    import csv

    from nfc_dps.bench.cli import main
    from nfc_dps.bench.noise_level import SHOT_PEAKS, SHOT_SIGMAS, shot_doc_table

    out = tmp_path / "shot"
    argv = ["--protocol", "noise_level", "--size", "32", "--tasks", "poisson_gaussian", "--methods", "estimate",
            "--image-names", "astronaut", "--threads", "1", "--out", str(out), "--no-plots"]
    assert main(argv) == 0
    rows = list(csv.DictReader(open(out / "poisson_gaussian.csv")))
    assert [(float(r["peak"]), float(r["sigma"])) for r in rows] == [(p, s) for s in SHOT_SIGMAS for p in SHOT_PEAKS]
    assert not (out / "results.csv").exists() and all(r["psnr_input"] and not r["psnr_true"] for r in rows)
    for r in rows:
        assert r["note"] or float(r["peak_ratio"]) == pytest.approx(float(r["est_peak"]) / float(r["peak"]), rel=1e-3)
        assert (r["sigma_ratio"] == "") == (float(r["sigma"]) == 0)  # read std 0: poisson:auto, no read std
    table = shot_doc_table(out, "bench/")
    assert table.startswith("| peak | read σ | estimated peak") and "| 10 | 0 | ×" in table and "(Poisson alone)" in table
    before = (out / "poisson_gaussian.csv").read_text()
    assert main(argv) == 0  # resumes: nothing to redo
    assert (out / "poisson_gaussian.csv").read_text() == before
    capsys.readouterr()
    assert main(argv[:5] + ["denoise,poisson_gaussian"] + argv[6:-3] + ["--out", str(tmp_path / "mixed"), "--no-plots"]) == 2
    assert "poisson_gaussian is a grid of its own (its own results file, poisson_gaussian.csv)" in capsys.readouterr().err
    assert not (tmp_path / "mixed").exists()
