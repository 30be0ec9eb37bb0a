"""The fourth reliability battery (issue 43): what was left after its first fixes. Each test
repeats a repro of the issue; each failed on the code before its fix."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_cli import make_images, run, smooth


def _mode_000(monkeypatch, folder: Path) -> None:
    """``folder`` as a mode-000 folder is for a user who does not own it: it cannot be listed and
    nothing in it can be looked up (the tests may run as root, who reads it anyway)."""
    top = os.fspath(folder)
    inside = top + os.sep
    real = {name: getattr(os, name) for name in ("stat", "lstat", "listdir", "scandir")}

    def blocked(path, listing: bool) -> bool:
        if not isinstance(path, (str, bytes, os.PathLike)):
            return False
        p = os.fsdecode(os.fspath(path))
        return p.startswith(inside) or (listing and p.rstrip(os.sep) == top)

    def patched(name: str, listing: bool):
        def call(path=".", *args, **kwargs):
            if blocked(path, listing):
                raise PermissionError(13, "Permission denied", os.fsdecode(os.fspath(path)))
            return real[name](path, *args, **kwargs)
        return call

    for name in real:
        monkeypatch.setattr(os, name, patched(name, name in ("listdir", "scandir")))


# -- N7: an unreadable input folder


def test_a_mode_000_input_folder_is_one_line_naming_it(tmp_path, prior_dir, monkeypatch, capsys) -> None:
    """restore: a PermissionError traceback at <input>/simulation.json."""
    inp = tmp_path / "in"
    make_images(inp, 1)
    _mode_000(monkeypatch, inp)
    assert run("restore", "-i", inp, "-o", tmp_path / "out", "--task", "denoise", prior=prior_dir) == 2
    err = capsys.readouterr().err
    assert f"--input {inp}: cannot read the folder (Permission denied)" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["restore", "simulate"])
def test_a_file_in_a_mode_000_folder_is_one_line_naming_it(tmp_path, prior_dir, monkeypatch, capsys, command) -> None:
    inp = tmp_path / "in"
    make_images(inp, 1)
    _mode_000(monkeypatch, inp)
    extra = {"prior": prior_dir} if command == "restore" else {}
    assert run(command, "-i", inp / "im0.png", "-o", tmp_path / "out", "--task", "denoise", **extra) == 2
    err = capsys.readouterr().err
    assert f"--input {inp / 'im0.png'}: cannot read it (Permission denied; check the permissions of the folder {inp})" in err
    assert not (tmp_path / "out").exists()


def test_a_mask_folder_or_config_in_a_mode_000_folder_is_one_line(tmp_path, prior_dir, monkeypatch, capsys) -> None:
    inp, masks = tmp_path / "in", tmp_path / "masks"
    make_images(inp, 1)
    make_images(masks, 1)
    assert run("simulate", "-i", inp, "-o", tmp_path / "sim", "--task", "denoise") == 0
    with monkeypatch.context() as m:
        _mode_000(m, masks)
        assert run("restore", "-i", inp, "-o", tmp_path / "out", "--task", "inpaint_mask", "--mask", masks,
                   prior=prior_dir) == 2
    assert f"--mask {masks}: cannot read the folder (Permission denied)" in capsys.readouterr().err
    with monkeypatch.context() as m:
        _mode_000(m, tmp_path / "sim")
        assert run("restore", "--config", tmp_path / "sim" / "simulation.json", "-o", tmp_path / "out",
                   prior=prior_dir) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'sim' / 'simulation.json'}: Permission denied" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def _without_root_reads() -> list[str] | None:
    """A command prefix that runs without root's permission to read anything, or None."""
    setpriv = shutil.which("setpriv")
    if setpriv is None or os.geteuid() != 0:
        return None
    caps = "-dac_override,-dac_read_search"
    prefix = [setpriv, "--bounding-set", caps, "--inh-caps", caps, "--"]
    probe = subprocess.run([*prefix, "true"], capture_output=True)
    return prefix if probe.returncode == 0 else None


@pytest.mark.parametrize("command", ["restore", "simulate"])
def test_a_real_mode_000_folder(tmp_path, prior_dir, command) -> None:
    """The same with the permissions themselves, where root can give up its right to read anything."""
    prefix = _without_root_reads()
    if prefix is None:
        pytest.skip("needs root and setpriv to drop the read-anything capabilities")
    inp = tmp_path / "in"
    make_images(inp, 1)
    inp.chmod(0)
    try:
        for target in (inp, inp / "im0.png"):
            prior = ["--prior", prior_dir] if command == "restore" else []
            res = subprocess.run([*prefix, sys.executable, "-m", "nfc_dps", command, "-i", str(target), "-o",
                                  str(tmp_path / "out"), "--task", "denoise", *prior, "--quiet"],
                                 capture_output=True, text=True)
            assert res.returncode == 2, res.stderr
            assert "Traceback" not in res.stderr and f"--input {target}: cannot read" in res.stderr
            assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    finally:
        inp.chmod(0o755)
    assert not (tmp_path / "out").exists()


# -- N10: colorize on RGB files


def _rgb_files(folder: Path) -> dict[str, Path]:
    """A gray photo stored as RGB (three equal channels), a palette PNG of it, and a colour photo."""
    import numpy as np
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    gray = (smooth(c=1) * 255).round().astype(np.uint8)
    files = {"bw": folder / "a_bw.png", "palette": folder / "b_palette.png", "colour": folder / "c_colour.png"}
    Image.fromarray(np.stack([gray] * 3, -1)).save(files["bw"])
    Image.fromarray(gray).convert("P").save(files["palette"])
    Image.fromarray((smooth() * 255).round().astype(np.uint8)).save(files["colour"])
    return files


def test_colorize_takes_an_rgb_file_whose_channels_are_equal(tmp_path, prior_dir, capsys) -> None:
    """A scanned black-and-white photo saved as RGB, or a palette PNG, failed with tensor shapes."""
    from test_cli import rows

    from nfc_dps.io import read_image

    files = _rgb_files(tmp_path / "in")
    files.pop("colour").unlink()
    assert run("restore", "-i", tmp_path / "in", "-o", tmp_path / "out", "--task", "colorize", prior=prior_dir) == 0
    for path in files.values():
        assert read_image(tmp_path / "out" / path.name)[0].shape == (32, 32, 3)
    assert [r["status"] for r in rows(tmp_path / "out")] == ["done", "done"]


def test_colorize_refuses_a_colour_photo_in_words(tmp_path, prior_dir, capsys) -> None:
    from test_cli import rows

    files = _rgb_files(tmp_path / "in")
    assert run("restore", "-i", files["colour"], "-o", tmp_path / "out", "--task", "colorize", prior=prior_dir) == 2
    err = capsys.readouterr().err
    assert f"{files['colour']} is a colour image (its red, green and blue differ): --task colorize restores the " \
           f"colours of a gray photo" in err and "shape" not in err
    assert not (tmp_path / "out").exists()
    # in a folder whose first image is gray: that one fails alone, in the same words
    assert run("restore", "-i", tmp_path / "in", "-o", tmp_path / "out", "--task", "colorize", prior=prior_dir) == 1
    failed = {r["name"]: r["error"] for r in rows(tmp_path / "out") if r["status"] == "failed"}
    assert list(failed) == ["c_colour.png"] and failed["c_colour.png"].startswith("c_colour.png is a colour image")


# -- -q: no note per image; the final line with the mean PSNR stays


def test_quiet_keeps_the_final_psnr_line_and_drops_the_notes(tmp_path, prior_dir, capsys) -> None:
    """-q printed a note per image (here: 8x8 pixels) and hid the mean PSNR against --gt."""
    from nfc_dps.io import write_image

    inp, gt = tmp_path / "in", tmp_path / "gt"
    for folder in (inp, gt):
        for i in range(3):
            write_image(folder / f"t{i}.png", smooth(8, 8, phase=i))
    assert run("restore", "-i", inp, "-o", tmp_path / "out", "--task", "denoise", "--gt", gt, prior=prior_dir) == 0
    err = capsys.readouterr().err
    assert "note " not in err and "8x8 pixels" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("3 restored, 0 already done, 0 failed") and "mean PSNR" in lines[0]
    assert run("simulate", "-i", inp, "-o", tmp_path / "sim", "--task", "denoise") == 0
    assert capsys.readouterr().err == ""


# -- K2: train-prior --steps


@pytest.mark.parametrize("steps", ["-1", "0"])
def test_train_prior_steps_out_of_range_names_the_flag_before_writing(tmp_path, capsys, steps) -> None:
    """--steps -1 also spoke of --cooldown, which was not given; --steps 0 without --export trained
    nothing and wrote train_config.json."""
    from nfc_dps.cli import main

    wd = tmp_path / "w"
    assert main(["train-prior", "--workdir", str(wd), "--steps", steps, "-q"]) == 2
    err = capsys.readouterr().err
    assert f"--steps {steps}" in err if steps == "0" else "--steps must be >= 1 (or 0 with --export" in err
    assert "cooldown" not in err and "Traceback" not in err, err
    assert not wd.exists()


# -- U7: a tensor seed in the API


def test_restore_takes_a_0d_integer_tensor_seed_and_names_other_tensors() -> None:
    """seed=torch.tensor(5) gave torch's 'iteration over a 0-d tensor'; a meta tensor its own error."""
    import numpy as np
    import torch
    from test_api import image
    from test_api import run as api_run

    x = image()
    ref = api_run(x, seed=5).image
    np.testing.assert_array_equal(api_run(x, seed=torch.tensor(5)).image, ref)
    np.testing.assert_array_equal(api_run(x, seed=torch.tensor([5])).image, ref)
    for bad, what in ((torch.tensor(5.0), "dtype float32 and shape ()"), (torch.ones(1, 1, dtype=torch.int64), "shape (1, 1)"),
                      (torch.empty((), dtype=torch.int64, device="meta"), "a meta tensor")):
        with pytest.raises(TypeError, match=r"seed must be an int, or integers one per image .*" + re.escape(what)):
            api_run(x, seed=bad)
    with pytest.raises(ValueError, match="seed must be >= 0, got -1"):
        api_run(x, seed=torch.tensor(-1))


# -- N11-N20: a factory that exits, an empty --calibration, failed rows


def test_a_prior_factory_that_exits_is_named_and_leaves_no_folder(tmp_path, monkeypatch, capsys) -> None:
    """A factory calling sys.exit() ended the command with no message and an empty output folder."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "exiting_prior.py").write_text("import sys\n\n\ndef make():\n    sys.exit(3)\n")
    make_images(tmp_path / "in", 1)
    assert run("restore", "-i", tmp_path / "in", "-o", tmp_path / "out", "--task", "denoise",
               prior="exiting_prior:make") == 2
    err = capsys.readouterr().err
    assert "cannot load the prior factory exiting_prior:make: it called sys.exit(3)" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("value", ["", " "])
def test_an_empty_calibration_flag_is_refused(tmp_path, prior_dir, capsys, value) -> None:
    """--calibration '' restored without an interval, as if the flag were not given."""
    make_images(tmp_path / "in", 1)
    assert run("restore", "-i", tmp_path / "in", "-o", tmp_path / "out", "--task", "denoise", "--preset", "fast",
               "--samples", "2", "--calibration", value, prior=prior_dir) == 2
    assert f"--calibration {value!r}: empty" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_failed_row_names_no_output(tmp_path, prior_dir) -> None:
    """results.csv gave a failed image the output file it never wrote."""
    from test_cli import rows

    make_images(tmp_path / "in", 1)
    (tmp_path / "in" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 40)
    assert run("restore", "-i", tmp_path / "in", "-o", tmp_path / "out", "--task", "denoise", prior=prior_dir) == 1
    got = {r["name"]: (r["status"], r["output"]) for r in rows(tmp_path / "out")}
    assert got == {"broken.png": ("failed", ""), "im0.png": ("done", "im0.png")}


# -- N11, N12: an absurd --samples


@pytest.mark.parametrize("command", ["restore", "calibrate"])
def test_an_absurd_samples_count_is_refused_with_its_cost(tmp_path, prior_dir, capsys, monkeypatch, command) -> None:
    """restore --samples 3000000 ran for hours without a word; calibrate --samples 10**12 ended in
    the allocator's text. Neither may start a chain."""
    import nfc_dps.api
    import nfc_dps.cli.calibrate

    def never(*args, **kwargs):
        raise AssertionError("a chain ran")

    monkeypatch.setattr(nfc_dps.api, "restore", never)
    monkeypatch.setattr(nfc_dps.cli.calibrate, "restore", never)
    make_images(tmp_path / "in", 9)  # enough for calibrate's coverage 0.9
    samples = "3000000" if command == "restore" else str(10**12)
    where = ["-i", tmp_path / "in", "-o", tmp_path / "out"] if command == "restore" else \
        ["--images", tmp_path / "in", "--out", tmp_path / "cal.json"]
    code = main_with(command, *where, "--task", "denoise", "--preset", "fast", "--samples", samples, "--prior", prior_dir)
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"--samples {samples}: that many chains of 100 network calls each is {int(samples) * 100:,} network calls " \
           f"per image; at most 10,000 samples" in err
    assert not (tmp_path / "out").exists() and not (tmp_path / "cal.json").exists()


def main_with(*argv) -> int:
    from nfc_dps.cli import main

    return main([str(a) for a in argv] + ["--quiet"])


# -- N16: calibrate --out locked


def test_a_second_calibrate_on_one_out_is_refused_before_its_work(tmp_path, prior_dir, capsys, monkeypatch) -> None:
    """Two calibrate runs on one --out ran side by side, the last to finish winning."""
    import nfc_dps.cli.calibrate
    from nfc_dps.locking import file_lock

    def never(*args, **kwargs):
        raise AssertionError("a chain ran")

    monkeypatch.setattr(nfc_dps.cli.calibrate, "restore", never)
    make_images(tmp_path / "in", 9)
    out = tmp_path / "cal" / "c.json"
    out.parent.mkdir()
    with file_lock(out):  # the first run, still working
        code = main_with("calibrate", "--images", tmp_path / "in", "--out", out, "--task", "denoise", "--preset",
                         "fast", "--samples", "2", "--prior", prior_dir)
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"another nfc-dps run (pid {os.getpid()}) is writing to {out}; wait for it to finish" in err
    assert sorted(p.name for p in out.parent.iterdir()) == []  # the lock file goes with its holder


# -- N14: a calibration's precision


def test_a_calibration_of_another_precision_is_refused(tmp_path, prior_dir, capsys) -> None:
    """A calibration fitted with the prior in float32 was applied to a bfloat16 run (same weights)."""
    make_images(tmp_path / "clean", 9, h=16, w=16)
    cal = tmp_path / "cal.json"
    common = ("--task", "denoise", "--preset", "fast", "--steps", "2", "--prior", prior_dir, "--samples", "2")
    assert main_with("calibrate", "--images", tmp_path / "clean", "--out", cal, *common, "--precision", "float32") == 0
    make_images(tmp_path / "in", 1, h=16, w=16)
    assert main_with("restore", "-i", tmp_path / "in", "-o", tmp_path / "out", *common, "--calibration", cal,
                     "--precision", "bfloat16") == 2
    err = capsys.readouterr().err
    assert f"calibration {cal} was fitted with the prior in float32, this run's prior runs in bfloat16" in err
    assert not (tmp_path / "out").exists()
    assert main_with("restore", "-i", tmp_path / "in", "-o", tmp_path / "out", *common, "--calibration", cal,
                     "--precision", "float32") == 0


# -- boundary=valid with a kernel larger than the measurement


def test_a_valid_blur_refuses_a_kernel_larger_than_its_measurement() -> None:
    """A 20x20 measurement with a 31x31 valid-boundary kernel was restored to a 50x50 image without a word."""
    import torch

    from nfc_dps.operators import BlurOperator
    from nfc_dps.operators.kernels import gaussian_kernel

    op = BlurOperator(gaussian_kernel(31, 3.0), "valid")
    with pytest.raises(ValueError, match=r"the 31x31 blur kernel is larger than the 20x20 measurement"):
        op.image_shape((1, 3, 20, 20))
    with pytest.raises(ValueError, match=r"the 31x31 blur kernel is larger than the 20x20 measurement"):
        op.A_pinv(torch.zeros(1, 3, 20, 20))
    with pytest.raises(ValueError, match=r"the 31x31 blur kernel is larger than the 30x40 image"):
        op.A(torch.zeros(1, 3, 30, 40))
    assert op.image_shape((1, 3, 31, 40)) == (1, 3, 61, 70)


def test_restore_with_a_valid_blur_larger_than_the_measurement_is_one_line(tmp_path, prior_dir, capsys) -> None:
    from nfc_dps.io import write_image

    (tmp_path / "in").mkdir()
    write_image(tmp_path / "in" / "a.png", smooth(20, 20))
    assert run("restore", "-i", tmp_path / "in", "-o", tmp_path / "out", "--task", "deblur_gaussian", "--param",
               "kernel_size=31", "--param", "boundary=valid", prior=prior_dir) == 2
    err = capsys.readouterr().err
    line = f"{tmp_path / 'in' / 'a.png'}: boundary='valid': the 31x31 blur kernel is larger than the 20x20 measurement"
    assert line in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


# -- a valid boundary's restoration is scored on the frame its measurement saw


def test_a_valid_blur_is_scored_on_the_frame_the_measurement_saw(tmp_path, prior_dir, capsys) -> None:
    """restore --config configs/deblur_gaussian.yaml scored the band a valid boundary invents beyond
    the frame (mean PSNR 13.80 dB on 128-px images); a truth of the frame's own size was an error."""
    import csv
    import json

    from nfc_dps.cli.common import image_metrics
    from nfc_dps.io import read_image, write_image

    make_images(tmp_path / "clean", 2)  # 32x32
    task = ("--task", "deblur_gaussian", "--param", "kernel_size=9", "--param", "kernel_std=2.0",
            "--param", "boundary=valid")
    assert run("simulate", "-i", tmp_path / "clean", "-o", tmp_path / "sim", *task) == 0
    (tmp_path / "frames").mkdir()
    for p in sorted((tmp_path / "sim" / "ground_truth").iterdir()):  # a truth of the photo's own frame
        write_image(tmp_path / "frames" / p.name, read_image(p)[0][4:28, 4:28])
    capsys.readouterr()
    for gt in ("sim/ground_truth", "frames"):
        out = tmp_path / f"out_{gt.replace('/', '_')}"
        assert main_with("restore", "--config", tmp_path / "sim" / "simulation.json", "-o", out, "--gt",
                         tmp_path / gt, "--steps", "2", "--prior", prior_dir) == 0
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert "(scored on the frame the measurement saw" in line, line
        assert json.loads((out / "summary.json").read_text())["scored"] == "measured frame"
        with open(out / "results.csv") as f:
            rows = list(csv.DictReader(f))
        for row in rows:
            assert row["status"] == "done" and row["scored"] == "measured frame 24x24 at row 4, column 4", row
            x = read_image(out / row["output"])[0]
            truth = read_image(tmp_path / "sim" / "ground_truth" / row["output"])[0]
            assert x.shape == (24, 24, 3) and truth.shape == (32, 32, 3)  # the photo's own frame is written
            psnr, _ = image_metrics(x, truth[4:28, 4:28])
            assert float(row["psnr"]) == pytest.approx(psnr, abs=1e-3)
        # rerun: the rows of images already done are scored alike
        assert main_with("restore", "--config", tmp_path / "sim" / "simulation.json", "-o", out, "--gt",
                         tmp_path / gt, "--steps", "2", "--prior", prior_dir) == 0
        with open(out / "results.csv") as f:
            again = list(csv.DictReader(f))
        assert [r["status"] for r in again] == ["skipped"] * 2 and [r["psnr"] for r in again] == [r["psnr"] for r in rows]
        assert all(r["scored"] == rows[0]["scored"] for r in again)
    capsys.readouterr()


def test_a_circular_blur_is_scored_on_the_whole_image(tmp_path, prior_dir) -> None:
    import csv

    make_images(tmp_path / "clean", 1)
    assert run("simulate", "-i", tmp_path / "clean", "-o", tmp_path / "sim", "--task", "denoise") == 0
    assert main_with("restore", "--config", tmp_path / "sim" / "simulation.json", "-o", tmp_path / "out", "--gt",
                     tmp_path / "sim" / "ground_truth", "--steps", "2", "--prior", prior_dir) == 0
    with open(tmp_path / "out" / "results.csv") as f:
        assert next(csv.DictReader(f))["scored"] == "whole image"


# -- U6: a usage error under torchrun


@pytest.mark.parametrize("rank", ["0", "1"])
def test_under_torchrun_a_refusing_rank_waits_for_rank_0_and_exits_2(tmp_path, monkeypatch, capsys, rank) -> None:
    """Under torchrun a rank other than 0 refused first and exited; torchrun then stopped rank 0
    (exit -15), possibly before its message. Now it waits for torchrun's SIGTERM (faked here), which
    ends the wait, and exits 2; rank 0 does not wait."""
    import signal
    import time

    from nfc_dps import cli

    monkeypatch.setenv("RANK", rank)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", rank)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")
    waits = []

    def sleep(seconds):  # torchrun stops the rank once rank 0 has exited
        waits.append(seconds)
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # the handler runs between bytecodes
            pass

    monkeypatch.setattr(time, "sleep", sleep)
    handler = signal.getsignal(signal.SIGTERM)
    assert cli.main(["restore", "-i", str(tmp_path / "missing"), "-o", str(tmp_path / "out"), "--task", "denoise",
                     "-q"]) == 2
    assert cli.main(["restore", "--no-such-flag"]) == 2
    assert len(waits) == (2 if rank == "1" else 0)
    assert signal.getsignal(signal.SIGTERM) is handler
    err = capsys.readouterr().err
    assert (err.count("error:") == 2) if rank == "0" else err == ""
