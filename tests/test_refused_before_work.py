"""Commands that write one file at the end refuse what would fail late before the work starts:
``nfc-dps calibrate`` an unreadable or unusable calibration image (every one named) and an --out it
cannot write (a restoration that fails names its image); ``nfc-dps prior-report`` an --out it cannot
write; ``nfc-dps restore --save-samples`` without K >= 2 samples."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from nfc_dps.cli import calibrate, main
from nfc_dps.io import write_image

TASK = ("--task", "sr_bicubic", "--param", "factor=2", "--preset", "fast", "--steps", "2", "--samples", "2")


def _clean_folder(folder: Path, n: int) -> Path:
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        write_image(folder / f"c{i}.png", rng.random((16, 16, 3)).astype(np.float32))
    return folder


def _calibrate(tiny_prior, images: Path, out: Path) -> int:
    return main(["calibrate", "--images", str(images), "--out", str(out), *TASK, "--prior", str(tiny_prior), "--quiet"])


@pytest.fixture
def no_sampling(monkeypatch):
    """Fails the test if calibrate reaches the sampler."""
    def restore(*args, **kwargs):
        raise AssertionError("sampled before the inputs were checked")
    monkeypatch.setattr(calibrate, "restore", restore)


def test_every_unusable_image_is_named_before_any_sampling(tmp_path, tiny_prior, capsys, no_sampling):
    images = _clean_folder(tmp_path / "clean", 9)
    (images / "c3.png").write_bytes(b"not a png")
    write_image(images / "c7.png", np.zeros((1, 1, 3), np.float32))  # smaller than the SR factor
    assert _calibrate(tiny_prior, images, tmp_path / "cal.json") == 2
    err = capsys.readouterr().err
    assert "2 of 9 calibration image(s) cannot be used" in err and "c3.png" in err and "c7.png" in err
    assert not (tmp_path / "cal.json").exists()


def test_an_unwritable_out_is_refused_before_any_sampling(tmp_path, tiny_prior, capsys, no_sampling):
    images = _clean_folder(tmp_path / "clean", 9)
    (tmp_path / "a_file").write_text("")
    assert _calibrate(tiny_prior, images, tmp_path / "a_file" / "cal.json") == 2
    assert "--out" in (err := capsys.readouterr().err) and "cannot write" in err


def test_a_failed_restoration_names_its_image(tmp_path, tiny_prior, capsys, monkeypatch):
    images = _clean_folder(tmp_path / "clean", 9)

    def restore(*args, **kwargs):
        raise FloatingPointError("NaN/Inf in the restoration")
    monkeypatch.setattr(calibrate, "restore", restore)
    assert _calibrate(tiny_prior, images, tmp_path / "cal.json") == 2
    err = capsys.readouterr().err
    assert "calibration image" in err and "c0.png" in err and "FloatingPointError" in err


def test_prior_report_refuses_an_unwritable_out_before_the_report(tmp_path, capsys, monkeypatch):
    from nfc_dps.cli import prior_report

    def report(*args, **kwargs):
        raise AssertionError("the report ran before --out was checked")
    monkeypatch.setattr(prior_report, "prior_report", report)
    (tmp_path / "a_file").write_text("")
    for out, message in ((tmp_path, "is a folder"), (tmp_path / "a_file" / "r.json", "cannot write")):
        assert main(["prior-report", "--out", str(out)]) == 2
        assert message in capsys.readouterr().err


def test_save_samples_without_samples_is_refused(tmp_path, tiny_prior, capsys):
    images = _clean_folder(tmp_path / "in", 1)
    assert main(["restore", "-i", str(images), "-o", str(tmp_path / "out"), "--task", "denoise", "--save-samples",
                 "--prior", str(tiny_prior), "--quiet"]) == 2
    assert "--save-samples writes each of K >= 2 posterior samples" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
