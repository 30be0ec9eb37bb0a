"""The fifth reliability battery (issue 51). Each test repeats a repro of the issue; each failed on
the code before its fix."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_cli import run, smooth

from nfc_dps.io import write_image

# -- P2: a rerun's new outputs replace a user's files of those names


def _one_input(tmp_path: Path) -> tuple[Path, Path]:
    inp, out = tmp_path / "in", tmp_path / "out"
    inp.mkdir()
    write_image(inp / "a.png", smooth())
    return inp / "a.png", out


def test_more_saved_samples_never_replace_a_users_file(tmp_path, prior_dir, capsys) -> None:
    a, out = _one_input(tmp_path)
    base = ("restore", "-i", a, "-o", out, "--task", "denoise", "--preset", "fast", "--save-samples")
    assert run(*base, "--samples", "2", prior=prior_dir) == 0
    write_image(out / "samples" / "a_2.png", smooth(phase=5))  # the user's own file, put there later
    mine = (out / "samples" / "a_2.png").read_bytes()
    before = (out / "a.png").read_bytes()
    assert run(*base, "--samples", "3", prior=prior_dir) == 2
    err = capsys.readouterr().err
    assert str(out / "samples" / "a_2.png") in err and "--overwrite" in err and "Traceback" not in err
    assert (out / "samples" / "a_2.png").read_bytes() == mine and (out / "a.png").read_bytes() == before


def test_a_calibration_added_on_a_rerun_never_replaces_a_users_file(tmp_path, prior_dir, capsys) -> None:
    from test_folder_safety import _calibration_file

    a, out = _one_input(tmp_path)
    base = ("restore", "-i", a, "-o", out, "--task", "denoise", "--preset", "fast", "--samples", "2")
    assert run(*base, prior=prior_dir) == 0
    write_image(out / "a_upper.png", smooth(phase=5))
    mine = (out / "a_upper.png").read_bytes()
    assert run(*base, "--calibration", _calibration_file(tmp_path, prior_dir), prior=prior_dir) == 2
    err = capsys.readouterr().err
    assert str(out / "a_upper.png") in err and "Traceback" not in err
    assert (out / "a_upper.png").read_bytes() == mine and not (out / "a_lower.png").exists()


# -- P4: a phase retrieval measurement of the wrong size


def test_phase_retrieval_of_a_photo_is_one_line_naming_it_and_the_expected_size(tmp_path, prior_dir, capsys) -> None:
    a, out = _one_input(tmp_path)  # a 32x32 photo, not the Fourier amplitudes simulate writes
    assert run("restore", "-i", a, "-o", out, "--task", "phase_retrieval", prior=prior_dir) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and str(a) in err and "32x32" in err
    assert "a 21x21 image: 31x31 Fourier amplitudes" in err  # the nearest size simulate writes (oversample 2)
    assert not out.exists()
