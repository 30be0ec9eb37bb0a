"""A photograph's blur (boundary valid) is restored to the photo's own frame by default; the whole
scene with the band beyond the frame on request (--keep-border); results.csv says which."""

from __future__ import annotations

import csv
import json

import numpy as np
from test_battery4 import main_with
from test_cli import make_images

from nfc_dps.io import read_image


def _rows(out) -> list[dict]:
    with open(out / "results.csv") as f:
        return list(csv.DictReader(f))


def test_valid_blur_writes_the_photo_frame_unless_keep_border(tmp_path, prior_dir) -> None:
    make_images(tmp_path / "clean", 1)  # 32x32
    task = ("--task", "deblur_gaussian", "--param", "kernel_size=9", "--param", "kernel_std=2.0",
            "--param", "boundary=valid")
    assert main_with("simulate", "-i", tmp_path / "clean", "-o", tmp_path / "sim", *task) == 0
    config = tmp_path / "sim" / "simulation.json"
    gt = tmp_path / "sim" / "ground_truth"
    photo, scene = tmp_path / "photo", tmp_path / "scene"
    assert main_with("restore", "--config", config, "-o", photo, "--gt", gt, "--steps", "2", "--prior", prior_dir) == 0
    assert main_with("restore", "--config", config, "-o", scene, "--gt", gt, "--steps", "2", "--prior", prior_dir,
                     "--keep-border") == 0
    (row_photo,), (row_scene,) = _rows(photo), _rows(scene)
    x_photo, x_scene = read_image(photo / row_photo["output"])[0], read_image(scene / row_scene["output"])[0]
    measured = read_image(next((tmp_path / "sim" / "measurements").iterdir()))[0]
    assert x_photo.shape == measured.shape == (24, 24, 3)  # the input's size
    assert x_scene.shape == (32, 32, 3)
    assert (row_photo["extent"], row_scene["extent"]) == ("photo", "scene")
    assert row_photo["size"] == "24x24" and row_scene["size"] == "32x32"
    # the same restoration: the frame is the scene's region the measurement lies over
    assert np.abs(x_photo - x_scene[4:28, 4:28]).max() <= 1 / 255 + 1e-6
    # both scored on the measured frame, alike
    assert row_photo["scored"] == row_scene["scored"] == "measured frame 24x24 at row 4, column 4"
    assert abs(float(row_photo["psnr"]) - float(row_scene["psnr"])) < 0.05
    manifest = json.loads((photo / "manifest.json").read_text())
    (entry,) = manifest["images"].values() if isinstance(manifest.get("images"), dict) else manifest.values()
    assert entry["extent"] == "photo"
    # a rerun skips the image and reports the same extent; switching extent redoes it
    assert main_with("restore", "--config", config, "-o", photo, "--gt", gt, "--steps", "2", "--prior", prior_dir) == 0
    (again,) = _rows(photo)
    assert again["status"] == "skipped" and again["extent"] == "photo"
    assert main_with("restore", "--config", config, "-o", photo, "--gt", gt, "--steps", "2", "--prior", prior_dir,
                     "--keep-border") == 0
    (switched,) = _rows(photo)
    assert switched["status"] == "done" and switched["extent"] == "scene" and switched["size"] == "32x32"


def test_other_tasks_leave_extent_empty(tmp_path, prior_dir) -> None:
    make_images(tmp_path / "clean", 1)
    assert main_with("simulate", "-i", tmp_path / "clean", "-o", tmp_path / "sim", "--task", "denoise") == 0
    out = tmp_path / "out"
    assert main_with("restore", "--config", tmp_path / "sim" / "simulation.json", "-o", out, "--steps", "2",
                     "--prior", prior_dir) == 0
    (row,) = _rows(out)
    assert row["status"] == "done" and row["extent"] == ""


def test_api_states_the_photo_frame_and_crops_to_it(prior_dir) -> None:
    import torch

    import nfc_dps
    prior = prior_dir
    x = torch.rand(1, 3, 64, 64)
    op = nfc_dps.build_operator("deblur_gaussian", image_size=64, kernel_size=9, kernel_std=2.0)  # valid
    y = op.measure(x, sigma_y=0.01, generator=torch.Generator().manual_seed(0))
    assert tuple(y.shape[-2:]) == (56, 56)
    out = nfc_dps.restore(y, op, prior=prior, sigma_y=0.01, num_levels=2, progress=False)
    assert out.frame == (4, 4, 56, 56)
    assert tuple(out.image.shape[-2:]) == (64, 64)
    assert torch.equal(out.photo(), out.image[..., 4:60, 4:60])
    # numpy in, numpy out, (h, w, C): cropped alike
    out_np = nfc_dps.restore(y[0].permute(1, 2, 0).numpy(), op, prior=prior, sigma_y="auto", num_levels=2,
                             progress=False)
    assert out_np.frame == (4, 4, 56, 56) and out_np.photo().shape == (56, 56, 3)
    # a circular blur measures the whole image: no frame
    circ = nfc_dps.build_operator("deblur_gaussian", image_size=64, kernel_size=9, kernel_std=2.0, boundary="circular")
    res = nfc_dps.restore(circ.A(x), circ, prior=prior, sigma_y=0.01, num_levels=2, progress=False)
    assert res.frame is None and res.photo() is res.image


def test_auto_noise_level_is_printed_per_image(tmp_path, prior_dir, capsys) -> None:
    """Issue 53, item 3: the estimate of each image is said on the console, as results.csv has it."""
    from nfc_dps.cli import main

    make_images(tmp_path / "clean", 2)
    assert main_with("simulate", "-i", tmp_path / "clean", "-o", tmp_path / "sim", "--task", "denoise",
                     "--noise-sigma", "0.05") == 0
    capsys.readouterr()
    out = tmp_path / "out"
    assert main(["restore", "-i", str(tmp_path / "sim" / "measurements"), "-o", str(out), "--task", "denoise",
                 "--noise-sigma", "auto", "--steps", "2", "--prior", str(prior_dir)]) == 0
    err = capsys.readouterr().err
    for row in _rows(out):
        assert f"{row['name']}: noise level estimated at {row['noise_sigma']} ([0, 1] units)" in err, err
        assert 0.02 < float(row["noise_sigma"]) < 0.1


def test_keep_border_leaves_the_run_key_of_other_tasks_alone(tmp_path, prior_dir) -> None:
    """The photo-frame default enters the run key of a valid blur only: a denoising folder is the
    same run with or without --keep-border (an earlier run's images are skipped, not redone)."""
    make_images(tmp_path / "clean", 1)
    assert main_with("simulate", "-i", tmp_path / "clean", "-o", tmp_path / "sim", "--task", "denoise") == 0
    out = tmp_path / "out"
    args = ("restore", "--config", tmp_path / "sim" / "simulation.json", "-o", out, "--steps", "2", "--prior", prior_dir)
    assert main_with(*args) == 0
    assert main_with(*args, "--keep-border") == 0
    (row,) = _rows(out)
    assert row["status"] == "skipped"
