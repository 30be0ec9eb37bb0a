"""Blind deblurring (task ``deblur_blind``): the kernel estimated from the photo alone on exact cases,
the trivial answer avoided, what the API and the CLI give, and bad input refused in words."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from test_battery4 import main_with
from test_cli import make_images

import nfc_dps
from nfc_dps.operators import BlindBlur, BlurOperator, build_operator, motion_kernel
from nfc_dps.operators.kernel_estimation import default_kernel_size, estimate_kernel, kernel_error


def _shapes(size: int = 96, seed: int = 0) -> torch.Tensor:
    """A sharp synthetic scene (1, 3, size, size): overlapping flat rectangles and disks, in [0, 1]."""
    rng = np.random.default_rng(seed)
    img = np.full((size, size), 0.5)
    yy, xx = np.mgrid[:size, :size]
    for _ in range(40):
        v = rng.uniform(0.05, 0.95)
        if rng.random() < 0.5:
            y0, x0 = rng.integers(0, size, 2)
            h, w = rng.integers(6, size // 3, 2)
            img[y0:y0 + h, x0:x0 + w] = v
        else:
            cy, cx, r = *rng.uniform(0, size, 2), rng.uniform(3, size / 6)
            img[(yy - cy) ** 2 + (xx - cx) ** 2 < r * r] = v
    return torch.from_numpy(np.repeat(img[None], 3, 0))[None].float()


@pytest.fixture(scope="module")
def shaken() -> dict:
    x = _shapes(128)
    k = motion_kernel(13, 0.5, 4)
    y = BlurOperator(k, "valid").measure(x, sigma_y=0.005, generator=torch.Generator().manual_seed(0))
    return {"x": x, "k": k, "y": y}


def test_known_kernel_recovered_from_the_photo_alone(shaken):
    estimate = estimate_kernel(shaken["y"][0], 13)
    assert estimate.shape == (13, 13) and float(estimate.sum()) == pytest.approx(1.0)
    assert kernel_error(estimate, shaken["k"]) < 0.5


def test_the_delta_kernel_trap_is_avoided(shaken):
    """A blurred photo is explained by the delta kernel and the photo itself; the estimate is not that."""
    delta = torch.zeros(13, 13, dtype=torch.float64)
    delta[6, 6] = 1
    estimate = estimate_kernel(shaken["y"][0], 13)
    assert kernel_error(estimate, shaken["k"]) < 0.6 * kernel_error(delta, shaken["k"])
    assert float(estimate.max()) < 0.5  # spread along the path, not one pixel


def test_an_unblurred_photo_gives_a_concentrated_kernel():
    x = _shapes(128, seed=1)
    estimate = estimate_kernel(x[0, :, 6:-6, 6:-6], 13)  # the valid part of the identity blur
    grid = torch.arange(13, dtype=torch.float64) - 6
    spread = float((estimate * (grid[:, None] ** 2 + grid[None, :] ** 2)).sum())
    assert spread < 1.0  # within about a pixel of the centre


def test_default_kernel_size_scales_with_the_photo():
    assert default_kernel_size(256, 256) == 31
    assert default_kernel_size(512, 700) == 61
    assert default_kernel_size(64, 64) == 7 and default_kernel_size(40, 40) == 7
    assert all(default_kernel_size(n, n) % 2 == 1 for n in range(21, 900, 7))
    assert build_operator("deblur_blind").size == 31
    assert build_operator("deblur_blind", (512, 512)).size == 61
    assert build_operator("deblur_blind", kernel_size=15).size == 15


@pytest.mark.parametrize("size", [4, 1, 2.0, True])
def test_bad_kernel_sizes_are_refused_naming_the_value(size):
    with pytest.raises(ValueError, match="kernel_size must be an odd int"):
        BlindBlur(size)


def test_a_photo_too_small_for_the_kernel_is_refused_before_any_work():
    op = build_operator("deblur_blind", kernel_size=31)
    with pytest.raises(ValueError, match=r"40x40 photo is too small to estimate a 31-px kernel"):
        op.fitted(torch.rand(1, 3, 40, 40))
    with pytest.raises(ValueError, match="too small"):
        nfc_dps.restore(torch.rand(3, 40, 40), op, sigma_y=0.01, progress=False)


def test_restore_returns_the_estimated_kernel(shaken, prior_dir):
    op = build_operator("deblur_blind", kernel_size=13)
    y = shaken["y"][0, :, :48, :48]
    out = nfc_dps.restore(y, op, prior=prior_dir, sigma_y=0.01, num_levels=2, progress=False)
    assert isinstance(out.kernel, torch.Tensor) and out.kernel.shape == (13, 13)
    assert float(out.kernel.sum()) == pytest.approx(1.0, abs=1e-5)
    assert out.image.shape == (3, 60, 60) and out.frame == (6, 6, 48, 48)  # the scene, as a valid blur's
    once = nfc_dps.restore(y, BlindBlur(13, refinements=0), prior=prior_dir, sigma_y=0.01, num_levels=2,
                           progress=False)
    assert torch.allclose(once.kernel.double(), estimate_kernel(y, 13), atol=1e-6)  # from the photo alone
    assert out.nfe == 3 * once.nfe  # two refinements: the kernel from the restoration, restored again
    refined = BlindBlur(13, kernel=once.kernel).refined(y, once.image)
    assert torch.equal(BlindBlur(13, refinements=1).fitted(y).refined(y, once.image).kernel, refined.kernel)
    # numpy in, numpy out; a batch gets one kernel per image
    out = nfc_dps.restore(y.permute(1, 2, 0).numpy(), op, prior=prior_dir, sigma_y=0.01, num_levels=2, progress=False)
    assert isinstance(out.kernel, np.ndarray) and out.kernel.shape == (13, 13)
    batch = torch.stack([y, y.flip(-1)])
    out = nfc_dps.restore(batch, BlindBlur(13, refinements=0), prior=prior_dir, sigma_y=0.01, num_levels=2,
                          progress=False)
    assert out.kernel.shape == (2, 13, 13) and out.image.shape == (2, 3, 60, 60)
    assert torch.allclose(out.kernel[1].double(), estimate_kernel(y.flip(-1), 13), atol=1e-6)  # each image its own


def test_auto_noise_level_works_with_the_blind_task(shaken, prior_dir):
    op = build_operator("deblur_blind", kernel_size=13)
    out = nfc_dps.restore(shaken["y"][0, :, :48, :48], op, prior=prior_dir, sigma_y="auto", num_levels=2, progress=False)
    assert out.kernel.shape == (13, 13) and 0.001 <= out.noise_sigma < 0.05


def test_cli_writes_the_kernel_beside_the_restoration_and_it_can_be_reused(tmp_path, prior_dir):
    make_images(tmp_path / "photos", 2, h=48, w=48)
    out = tmp_path / "out"
    common = ("--steps", "2", "--prior", prior_dir, "--noise-sigma", "0.01")
    assert main_with("restore", "-i", tmp_path / "photos", "-o", out, "--task", "deblur_blind",
                     "--param", "kernel_size=7", *common) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    for name, entry in manifest["images"].items():
        stem = entry["outputs"][0][:-4]
        assert f"kernels/{stem}.npy" in entry["outputs"] and f"kernels/{stem}.png" in entry["outputs"]
        k = np.load(out / "kernels" / f"{stem}.npy")
        assert k.shape == (7, 7) and k.sum() == pytest.approx(1.0, abs=1e-5)
    # an estimated kernel restores another photo as a known one
    kernel = next((out / "kernels").glob("*.npy"))
    assert main_with("restore", "-i", tmp_path / "photos", "-o", tmp_path / "again", "--task", "deblur_kernel",
                     "--kernel", kernel, *common) == 0


def test_cli_refuses_to_replace_a_users_kernel_file(tmp_path, prior_dir, capsys):
    make_images(tmp_path / "photos", 1, h=48, w=48)
    out = tmp_path / "out"
    (out / "kernels").mkdir(parents=True)
    stem = next((tmp_path / "photos").iterdir()).stem
    mine = out / "kernels" / f"{stem}.npy"
    mine.write_bytes(b"the user's own file")
    code = main_with("restore", "-i", tmp_path / "photos", "-o", out, "--task", "deblur_blind", "--param",
                     "kernel_size=7", "--steps", "2", "--prior", prior_dir)
    assert code == 2 and mine.read_bytes() == b"the user's own file"
    assert "kernels/" in capsys.readouterr().err


def test_simulate_with_the_blind_task_names_how_to_draw_a_shaken_photo(tmp_path, capsys):
    make_images(tmp_path / "clean", 1, h=48, w=48)
    code = main_with("simulate", "-i", tmp_path / "clean", "-o", tmp_path / "sim", "--task", "deblur_blind")
    assert code == 2
    assert "--task deblur_motion" in capsys.readouterr().err


def test_shift_scores_find_the_shift_a_kernel_leaves_unknown():
    from nfc_dps.bench.blind import shift_scores
    from nfc_dps.metrics import psnr

    truth = _shapes(64)
    noisy = (truth + 0.02 * torch.randn(truth.shape, generator=torch.Generator().manual_seed(0))).clamp(0, 1)
    frame = (8, 8, 48, 48)
    moved = torch.roll(noisy, (1, -2), (-2, -1))  # the restoration one row down, two columns left
    score, similarity = shift_scores(moved, truth, frame)
    expected = float(psnr(noisy[..., 8:56, 8:56].double(), truth[..., 8:56, 8:56].double()))
    assert score == pytest.approx(expected, abs=1e-6) and 0 < similarity < 1
    assert float(psnr(moved[..., 8:56, 8:56].double(), truth[..., 8:56, 8:56].double())) < expected - 3


def test_blind_table_reports_the_error_ratio_against_the_true_kernel_and_counts_failures():
    from nfc_dps.bench.blind import blind_table

    rows = [{"family": "shake31", "image": im, "method": m, "psnr": p, "ssim": "0.8", "kernel_error": e, "nfe": n,
             "seconds": "1", "note": note}
            for im, m, p, e, n, note in (("a", "nfc-true", "30", "", "16", ""), ("b", "nfc-true", "20", "", "16", ""),
                                         ("a", "nfc-blind", "29", "0.3", "48", ""),
                                         ("b", "nfc-blind", "", "", "", "ValueError: too small"))]
    table = blind_table(rows)
    blind = next(line for line in table.splitlines() if "nfc-blind" in line)
    assert "(failed on 1 of 2)" in blind and "| 29.00 |" in blind
    assert f"{10 ** 0.1:.2f} / {10 ** 0.1:.2f}" in blind and "| 0.30 | 48 |" in blind


def test_the_blind_protocol_writes_its_rows_and_resumes(tmp_path, prior_dir):
    from nfc_dps.bench.blind import blind_doc_table
    from nfc_dps.bench.cli import main
    from nfc_dps.bench.tables import load_results

    out = tmp_path / "blind"
    argv = ["--protocol", "blind", "--size", "96", "--tasks", "shake31", "--methods", "photo,nfc-true,classical",
            "--image-names", "camera", "--prior", prior_dir, "--threads", "1", "--out", str(out), "--no-plots"]
    assert main(argv) == 0
    rows = load_results(out / "results.csv")
    assert [r["method"] for r in rows] == ["photo", "nfc-true", "classical"]
    assert all(r["psnr"] and not r["note"] for r in rows) and rows[2]["kernel_error"] and rows[0]["kernel_error"] == ""
    assert "| shake31 | classical |" in blind_doc_table(out, "bench/")
    before = (out / "results.csv").read_text()
    assert main(argv) == 0 and (out / "results.csv").read_text() == before
    assert main([*argv[:4], "--tasks", "motion7", "--out", str(tmp_path / "other")]) == 2  # not a family


def test_a_method_that_cannot_take_the_blur_is_refused_before_the_estimation(monkeypatch, prior_dir):
    def no_estimation(*a, **k):
        raise AssertionError("estimated before refusing")

    monkeypatch.setattr(BlindBlur, "fitted", no_estimation)
    with pytest.raises(ValueError, match="DDRM needs a diagonalisable operator"):  # a valid blur has none
        nfc_dps.restore(torch.rand(3, 48, 48), BlindBlur(7), prior=prior_dir, method="ddrm", sigma_y=0.01,
                        progress=False)


def test_a_large_photo_is_estimated_on_its_centre_crop():
    from nfc_dps.operators.kernel_estimation import ESTIMATION_SIDE

    x = _shapes(420, seed=2)[..., :410]
    y = BlurOperator(motion_kernel(7, 0.5, 1), "valid").A(x)[0]
    h, w = y.shape[-2:]
    top, left = (h - ESTIMATION_SIDE) // 2, (w - ESTIMATION_SIDE) // 2
    crop = y[:, top:top + ESTIMATION_SIDE, left:left + ESTIMATION_SIDE]
    assert torch.equal(estimate_kernel(y, 7), estimate_kernel(crop, 7))


def test_the_noise_models_take_a_model_error_as_added_gaussian_noise():
    from nfc_dps.noise import GaussianNoise, PoissonGaussianNoise, PoissonNoise

    assert GaussianNoise(0.01).with_model_error(3 ** 0.5 * 0.01).sigma == pytest.approx(0.02)
    assert PoissonNoise(30.0).with_model_error(0.01) == PoissonGaussianNoise(30.0, 0.01)
    assert PoissonGaussianNoise(30.0, 0.03).with_model_error(0.04).sigma == pytest.approx(0.05)


def test_the_estimated_kernels_error_is_restored_as_noise(shaken, prior_dir):
    """Under Gaussian noise σ the blind restoration is the restoration with its kernel at 2σ."""
    y = shaken["y"][0, :, :48, :48]
    blind = nfc_dps.restore(y, BlindBlur(13, refinements=0), prior=prior_dir, sigma_y=0.01, num_levels=2,
                            progress=False)
    known = nfc_dps.restore(y, BlindBlur(13).fitted(y), prior=prior_dir, sigma_y=0.02, num_levels=2, progress=False)
    assert torch.equal(blind.image, known.image) and blind.noise_sigma == 0.01  # the level the photo has


def test_auto_noise_level_on_a_batch_gives_one_kernel_per_image(shaken, prior_dir, tmp_path):
    y = shaken["y"][:, :, :48, :48]
    batch = torch.cat([y, y.flip(-1)])
    out = nfc_dps.restore(batch, BlindBlur(13, refinements=0), prior=prior_dir, sigma_y="auto", num_levels=2,
                          progress=False)
    assert out.kernel.shape == (2, 13, 13) and len(out.noise_sigma) == 2
    # and through the command line, two photos in one sampler call
    make_images(tmp_path / "photos", 2, h=48, w=48)
    out_dir = tmp_path / "out"
    assert main_with("restore", "-i", tmp_path / "photos", "-o", out_dir, "--task", "deblur_blind", "--param",
                     "kernel_size=7", "--noise-sigma", "auto", "--batch-size", "2", "--steps", "2",
                     "--prior", prior_dir) == 0
    assert all(np.load(f).shape == (7, 7) for f in (out_dir / "kernels").glob("*.npy"))


def test_a_kernel_reused_from_the_output_folder_is_refused_before_any_work(tmp_path, prior_dir, capsys):
    make_images(tmp_path / "photos", 1, h=48, w=48)
    out = tmp_path / "out"
    common = ("--steps", "2", "--prior", prior_dir, "--noise-sigma", "0.01")
    assert main_with("restore", "-i", tmp_path / "photos", "-o", out, "--task", "deblur_blind", "--param",
                     "kernel_size=7", *common) == 0
    kernel = next((out / "kernels").glob("*.npy"))
    before = kernel.read_bytes()
    capsys.readouterr()
    assert main_with("restore", "-i", tmp_path / "photos", "-o", out, "--task", "deblur_kernel", "--kernel", kernel,
                     *common) == 2
    assert "kernels/ of the output folder" in capsys.readouterr().err and kernel.read_bytes() == before


def test_a_photo_too_small_for_the_kernel_is_refused_by_the_cli_before_any_work(tmp_path, prior_dir, capsys):
    make_images(tmp_path / "photos", 1, h=32, w=32)
    assert main_with("restore", "-i", tmp_path / "photos", "-o", tmp_path / "out", "--task", "deblur_blind",
                     "--param", "kernel_size=31", "--steps", "2", "--prior", prior_dir) == 2
    assert "too small to estimate a 31-px kernel" in capsys.readouterr().err
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_calibration_is_refused_for_the_blind_task(tmp_path, prior_dir, capsys):
    with pytest.raises(ValueError, match="estimated from each measurement"):
        nfc_dps.restore(torch.rand(3, 48, 48), BlindBlur(7), prior=prior_dir, sigma_y=0.01, preset="fast",
                        num_samples=2, calibration=object(), progress=False)
    make_images(tmp_path / "photos", 2, h=48, w=48)
    assert main_with("calibrate", "--images", tmp_path / "photos", "--task", "deblur_blind", "--out",
                     tmp_path / "cal.json", "--prior", prior_dir, "--samples", "2", "--preset", "fast") == 2
    assert "calibrate the task with the kernel known" in capsys.readouterr().err
