"""sigma_y="auto": the patch-PCA noise level of a measurement (exact on white noise over a smooth image,
observed pixels only for inpainting), clear refusals, and restore() using one estimate per image."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import nfc_dps
from nfc_dps.noise_level import FLOOR, TEXTURE_ONLY, TEXTURE_READ, estimate_sigma, measurement_sigma, texture_corrected
from nfc_dps.operators import Inpainting


def smooth_image(size: int = 64, seed: int = 0) -> torch.Tensor:
    """A smooth colour image in [0.2, 0.8] (low-frequency cosines): (3, size, size)."""
    g = torch.Generator().manual_seed(seed)
    t = torch.linspace(0, 1, size)
    yy, xx = torch.meshgrid(t, t, indexing="ij")
    chans = [0.5 + 0.15 * torch.cos(2 * np.pi * (float(torch.rand(1, generator=g)) * xx + yy) + c) for c in range(3)]
    return torch.stack(chans)


@pytest.mark.parametrize("sigma", [0.005, 0.02, 0.1])
def test_white_noise_over_a_smooth_image_is_read_within_5_percent(sigma):
    x = smooth_image(128)
    y = x + sigma * torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
    assert estimate_sigma(y) == pytest.approx(sigma, rel=0.05)
    assert estimate_sigma(y, weak_texture=False) == pytest.approx(sigma, rel=0.05)
    small = y[:, :64, :64]  # fewer patches: a little low
    assert estimate_sigma(small) == pytest.approx(sigma, rel=0.12)


def test_weak_texture_patches_keep_fine_texture_from_passing_for_noise():
    """A photograph-like texture (fine stripes on half the image) under weak noise: every patch's PCA
    reads the stripes as noise, the weak-texture patches do not."""
    x = smooth_image(128)
    x[:, :, :64] += 0.02 * torch.randn(3, 128, 64, generator=torch.Generator().manual_seed(7)).cumsum(-1).sin()
    y = x + 0.005 * torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
    assert estimate_sigma(y) == pytest.approx(0.005, rel=0.1)
    assert estimate_sigma(y, weak_texture=False) > 1.3 * 0.005


def test_a_clean_image_gives_the_floor():
    assert estimate_sigma(smooth_image()) == FLOOR


def test_inpainting_reads_only_the_observed_pixels():
    """Missing pixels (zeros, no noise) would pull a whole-image estimate far off."""
    x = smooth_image(64)
    mask = torch.ones(64, 64)
    mask[16:48, 16:48] = 0
    op = Inpainting(mask)
    y = op.measure(x[None], 0.03, torch.Generator().manual_seed(2))
    assert measurement_sigma(y, op)[0] == pytest.approx(0.03, rel=0.05)
    assert abs(estimate_sigma(y[0]) - 0.03) > 0.1 * 0.03  # the hole's edges read as texture
    rng = np.random.default_rng(0)  # half the pixels at random: 2x2 patches (few samples: read a little low)
    scattered = Inpainting(torch.from_numpy((rng.random((128, 128)) < 0.5).astype(np.float32)))
    y = scattered.measure(smooth_image(128)[None], 0.03, torch.Generator().manual_seed(3))
    assert measurement_sigma(y, scattered)[0] == pytest.approx(0.03, rel=0.1)


def test_what_cannot_be_read_is_refused_in_words():
    with pytest.raises(ValueError, match="not an image"):
        measurement_sigma(torch.rand(1, 3, 24, 24), nfc_dps.build_operator("phase_retrieval", 16))
    with pytest.raises(ValueError, match="too small"):
        estimate_sigma(torch.rand(3, 4, 4))
    empty = Inpainting(torch.zeros(32, 32))
    with pytest.raises(ValueError, match="too few observed pixels"):
        measurement_sigma(torch.rand(1, 3, 32, 32), empty)
    with pytest.raises(ValueError, match="shape"):
        estimate_sigma(torch.rand(1, 3, 16, 16))


def test_restore_auto_uses_one_estimate_per_image(tiny_prior):
    op = nfc_dps.build_operator("denoise", 32)
    x = torch.stack([smooth_image(32, 0), smooth_image(32, 1)])
    y = torch.cat([op.measure(x[:1], 0.02, torch.Generator().manual_seed(0)),
                   op.measure(x[1:], 0.08, torch.Generator().manual_seed(1))])
    est = measurement_sigma(y, op)
    out = nfc_dps.restore(y, op, prior=str(tiny_prior), sigma_y="auto", num_levels=2, progress=False, seed=5)
    assert out.noise_sigma == est and est[1] > 2 * est[0]
    for b in range(2):  # image b is restore() of image b alone at its own estimate, with its seed
        alone = nfc_dps.restore(y[b:b + 1], op, prior=str(tiny_prior), sigma_y=est[b], num_levels=2, progress=False,
                                seed=5 + b)
        assert torch.equal(out.image[b:b + 1], alone.image) and alone.noise_sigma == est[b]
    one = nfc_dps.restore(y[0].numpy().transpose(1, 2, 0), op, prior=str(tiny_prior), sigma_y="auto", num_levels=2,
                          progress=False)
    assert isinstance(one.image, np.ndarray) and one.noise_sigma == pytest.approx(est[0])


def test_a_gray_image_stored_as_rgb_is_read_on_one_channel():
    """Equal channels carry one noise draw, not three: every cross-channel eigenvalue is 0."""
    x = smooth_image(128)[:1]
    y = (x + 0.03 * torch.randn(x.shape, generator=torch.Generator().manual_seed(4))).expand(3, -1, -1)
    assert estimate_sigma(y) == pytest.approx(0.03, rel=0.05)


def test_restore_auto_batch_of_one_reports_a_list(tiny_prior):
    op = nfc_dps.build_operator("denoise", 32)
    y = op.measure(smooth_image(32)[None], 0.05, torch.Generator().manual_seed(0))
    out = nfc_dps.restore(y, op, prior=str(tiny_prior), sigma_y="auto", num_levels=2, progress=False)
    assert isinstance(out.noise_sigma, list) and len(out.noise_sigma) == 1
    out = nfc_dps.restore(y[0], op, prior=str(tiny_prior), sigma_y="auto", num_levels=2, progress=False)
    assert isinstance(out.noise_sigma, float)


def test_restore_auto_bad_input(tiny_prior):
    op = nfc_dps.build_operator("denoise", 16)
    y = torch.rand(1, 3, 16, 16)
    with pytest.raises(ValueError, match="'auto'"):
        nfc_dps.restore(y, op, prior=str(tiny_prior), sigma_y="automatic")
    with pytest.raises(TypeError, match="one of sigma_y and noise"):
        nfc_dps.restore(y, op, prior=str(tiny_prior), sigma_y="auto", noise="poisson:30")
    with pytest.raises(ValueError, match="NaN"):
        nfc_dps.restore(torch.full((1, 3, 16, 16), float("nan")), op, prior=str(tiny_prior), sigma_y="auto")
    with pytest.raises(ValueError, match="with a calibration"):
        nfc_dps.restore(y, op, prior=str(tiny_prior), sigma_y="auto", calibration="whatever.json", num_samples=2)


# ---------------------------------------------------------------- the command line


def test_cli_restore_noise_sigma_auto_records_each_images_estimate(tmp_path, prior_dir, capsys):
    from test_cli import make_images, rows, run

    make_images(tmp_path / "clean", 2)
    sim = tmp_path / "sim"
    assert run("simulate", "-i", tmp_path / "clean", "-o", sim, "--task", "denoise", "--noise-sigma", 0.05) == 0
    out = tmp_path / "out"
    assert run("restore", "-i", sim / "measurements", "-o", out, "--task", "denoise", "--noise-sigma", "auto",
               "--gt", sim / "ground_truth", prior=prior_dir) == 0
    r = rows(out)
    assert [x["status"] for x in r] == ["done", "done"]
    sigmas = [float(x["noise_sigma"]) for x in r]
    assert all(0.035 < s < 0.07 for s in sigmas), sigmas  # 32-px smooth images with noise 0.05
    resolved = json.loads((out / "resolved_config.json").read_text())
    assert resolved["task"]["noise_sigma"] == "auto"
    assert run("restore", "-i", sim / "measurements", "-o", out, "--task", "denoise", "--noise-sigma", "auto",
               prior=prior_dir) == 0  # resumed: the rows keep their estimates
    assert [float(x["noise_sigma"]) for x in rows(out)] == sigmas and rows(out)[0]["status"] == "skipped"
    fixed = tmp_path / "fixed"
    assert run("restore", "-i", sim / "measurements", "-o", fixed, "--task", "denoise", prior=prior_dir) == 0
    assert [float(x["noise_sigma"]) for x in rows(fixed)] == [0.025, 0.025]


def test_cli_auto_is_restores_alone(tmp_path, capsys):
    from test_cli import make_images, run

    make_images(tmp_path / "clean", 1)
    assert run("simulate", "-i", tmp_path / "clean", "-o", tmp_path / "sim", "--task", "denoise",
               "--noise-sigma", "auto") == 2
    assert "simulate needs a stated noise level" in capsys.readouterr().err
    assert not (tmp_path / "sim").exists()
    assert run("restore", "-i", tmp_path / "clean", "-o", tmp_path / "o", "--task", "denoise",
               "--noise-sigma", "autom") == 2
    assert "'auto'" in capsys.readouterr().err


def test_the_noise_level_protocol_writes_its_rows_and_table(tmp_path):
    from nfc_dps.bench.cli import main
    from nfc_dps.bench.noise_level import noise_level_doc_table

    out = tmp_path / "nl"
    assert main(["--protocol", "noise_level", "--size", "32", "--tasks", "denoise", "--methods", "estimate",
                 "--image-names", "astronaut", "--threads", "1", "--out", str(out), "--no-plots"]) == 0
    import csv

    rows = list(csv.DictReader(open(out / "results.csv")))
    assert [float(r["sigma"]) for r in rows] == [0.0, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1]  # denoising: also 0
    assert all(r["estimate"] and r["psnr_input"] and not r["psnr_true"] and not r["note"] for r in rows)
    assert rows[0]["ratio"] == "" and float(rows[0]["psnr_input"]) == 100.0  # the photo itself: capped
    assert all(float(r["ratio"]) == pytest.approx(float(r["estimate"]) / float(r["sigma"]), rel=1e-3) for r in rows[1:])
    table = noise_level_doc_table(out, "bench/")
    assert table.startswith("| task | σ 0.002") and "| denoise | ×" in table and "results.csv" in table
    before = (out / "results.csv").read_text()
    assert main(["--protocol", "noise_level", "--size", "32", "--tasks", "denoise", "--methods", "estimate",
                 "--image-names", "astronaut", "--threads", "1", "--out", str(out), "--no-plots"]) == 0  # resumes
    assert (out / "results.csv").read_text() == before


def test_a_configs_auto_gives_way_to_the_noise_flag(tmp_path):
    import argparse

    from nfc_dps.cli.tasks import resolve_task
    from nfc_dps.config import ConfigBundle, parse_task

    bundle = ConfigBundle(task=parse_task({"task": "denoise", "noise_sigma": "auto"}, "my.yaml"))
    args = argparse.Namespace(task=None, param=None, noise_sigma=None, noise="poisson:30")
    task = resolve_task(args, bundle)
    assert task.noise == "poisson:30" and not task.estimates_noise
    args.noise = None
    assert resolve_task(args, bundle).estimates_noise


def test_the_table_counts_failed_images_in_their_cell():
    from nfc_dps.bench.noise_level import noise_level_table

    def row(image, ratio, note=""):
        return {"task": "denoise", "sigma": "0.01", "image": image, "ratio": ratio, "delta": "", "note": note}

    table = noise_level_table([row("a", "1.1"), row("b", "", "ValueError: nothing observable")])
    assert "| denoise | ×1.10, failed on 1 of 2 |" in table
    assert "| denoise | failed on 1 of 1 |" in noise_level_table([row("b", "", "ValueError: x")])


def test_a_camera_blur_is_read_as_a_blurred_measurement():
    """Blurred in linear light, its measurement holds no fine texture either: every patch is read,
    as for the blur family (weak-texture selection would keep only part of them)."""
    from nfc_dps.training.leaves import textured_leaves

    x = torch.from_numpy(textured_leaves(96, np.random.default_rng(0))).permute(2, 0, 1)[None].float()
    camera = nfc_dps.build_operator("deblur_camera", 96, kernel_size=9, kernel_std=1.5, boundary="circular")
    y = camera.measure(x, 0.01, torch.Generator().manual_seed(0))
    assert measurement_sigma(y, camera) == [estimate_sigma(y[0], None, weak_texture=False)]
    assert measurement_sigma(y, camera)[0] == pytest.approx(0.01, rel=0.05)


def test_a_sharp_read_is_corrected_for_the_texture_a_noise_free_photo_reads_as():
    """Below TEXTURE_ONLY a sharp measurement's read is its texture alone (noise 0); above, the
    texture's share comes off in quadrature; a blurred measurement's read is kept as it is."""
    assert texture_corrected(TEXTURE_ONLY * 0.99) == 0.0
    assert texture_corrected(0.01) == pytest.approx((0.01**2 - TEXTURE_READ**2) ** 0.5)
    x = smooth_image(64)[None]
    blur = nfc_dps.build_operator("deblur_gaussian", 64, boundary="circular")
    y = blur.measure(x, 0.003, torch.Generator().manual_seed(0))
    assert measurement_sigma(y, blur)[0] == pytest.approx(estimate_sigma(y[0], weak_texture=False))
    assert measurement_sigma(x, nfc_dps.build_operator("denoise", 64)) == [0.0]


def test_denoising_a_photo_whose_noise_reads_as_its_texture_returns_it_as_it_came(tiny_prior):
    """auto on a noise-free photo (here with 8-bit rounding only): noise 0, and the restoration is the
    photo itself, never a denoised copy that is further from it."""
    from nfc_dps.priors.training_data import load_skimage_image

    x = torch.from_numpy(np.ascontiguousarray(load_skimage_image("motorcycle_left")[100:164, 100:164])).permute(2, 0, 1)
    op = nfc_dps.build_operator("denoise", 64)
    out = nfc_dps.restore(x[None].float(), op, prior=str(tiny_prior), sigma_y="auto", progress=False)
    assert out.noise_sigma == [0.0]
    torch.testing.assert_close(out.image, x[None].float(), atol=1e-6, rtol=0)
    noisy = op.measure(x[None].float(), 0.02, torch.Generator().manual_seed(0))
    assert nfc_dps.restore(noisy, op, prior=str(tiny_prior), sigma_y="auto", progress=False).noise_sigma[0] > 0.015
