"""nfc-dps command line end to end, on tiny images with a tiny random prior and 1-2 levels.

Most tests call ``main(argv)`` in process; the kill-and-resume test runs ``python -m nfc_dps``.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from test_battery_helpers import hold_lock

from nfc_dps.cli import main
from nfc_dps.cli.common import LOCK_FILE, RESOLVED_JSON, image_seed
from nfc_dps.io import TEMP_SUFFIX, image_opens, read_image, write_image
from nfc_dps.samplers import get_config


def smooth(h=32, w=32, c=3, phase=0.0) -> np.ndarray:
    yy, xx = np.mgrid[0:h, 0:w]
    yy, xx = yy / max(h - 1, 1), xx / max(w - 1, 1)
    img = np.stack([xx, yy, 0.5 + 0.3 * np.sin(6 * xx + phase)], -1).astype(np.float32)
    return img[..., 0] if c == 1 else img


def make_images(folder: Path, n: int, **kw) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    return [write_image(folder / f"im{i}.png", smooth(phase=i, **kw)) for i in range(n)]


def run(*argv, prior=None, steps=2) -> int:
    args = [str(a) for a in argv]
    if prior is not None:
        args += ["--prior", prior]
    if steps is not None and args[0] in ("restore", "demo"):
        args += ["--steps", str(steps)]
    return main(args + ["--quiet"] if args[0] != "convert-adm" else args)


def rows(out: Path) -> list[dict]:
    import csv

    with open(out / "results.csv") as f:
        return list(csv.DictReader(f))


def check_gt_metrics(out: Path, gt: Path, results: list[dict]) -> None:
    """Each row's PSNR is its output's against the ground truth of the same name (to the CSV's
    rounding), not against another image."""
    import re

    from skimage.metrics import peak_signal_noise_ratio

    assert results
    for row in results:
        x, truth = read_image(out / row["output"])[0], read_image(gt / row["name"])[0]
        frame = re.match(r"measured frame (\d+)x(\d+) at row (\d+), column (\d+)", row.get("scored") or "")
        if frame:  # a valid boundary's restoration is scored on the frame its measurement saw
            h, w, top, left = (int(v) for v in frame.groups())
            x = x[top:top + h, left:left + w] if x.shape[:2] != (h, w) else x
            truth = truth[top:top + h, left:left + w] if truth.shape[:2] != (h, w) else truth
        assert float(row["psnr"]) == pytest.approx(peak_signal_noise_ratio(truth, x, data_range=1.0), abs=0.01), row


def mtimes(out: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in out.glob("*.png")}


# ---------------------------------------------------------------- restore, resume, overwrite


def test_restore_folder_resume_overwrite(tmp_path, prior_dir):
    make_images(tmp_path / "in", 3)
    out = tmp_path / "out"
    argv = ("restore", "--input", tmp_path / "in", "--output", out, "--task", "denoise")
    assert run(*argv, prior=prior_dir) == 0
    for name in ("im0.png", "im1.png", "im2.png", "results.csv", "summary.json", "resolved_config.json", "manifest.json"):
        assert (out / name).is_file(), name
    r = rows(out)
    assert [x["status"] for x in r] == ["done"] * 3
    assert [x["seed"] for x in r] == [str(image_seed(0, f"im{i}.png")) for i in range(3)]
    assert all(int(x["nfe"]) == 2 * get_config("nfc", num_levels=1).nfe for x in r)  # 2 levels (--steps)
    resolved = json.loads((out / "resolved_config.json").read_text())
    assert resolved["sampler"]["num_levels"] == 2 and resolved["task"]["task"] == "denoise"
    assert resolved["versions"]["torch"] and resolved["seed"] == 0
    assert resolved["precision"] in ("float32", "bfloat16")  # "auto" resolved for this machine
    first = {n: read_image(out / n)[0] for n in ("im0.png", "im1.png", "im2.png")}
    before = mtimes(out)

    assert run(*argv, prior=prior_dir) == 0  # resume: nothing to do
    assert mtimes(out) == before and [x["status"] for x in rows(out)] == ["skipped"] * 3

    (out / "im1.png").unlink()  # lost output
    (out / "im2.png").write_bytes((out / "im2.png").read_bytes()[:40])  # torn output
    assert run(*argv, prior=prior_dir) == 0
    assert [x["status"] for x in rows(out)] == ["skipped", "done", "done"]
    assert mtimes(out)["im0.png"] == before["im0.png"]
    for n, a in first.items():
        np.testing.assert_array_equal(read_image(out / n)[0], a)  # same seeds, same pixels

    before = mtimes(out)
    assert run(*argv, "--overwrite", prior=prior_dir) == 0
    assert [x["status"] for x in rows(out)] == ["done"] * 3
    assert all(mtimes(out)[n] != before[n] for n in first)

    assert run(*argv, prior=prior_dir, steps=3) == 0  # another config: redone, not skipped
    assert [x["status"] for x in rows(out)] == ["done"] * 3
    other = "float32" if resolved["precision"] == "bfloat16" else "bfloat16"
    assert run(*argv, "--precision", other, prior=prior_dir, steps=3) == 0  # another precision: redone too
    assert [x["status"] for x in rows(out)] == ["done"] * 3
    assert json.loads((out / "resolved_config.json").read_text())["precision"] == other


def test_restore_lists_reads_and_resolves_once(tmp_path, prior_dir, monkeypatch):
    """The checks before the run (the method against the first image's operator, the sampler
    against --samples and the calibration) and the run share one listing of --input, one read of
    the first image and one sampler config, a config file's included."""
    import nfc_dps.config
    import nfc_dps.io as nio

    make_images(tmp_path / "in", 2)
    (tmp_path / "s.yaml").write_text("method: nfc\nprior_weight: 0.5\n")
    reads, listings, configs = [], [], []
    read_image, list_folder, get_config_ = nio.read_image, nio.list_folder, nfc_dps.config.get_config
    monkeypatch.setattr(nio, "read_image", lambda path, **kw: reads.append(Path(path).name) or read_image(path, **kw))
    monkeypatch.setattr(nio, "list_folder", lambda folder: listings.append(Path(folder)) or list_folder(folder))
    monkeypatch.setattr(nfc_dps.config, "get_config", lambda *a, **k: configs.append(a) or get_config_(*a, **k))
    assert run("restore", "--input", tmp_path / "in", "--output", tmp_path / "out", "--task", "denoise",
               "--config", tmp_path / "s.yaml", prior=prior_dir) == 0
    assert sorted(reads) == ["im0.png", "im1.png"] and listings == [tmp_path / "in"] and len(configs) == 1
    assert [r["status"] for r in rows(tmp_path / "out")] == ["done", "done"]


def test_seed_comes_from_the_file_name(tmp_path, prior_dir):
    """With a sampling preset (the default one is deterministic: seeds change nothing there)."""
    paths = make_images(tmp_path / "in", 3)
    fast = ("--task", "denoise", "--preset", "fast")
    assert run("restore", "-i", tmp_path / "in", "-o", tmp_path / "all", *fast, "--seed", 5, prior=prior_dir) == 0
    assert run("restore", "-i", paths[2], "-o", tmp_path / "one", *fast, "--seed", 5, prior=prior_dir) == 0
    assert (tmp_path / "all/im2.png").read_bytes() == (tmp_path / "one/im2.png").read_bytes()
    assert rows(tmp_path / "all")[2]["seed"] == rows(tmp_path / "one")[0]["seed"] == str(image_seed(5, "im2.png"))
    assert run("restore", "-i", paths[2], "-o", tmp_path / "other", *fast, "--seed", 6, prior=prior_dir) == 0
    assert (tmp_path / "other/im2.png").read_bytes() != (tmp_path / "one/im2.png").read_bytes()
    resolved = json.loads((tmp_path / "all/resolved_config.json").read_text())
    assert "relative to the input folder" in resolved["per_image_seed"] and "position" in resolved["per_image_seed"]


def test_adding_a_file_changes_no_other_output(tmp_path, prior_dir):
    inp = tmp_path / "in"
    make_images(inp, 3)
    (inp / "im1.png").rename(inp / "later.png")  # held back, then added between im0 and im2
    (inp / "later.png").rename(tmp_path / "later.png")
    out, fresh = tmp_path / "out", tmp_path / "fresh"
    assert run("restore", "-i", inp, "-o", out, "--task", "denoise", prior=prior_dir) == 0
    before = {n: (out / n).read_bytes() for n in ("im0.png", "im2.png")}
    stamps = mtimes(out)
    (tmp_path / "later.png").rename(inp / "im1.png")
    assert run("restore", "-i", inp, "-o", out, "--task", "denoise", prior=prior_dir) == 0  # resume
    assert {r["name"]: r["status"] for r in rows(out)} == {"im0.png": "skipped", "im1.png": "done", "im2.png": "skipped"}
    assert all(mtimes(out)[n] == stamps[n] for n in before)  # not recomputed
    assert run("restore", "-i", inp, "-o", fresh, "--task", "denoise", prior=prior_dir) == 0  # a fresh run
    assert all((fresh / n).read_bytes() == b for n, b in before.items())


@pytest.mark.parametrize("method", sorted(__import__("nfc_dps.samplers", fromlist=["METHODS"]).METHODS))
def test_every_method_runs_from_the_cli(tmp_path, prior_dir, method):
    make_images(tmp_path / "in", 1)
    out = tmp_path / "out"
    assert run("restore", "-i", tmp_path / "in", "-o", out, "--task", "deblur_gaussian", "--param", "kernel_size=5",
               "--param", "kernel_std=1.0", "--param", "boundary=circular", "--method", method, prior=prior_dir) == 0
    resolved = json.loads((out / "resolved_config.json").read_text())
    assert resolved["sampler"]["method"] == method and image_opens(out / "im0.png")


# ---------------------------------------------------------------- bad files


def test_bad_files_reported_others_restored(tmp_path, prior_dir, capsys):
    inp = tmp_path / "in"
    make_images(inp, 2)
    (inp / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"garbage" * 10)
    (inp / "empty.jpg").write_bytes(b"")
    (inp / "notes.txt").write_text("not an image")
    write_image(inp / "small.png", smooth(16, 16))  # its mask will have the wrong size
    masks = tmp_path / "masks"
    masks.mkdir()
    for name, size in [("im0.png", 32), ("im1.png", 32), ("small.png", 32), ("corrupt.png", 32), ("empty.png", 32)]:
        m = np.ones((size, size), np.float32)
        m[8:16, 8:16] = 0
        write_image(masks / name, m)
    out = tmp_path / "out"
    code = run("restore", "-i", inp, "-o", out, "--task", "inpaint_box", "--mask", masks, prior=prior_dir)
    assert code == 1
    err = capsys.readouterr().err
    by_name = {r["name"]: r for r in rows(out)}
    assert by_name["im0.png"]["status"] == by_name["im1.png"]["status"] == "done"
    assert image_opens(out / "im0.png") and image_opens(out / "im1.png")
    expect = {"corrupt.png": "corrupt", "empty.jpg": "empty", "notes.txt": "unsupported file type",
              "small.png": "size"}
    summary = json.loads((out / "summary.json").read_text())
    failures = {f["name"]: f["error"] for f in summary["failures"]}
    for name, reason in expect.items():
        assert by_name[name]["status"] == "failed"
        assert reason in by_name[name]["error"] and reason in failures[name]
        assert name in err
        assert not (out / (Path(name).stem + ".png")).exists()
    assert summary["counts"] == {"images": 6, "restored": 2, "skipped_done_before": 0, "failed": 4}
    assert "Traceback" not in err


def test_nan_is_caught_and_never_saved(tmp_path, prior_dir, monkeypatch, capsys):
    import nfc_dps.api as api

    real = api.restore

    def flaky(y, operator, **kw):
        if image_seed(0, "im1.png") in kw["seed"]:
            raise FloatingPointError("nfc produced NaN/Inf")
        res = real(y, operator, **kw)
        if image_seed(0, "im2.png") in kw["seed"]:
            res.image = res.image * float("nan")
        return res

    monkeypatch.setattr(api, "restore", flaky)
    make_images(tmp_path / "in", 3)
    out = tmp_path / "out"
    assert run("restore", "-i", tmp_path / "in", "-o", out, "--task", "denoise", prior=prior_dir) == 1
    r = rows(out)
    assert [x["status"] for x in r] == ["done", "failed", "failed"]
    assert all("NaN" in x["error"] for x in r[1:])
    assert not (out / "im1.png").exists() and not (out / "im2.png").exists()
    assert not list(out.glob(f".*{TEMP_SUFFIX}"))
    assert "im1.png" in capsys.readouterr().err


# ---------------------------------------------------------------- usage errors


def _cases(tmp_path: Path, prior: str):
    inp = tmp_path / "in"
    make_images(inp, 1)
    (tmp_path / "afile").write_text("x")
    (tmp_path / "bad.yaml").write_text("task: denoise\nnoise_sigmaa: 0.1\n")
    out = str(tmp_path / "out")
    base = ["restore", "-i", str(inp), "--prior", prior]
    return {
        "no task": (base + ["-o", out], "--task"),
        "unknown task": (base + ["-o", out, "--task", "deblurr"], "invalid choice"),
        "output is input": (base + ["-o", str(inp), "--task", "denoise"], "(folder) is the output folder"),
        "output not writable": (base + ["-o", str(tmp_path / "afile" / "sub"), "--task", "denoise"], "not writable"),
        "bad config key": (base + ["-o", out, "--config", str(tmp_path / "bad.yaml")], "noise_sigmaa"),
        "bad --set": (base + ["-o", out, "--task", "denoise", "--set", "num_levelz=2"], "num_levelz"),
        "bad --param": (base + ["-o", out, "--task", "denoise", "--param", "factor=2"], "factor"),
        "missing input": (["restore", "-i", str(tmp_path / "nope"), "-o", out, "--task", "denoise"], "no such file"),
        "kernel for denoise": (base + ["-o", out, "--task", "denoise", "--kernel", str(tmp_path / "afile")], "--kernel"),
        "random mask": (base + ["-o", out, "--task", "inpaint_box"], "--mask"),
        "missing prior": (["restore", "-i", str(inp), "-o", out, "--task", "denoise", "--prior", str(tmp_path / "noprior")], "prior"),
        "negative noise": (base + ["-o", out, "--task", "denoise", "--noise-sigma", "-1"], "noise-sigma"),
        "noise in 0-255 units": (base + ["-o", out, "--task", "denoise", "--noise-sigma", "12.75"], "divide by 255"),
        "bad task value": (base + ["-o", out, "--task", "deblur_gaussian", "--param", "kernel_std=-1"], "kernel_std=-1"),
        "bad boundary": (base + ["-o", out, "--task", "deblur_motion", "--param", "boundary=reflct"], "reflct"),
        "bad steps type": (base + ["-o", out, "--task", "denoise", "--steps", "many"], "invalid int"),
        "bad device": (base + ["-o", out, "--task", "denoise", "--device", "warp9"], "device"),
        "bad precision": (base + ["-o", out, "--task", "denoise", "--precision", "float16"], "--precision: invalid choice: 'float16'"),
    }


def test_usage_errors_exit_2_without_traceback(tmp_path, prior_dir, capsys):
    for label, (argv, needle) in _cases(tmp_path, prior_dir).items():
        code = main(argv + ["--quiet"])
        err = capsys.readouterr().err
        assert code == 2, (label, err)
        assert needle in err, (label, err)
        assert "Traceback" not in err, label
        assert not (tmp_path / "out" / "results.csv").exists(), label
    assert main([]) == 2
    assert main(["--help"]) == 0
    assert main(["bench", "--help"]) == 0  # wired to nfc_dps.bench
    capsys.readouterr()


def _kernel_files(folder: Path) -> dict[str, Path]:
    folder.mkdir(exist_ok=True)
    files = {"text": folder / "text.npy", "cube": folder / "cube.npy", "nan": folder / "nan.npy",
             "negative": folder / "negative.npy"}
    files["text"].write_text("0 1 0\n1 4 1\n0 1 0\n")
    np.save(files["cube"], np.ones((3, 3, 3)))
    np.save(files["nan"], np.array([[1.0, np.nan], [0.0, 1.0]]))
    np.save(files["negative"], -np.ones((3, 3)))
    return files


def test_operator_files_are_checked_before_the_model_loads(tmp_path, capsys):
    """A missing or invalid --mask / --kernel: exit 2 up front, naming the flag and the file (the
    prior given does not exist: were it loaded first, its error would show instead)."""
    make_images(tmp_path / "in", 1)
    kernels = _kernel_files(tmp_path / "k")
    base = ["restore", "-i", str(tmp_path / "in"), "-o", str(tmp_path / "out"), "--prior", str(tmp_path / "noprior")]
    cases = [(["--task", "inpaint_mask"], "--mask", None), (["--task", "deblur_kernel"], "--kernel", None)]
    cases += [(["--task", "deblur_kernel", "--kernel", str(f)], "--kernel", f) for f in kernels.values()]
    cases += [(["--task", "inpaint_box", "--mask", str(kernels["text"])], "--mask", kernels["text"])]
    reasons = []
    for extra, flag, path in cases:
        assert main(base + extra + ["--quiet"]) == 2, extra
        err = capsys.readouterr().err
        assert flag in err and "Traceback" not in err and "noprior" not in err, err
        assert path is None or str(path) in err, err
        assert "pickled" not in err, err
        reasons.append(err)
        assert not (tmp_path / "out" / "results.csv").exists()
    assert "not a NumPy .npy file" in reasons[2] and "2-D" in reasons[3]
    assert "NaN" in reasons[4] and "positive" in reasons[5]


def test_output_name_collisions_are_refused_up_front(tmp_path, prior_dir, capsys):
    inp = tmp_path / "in"
    inp.mkdir()
    write_image(inp / "a.png", smooth())
    write_image(inp / "a.jpg", smooth(phase=1))
    out = tmp_path / "out"
    assert run("restore", "-i", inp, "-o", out, "--task", "denoise", prior=prior_dir) == 0
    assert {r["name"]: r["output"] for r in rows(out)} == {"a.jpg": "a_jpg.png", "a.png": "a_png.png"}
    # within one run: a.png and a.PNG cannot both be a_png.png (on a case-insensitive disk)
    fresh = tmp_path / "fresh"
    write_image(inp / "a.PNG", smooth(phase=2))
    assert run("restore", "-i", inp, "-o", fresh, "--task", "denoise", prior=prior_dir) == 2
    err = capsys.readouterr().err
    assert str(inp / "a.png") in err and str(inp / "a.PNG") in err and "would both be written" in err, err
    # against an earlier run: a.PNG would take the name a.png's output has there
    before = {p.name: p.read_bytes() for p in out.glob("*.png")}
    stamp = (out / "results.csv").stat().st_mtime_ns
    assert run("restore", "-i", inp, "-o", out, "--task", "denoise", prior=prior_dir) == 2
    err = capsys.readouterr().err
    assert str(inp / "a.PNG") in err and "an earlier run wrote for a.png" in err and "Traceback" not in err, err
    assert {p.name: p.read_bytes() for p in out.glob("*.png")} == before  # nothing overwritten
    assert (out / "results.csv").stat().st_mtime_ns == stamp
    (inp / "a.PNG").unlink()
    # a file named like another's output gets a name of its own; the others keep theirs
    write_image(inp / "a_png.png", smooth(phase=3))
    assert run("restore", "-i", inp, "-o", out, "--task", "denoise", prior=prior_dir) == 0
    assert {r["name"]: r["output"] for r in rows(out)} == {"a.jpg": "a_jpg.png", "a.png": "a_png.png",
                                                            "a_png.png": "a_png_png.png"}
    assert {p.name: p.read_bytes() for p in out.glob("*.png") if p.name in before} == before


def test_output_names_stay_with_their_inputs_across_runs(tmp_path, prior_dir):
    """An output name belongs to the input an earlier run wrote it for: adding a.jpg beside a.png
    neither renames a.png's output nor overwrites it, and a rerun skips each image with its own."""
    inp = tmp_path / "in"
    inp.mkdir()
    write_image(inp / "a.png", smooth())
    out = tmp_path / "out"
    assert run("restore", "-i", inp / "a.png", "-o", out, "--task", "denoise", prior=prior_dir) == 0
    first = (out / "a.png").read_bytes()
    write_image(inp / "a.jpg", smooth(phase=1))
    assert run("restore", "-i", inp / "a.jpg", "-o", out, "--task", "denoise", prior=prior_dir) == 0
    assert (out / "a.png").read_bytes() == first and (out / "a_jpg.png").is_file()
    assert run("restore", "-i", inp, "-o", out, "--task", "denoise", prior=prior_dir) == 0
    assert {r["name"]: (r["output"], r["status"]) for r in rows(out)} == {
        "a.png": ("a.png", "skipped"), "a.jpg": ("a_jpg.png", "skipped")}
    assert sorted(p.name for p in out.glob("*.png")) == ["a.png", "a_jpg.png"]  # no orphaned copy



def test_broken_links_and_folders_named_like_images_are_reported(tmp_path, prior_dir, capsys):
    inp = tmp_path / "in"
    make_images(inp, 1)
    (inp / "gone.png").symlink_to(tmp_path / "deleted.png")
    (inp / "x.png").mkdir()
    (inp / "subfolder").mkdir()  # a plain folder is not an input
    out = tmp_path / "out"
    assert run("restore", "-i", inp, "-o", out, "--task", "denoise", prior=prior_dir) == 1
    err = capsys.readouterr().err
    by_name = {r["name"]: r for r in rows(out)}
    assert sorted(by_name) == ["gone.png", "im0.png", "x.png"]
    assert by_name["im0.png"]["status"] == "done"
    assert by_name["gone.png"]["status"] == by_name["x.png"]["status"] == "failed"
    assert "broken symbolic link" in by_name["gone.png"]["error"] and "deleted.png" in by_name["gone.png"]["error"]
    assert "is a folder" in by_name["x.png"]["error"]
    assert "gone.png" in err and "x.png" in err


def _full_disk(monkeypatch, name: str) -> None:
    """Writes of files called ``name`` fail as on a full disk."""
    import nfc_dps.io as nio

    real = nio.atomic_write_bytes

    def write(path, data):
        if Path(path).name == name:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, data)

    monkeypatch.setattr(nio, "atomic_write_bytes", write)
    # and where it is defined, which write_json, write_image, ... call
    monkeypatch.setattr(sys.modules[real.__module__], "atomic_write_bytes", write)


def test_full_disk_is_a_clear_error_that_keeps_finished_work(tmp_path, prior_dir, monkeypatch, capsys):
    make_images(tmp_path / "in", 3)
    out = tmp_path / "out"
    argv = ("restore", "-i", tmp_path / "in", "-o", out, "--task", "denoise")

    def os_write(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as m:  # the lock file
        m.setattr(os, "write", os_write)
        assert run(*argv, prior=prior_dir) == 2
    err = capsys.readouterr().err
    assert f"cannot write the lock file {out / LOCK_FILE}: No space left on device" in err
    assert "Traceback" not in err and not (out / LOCK_FILE).exists()

    with monkeypatch.context() as m:
        _full_disk(m, RESOLVED_JSON)
        assert run(*argv, prior=prior_dir) == 2
    err = capsys.readouterr().err
    assert f"{out / RESOLVED_JSON}: No space left on device" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and not (out / LOCK_FILE).exists()

    with monkeypatch.context() as m:  # full while writing the second image
        _full_disk(m, "im1.png")
        assert run(*argv, prior=prior_dir) == 2
    err = capsys.readouterr().err
    assert f"{out / 'im1.png'}: No space left on device" in err and "resume" in err and "Traceback" not in err
    assert image_opens(out / "im0.png") and not (out / "im2.png").exists()
    assert sorted(json.loads((out / "manifest.json").read_text())["images"]) == ["im0.png"]
    stamp = (out / "im0.png").stat().st_mtime_ns
    assert run(*argv, prior=prior_dir) == 0  # space freed: resumes
    assert [r["status"] for r in rows(out)] == ["skipped", "done", "done"]
    assert (out / "im0.png").stat().st_mtime_ns == stamp


def test_manifest_entries_of_the_wrong_type_are_redone(tmp_path, prior_dir, capsys):
    make_images(tmp_path / "in", 3)
    out = tmp_path / "out"
    argv = ("restore", "-i", tmp_path / "in", "-o", out, "--task", "denoise")
    assert run(*argv, prior=prior_dir) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["images"]["im0.png"] = "done"
    manifest["images"]["im1.png"]["outputs"] = 5
    (out / "manifest.json").write_text(json.dumps(manifest))
    capsys.readouterr()
    assert run(*argv, prior=prior_dir) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "manifest.json" in err and "'im0.png'" in err and "'im1.png'" in err
    assert [r["status"] for r in rows(out)] == ["done", "done", "skipped"]
    (out / "manifest.json").write_text("[1, 2]")
    assert run(*argv, prior=prior_dir) == 0
    assert "manifest.json" in capsys.readouterr().err and [r["status"] for r in rows(out)] == ["done"] * 3


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write to read-only folders")
def test_read_only_output(tmp_path, prior_dir, capsys):
    make_images(tmp_path / "in", 1)
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        assert run("restore", "-i", tmp_path / "in", "-o", ro, "--task", "denoise", prior=prior_dir) == 2
        assert "not writable" in capsys.readouterr().err
    finally:
        ro.chmod(0o700)


def test_busy_output_folder_is_refused(tmp_path, prior_dir, capsys):
    make_images(tmp_path / "in", 1)
    out = tmp_path / "out"
    out.mkdir()
    other = hold_lock(out)
    try:
        assert run("restore", "-i", tmp_path / "in", "-o", out, "--task", "denoise", prior=prior_dir) == 2
        assert "another nfc-dps run" in capsys.readouterr().err
    finally:
        other.kill()
        other.wait()
    assert (out / LOCK_FILE).exists()  # left by the killed run, and free: the kernel let go of its lock
    assert run("restore", "-i", tmp_path / "in", "-o", out, "--task", "denoise", prior=prior_dir) == 0


# ---------------------------------------------------------------- image kinds, SR, samples, metrics


def test_sr_alpha_bit_depth_gray_and_odd_sizes(tmp_path, prior_dir):
    inp = tmp_path / "in"
    inp.mkdir()
    alpha = np.linspace(0, 1, 16 * 16, dtype=np.float32).reshape(16, 16)
    write_image(inp / "rgba.png", smooth(16, 16), alpha=alpha)
    write_image(inp / "deep.png", smooth(16, 16), bit_depth=16)
    write_image(inp / "gray.png", smooth(16, 16, c=1))
    out = tmp_path / "sr"
    assert run("restore", "-i", inp, "-o", out, "--task", "sr_bicubic", "--param", "factor=2", prior=prior_dir) == 0
    x, info = read_image(out / "rgba.png")
    assert x.shape == (32, 32, 3) and not info.has_alpha
    assert "dropped" in {r["name"]: r for r in rows(out)}["rgba.png"]["alpha"]
    assert json.loads((out / "summary.json").read_text())["alpha"]
    assert read_image(out / "deep.png")[1].bit_depth == 16
    assert read_image(out / "gray.png")[0].shape == (32, 32)

    # same-size task: alpha re-attached; 16-bit in -> --bit-depth 8 out; odd sizes padded for the
    # prior (multiples of 2). (The fast preset's spectral fit needs images of about 32 px or more.)
    inp, out = tmp_path / "in32", tmp_path / "dn"
    inp.mkdir()
    alpha = np.linspace(0, 1, 32 * 32, dtype=np.float32).reshape(32, 32)
    write_image(inp / "rgba.png", smooth(), alpha=alpha)
    write_image(inp / "deep.png", smooth(), bit_depth=16)
    write_image(inp / "odd.png", smooth(33, 35))
    assert run("restore", "-i", inp, "-o", out, "--task", "denoise", "--bit-depth", "8", prior=prior_dir) == 0
    x, info = read_image(out / "rgba.png")
    assert x.shape == (32, 32, 3) and info.has_alpha and np.abs(info.alpha - alpha).max() < 1 / 255
    assert "re-attached" in {r["name"]: r for r in rows(out)}["rgba.png"]["alpha"]
    assert read_image(out / "deep.png")[1].bit_depth == 8
    assert read_image(out / "odd.png")[0].shape == (33, 35, 3)


def test_samples_std_map_and_ground_truth_metrics(tmp_path, prior_dir, capsys):
    make_images(tmp_path / "gt", 2)
    make_images(tmp_path / "in", 2)
    out = tmp_path / "out"
    assert run("restore", "-i", tmp_path / "in", "-o", out, "--task", "denoise", "--samples", 2, "--save-samples",
               "--gt", tmp_path / "gt", prior=prior_dir) == 2  # the default preset is deterministic
    assert "--preset fast" in capsys.readouterr().err
    assert run("restore", "-i", tmp_path / "in", "-o", out, "--task", "denoise", "--samples", 2, "--save-samples",
               "--preset", "fast", "--gt", tmp_path / "gt", prior=prior_dir) == 0
    for stem in ("im0", "im1"):
        assert image_opens(out / "std" / f"{stem}.png")
        std = np.load(out / "std" / f"{stem}.npy")
        assert std.shape == (32, 32, 3) and np.isfinite(std).all() and std.max() > 0
        assert image_opens(out / "samples" / f"{stem}_0.png") and image_opens(out / "samples" / f"{stem}_1.png")
    r = rows(out)
    assert all(-1 <= float(x["ssim"]) <= 1 for x in r)
    check_gt_metrics(out, tmp_path / "gt", r)
    s = json.loads((out / "summary.json").read_text())
    assert s["mean_psnr"] == pytest.approx(np.mean([float(x["psnr"]) for x in r]), abs=1e-3)
    assert s["metrics_images"] == 2 and s["num_samples"] == 2


def _spy_sampler_batches(monkeypatch) -> list[int]:
    """Record the number of chains of every sampler call."""
    import nfc_dps.samplers.chains as chains

    calls: list[int] = []
    real = chains.get_method

    def spy(name):
        method = real(name)

        class Spy:
            def __getattr__(self, name):
                return getattr(method, name)

            def sample(self, prior, measurement, *rest):
                calls.append(measurement.y.shape[0])
                return method.sample(prior, measurement, *rest)

        return Spy()

    monkeypatch.setattr(chains, "get_method", spy)  # the chain driver's registry lookup
    return calls


def test_samples_run_in_chunks_of_max_batch(tmp_path, prior_dir, monkeypatch):
    """--samples 3: --max-batch 1 runs one chain per sampler call, the default all 3; the outputs
    agree (batched network layers round differently in the last float32 bits only; bfloat16,
    which "auto" may pick, rounds coarser)."""
    calls = _spy_sampler_batches(monkeypatch)
    make_images(tmp_path / "in", 1)
    outs = {}
    for chunk in (1, None):
        outs[chunk] = out = tmp_path / f"out{chunk}"
        flags = ["--max-batch", chunk] if chunk else []
        assert run("restore", "-i", tmp_path / "in", "-o", out, "--task", "denoise", "--preset", "fast", "--samples", 3, "--save-samples",
                   "--precision", "float32", *flags, prior=prior_dir) == 0
    assert calls == [1, 1, 1, 3]
    a, b = (np.load(outs[c] / "std" / "im0.npy") for c in (1, None))
    np.testing.assert_allclose(a, b, atol=1e-5)
    for name in ("im0.png", "samples/im0_0.png", "samples/im0_2.png"):
        a, b = (read_image(outs[c] / name)[0] for c in (1, None))
        assert np.abs(a - b).max() <= 1 / 255 + 1e-6 and (a == b).mean() > 0.99, name
    assert json.loads((outs[1] / "resolved_config.json").read_text())["max_batch"] == 1
    assert run("restore", "-i", tmp_path / "in", "-o", tmp_path / "x", "--task", "denoise", "--max-batch", 0,
               prior=prior_dir) == 2


def test_batch_size_restores_same_sized_images_together(tmp_path, prior_dir, monkeypatch):
    """--batch-size 3 puts same-sized images (same channels) in one sampler call; each keeps its
    seed, so the outputs are those of --batch-size 1 (float32 here: see the --max-batch test)."""
    calls = _spy_sampler_batches(monkeypatch)
    inp = tmp_path / "in"
    make_images(inp, 4)
    write_image(inp / "gray.png", smooth(c=1))
    write_image(inp / "small.png", smooth(16, 16))
    outs = {}
    for b in (1, 3):
        outs[b] = tmp_path / f"out{b}"
        assert run("restore", "-i", inp, "-o", outs[b], "--task", "denoise", "--batch-size", b,
                   "--precision", "float32", prior=prior_dir) == 0
    assert calls == [1] * 6 + [3, 1, 1, 1]  # im0-im2 together; im3, gray and small alone
    names = ["gray.png", "im0.png", "im1.png", "im2.png", "im3.png", "small.png"]
    assert [r["name"] for r in rows(outs[3])] == names and {r["status"] for r in rows(outs[3])} == {"done"}
    assert [r["seed"] for r in rows(outs[3])] == [r["seed"] for r in rows(outs[1])]
    for name in names:
        a, b = (read_image(outs[k] / name)[0] for k in (1, 3))
        assert a.shape == b.shape and np.abs(a - b).max() <= 1 / 255 + 1e-6 and (a == b).mean() > 0.99, name
    resolved = json.loads((outs[3] / "resolved_config.json").read_text())
    assert resolved["batch_size"] == 3 and resolved["max_batch"] == 4
    assert run("restore", "-i", inp, "-o", tmp_path / "x", "--task", "denoise", "--batch-size", 0, prior=prior_dir) == 2


def test_a_failing_image_fails_alone_in_its_batch(tmp_path, prior_dir, monkeypatch):
    import nfc_dps.api as api

    real = api.restore
    bad = image_seed(0, "im1.png")
    batches = []

    def flaky(y, operator, **kw):
        batches.append(len(kw["seed"]))
        if bad in kw["seed"]:
            raise FloatingPointError("nfc produced NaN/Inf")
        res = real(y, operator, **kw)
        if image_seed(0, "im3.png") in kw["seed"]:  # NaN in one image of a batch that ran
            res.image[kw["seed"].index(image_seed(0, "im3.png"))] = float("nan")
        return res

    monkeypatch.setattr(api, "restore", flaky)
    make_images(tmp_path / "in", 6)
    out = tmp_path / "out"
    assert run("restore", "-i", tmp_path / "in", "-o", out, "--task", "denoise", "--batch-size", 3, prior=prior_dir) == 1
    assert batches == [3, 1, 1, 1, 3]  # im0-im2 failed together, then one by one; im3-im5 ran
    assert [r["status"] for r in rows(out)] == ["done", "failed", "done", "failed", "done", "done"]
    assert all("NaN" in rows(out)[i]["error"] for i in (1, 3))
    assert not (out / "im1.png").exists() and not (out / "im3.png").exists()


def test_missing_ground_truth_is_reported(tmp_path, prior_dir):
    make_images(tmp_path / "in", 2)
    (tmp_path / "gt").mkdir()
    write_image(tmp_path / "gt" / "im0.png", smooth())
    out = tmp_path / "out"
    assert run("restore", "-i", tmp_path / "in", "-o", out, "--task", "denoise", "--gt", tmp_path / "gt", prior=prior_dir) == 1
    r = rows(out)
    assert r[0]["psnr"] and not r[1]["psnr"] and "no ground truth" in r[1]["error"]
    assert image_opens(out / "im1.png")


# ---------------------------------------------------------------- simulate -> restore


@pytest.mark.parametrize("task, params, files", [
    ("inpaint_box", ["box_size=8", "margin=2"], "masks"),
    ("deblur_motion", ["kernel_size=7"], "kernels"),
])
def test_simulate_then_restore_from_record(tmp_path, prior_dir, task, params, files):
    make_images(tmp_path / "clean", 2)
    sim = tmp_path / "sim"
    argv = ["simulate", "-i", tmp_path / "clean", "-o", sim, "--task", task, "--seed", 3]
    for p in params:
        argv += ["--param", p]
    assert run(*argv) == 0
    record = json.loads((sim / "simulation.json").read_text())
    assert record["kind"] == "nfc_dps.simulation" and record["simulation_seed"] == 3
    assert [i["operator_seed"] for i in record["images"]] == [image_seed(3, "im0.png"), image_seed(3, "im1.png")]
    assert record["simulated_task"]["task"] == task
    for stem in ("im0", "im1"):
        assert image_opens(sim / "measurements" / f"{stem}.png") and image_opens(sim / "ground_truth" / f"{stem}.png")
        assert image_opens(sim / files / f"{stem}.png")
        if files == "kernels":
            k = np.load(sim / "kernels" / f"{stem}.npy")
            assert k.shape == (7, 7) and abs(k.sum() - 1) < 1e-6
    if files == "masks":  # a different box per image, drawn from the seed and the file name
        assert not np.array_equal(read_image(sim / "masks/im0.png")[0], read_image(sim / "masks/im1.png")[0])
    else:  # restore reads the exact .npy kernel, not its quantised picture of the same name
        from nfc_dps.cli.tasks import OperatorSource
        from nfc_dps.config import TaskConfig

        source = OperatorSource(TaskConfig(task="deblur_kernel", params={"kernel_path": str(sim / "kernels")}))
        assert source.files_for("im0.png") == sim / "kernels" / "im0.npy"
    first = (sim / "measurements" / "im0.png").read_bytes()
    assert run(*argv) == 0 and (sim / "measurements" / "im0.png").read_bytes() == first  # reproducible
    # a file added before im0 in the sorted list changes no other image's measurement (seeds by name)
    write_image(tmp_path / "clean" / "a_first.png", read_image(tmp_path / "clean" / "im1.png")[0])
    sim2 = tmp_path / "sim2"
    assert run(*[sim2 if a == sim else a for a in argv]) == 0
    assert (sim2 / "measurements" / "im0.png").read_bytes() == first

    out = tmp_path / "out"
    assert run("restore", "--config", sim / "simulation.json", "-o", out, prior=prior_dir) == 0
    r = rows(out)
    assert [x["status"] for x in r] == ["done", "done"]
    check_gt_metrics(out, sim / "ground_truth", r)  # the recorded ground truth folder
    resolved = json.loads((out / "resolved_config.json").read_text())
    assert resolved["task"]["task"] in ("inpaint_mask", "deblur_kernel")
    # the resolved config reproduces the run (resume finds everything done)
    assert run("restore", "--config", out / "resolved_config.json", "-i", sim / "measurements", "-o", out,
               prior=prior_dir, steps=None) == 0
    assert [x["status"] for x in rows(out)] == ["skipped", "skipped"]


def test_readme_flow_simulate_folder_as_restore_input(tmp_path, prior_dir):
    """`restore --input <simulate output> --config configs/deblur_motion.yaml --gt clean/` uses the
    recorded kernels (a random task cannot be rebuilt from its config alone)."""
    configs = Path(__file__).resolve().parents[1] / "configs"
    make_images(tmp_path / "clean", 2)
    assert run("simulate", "-i", tmp_path / "clean", "-o", tmp_path / "meas", "--config",
               configs / "deblur_motion.yaml", "--param", "kernel_size=7") == 0
    out = tmp_path / "restored"
    assert run("restore", "-i", tmp_path / "meas", "-o", out, "--config", configs / "deblur_motion.yaml",
               "--gt", tmp_path / "clean", prior=prior_dir) == 0
    r = rows(out)
    assert [x["name"] for x in r] == ["im0.png", "im1.png"]
    check_gt_metrics(out, tmp_path / "clean", r)
    task = json.loads((out / "resolved_config.json").read_text())["task"]
    assert task["task"] == "deblur_kernel" and task["kernel_path"] == str((tmp_path / "meas" / "kernels").resolve())


def test_an_interrupted_overwrite_run_keeps_every_output_name(tmp_path, prior_dir, monkeypatch):
    """--overwrite (interrupted, then rerun) keeps every output's name: none renamed, none orphaned."""
    from nfc_dps.cli import restore as restore_cli

    inp = tmp_path / "in"
    inp.mkdir()
    write_image(inp / "a.png", smooth())
    out = tmp_path / "out"
    assert run("restore", "-i", inp, "-o", out, "--task", "denoise", prior=prior_dir) == 0
    write_image(inp / "a.jpg", smooth(phase=1))
    assert run("restore", "-i", inp, "-o", out, "--task", "denoise", prior=prior_dir) == 0
    real, calls = restore_cli.RestoreRun._restore_jobs, []

    def interrupted(self, jobs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        real(self, jobs)

    monkeypatch.setattr(restore_cli.RestoreRun, "_restore_jobs", interrupted)
    assert run("restore", "-i", inp, "-o", out, "--task", "denoise", "--overwrite", prior=prior_dir) == 130
    monkeypatch.undo()
    assert run("restore", "-i", inp, "-o", out, "--task", "denoise", "--overwrite", prior=prior_dir) == 0
    assert sorted(p.name for p in out.glob("*.png")) == ["a.png", "a_jpg.png"]  # a.png not renamed a_png.png
    assert [r["status"] for r in rows(out)] == ["done", "done"]
    from nfc_dps.cli.records import recorded_stems

    assert recorded_stems(out) == {"a.png": "a", "a.jpg": "a_jpg"}
    (out / "a_jpg.png").unlink()  # an output that is gone frees its name
    assert recorded_stems(out) == {"a.png": "a"}


def test_simulate_again_removes_what_it_wrote_for_images_gone_since(tmp_path, prior_dir):
    """A simulate folder reflects its simulation.json: measurements of images that an earlier run
    simulated and this one does not are removed, so restore cannot pick up a stale one."""
    make_images(tmp_path / "clean", 2)
    sim = tmp_path / "sim"
    argv = ["simulate", "-i", tmp_path / "clean", "-o", sim, "--task", "deblur_motion", "--param", "kernel_size=7"]
    assert run(*argv) == 0
    names = lambda sub: sorted(p.name for p in (sim / sub).iterdir())  # noqa: E731
    # adding one image with the same settings keeps the others (simulated one run at a time)
    write_image(tmp_path / "new.png", smooth(phase=5))
    assert run(*[tmp_path / "new.png" if a == tmp_path / "clean" else a for a in argv]) == 0
    assert names("measurements") == ["im0.png", "im1.png", "new.png"]
    recorded = json.loads((sim / "simulation.json").read_text())["images"]
    assert sorted(r["name"] for r in recorded) == ["im0.png", "im1.png", "new.png"]
    # an image that fails now (unreadable for a moment) keeps its earlier measurement
    good = (tmp_path / "clean" / "im1.png").read_bytes()
    (tmp_path / "clean" / "im1.png").write_bytes(b"not a png")
    assert run(*argv) == 1
    assert names("measurements") == ["im0.png", "im1.png", "new.png"]
    (tmp_path / "clean" / "im1.png").write_bytes(good)
    # other settings: what the earlier runs wrote for images not simulated now goes
    (tmp_path / "clean" / "im1.png").unlink()
    assert run(*argv, "--noise-sigma", "0.05") == 0
    assert names("measurements") == names("ground_truth") == ["im0.png"]
    assert names("kernels") == ["im0.npy", "im0.png"]
    # restoring with the flags the folder was simulated with: the task's own parameters are noted
    # and dropped (the recorded kernel files define the operator), not an error
    out = tmp_path / "out"
    assert run("restore", "-i", sim, "-o", out, "--task", "deblur_motion", "--param", "kernel_size=7",
               prior=prior_dir) == 0
    assert [r["name"] for r in rows(out)] == ["im0.png"]


def test_output_folder_may_not_be_the_mask_or_kernel_folder(tmp_path, prior_dir, capsys):
    make_images(tmp_path / "in", 1)
    masks = tmp_path / "masks"
    masks.mkdir()
    write_image(masks / "im0.png", np.ones((32, 32), np.float32))
    before = (masks / "im0.png").read_bytes()
    assert run("restore", "-i", tmp_path / "in", "-o", masks, "--task", "inpaint_mask", "--mask", masks,
               prior=prior_dir) == 2
    assert f"--mask {masks} (folder) is the output folder" in capsys.readouterr().err
    assert (masks / "im0.png").read_bytes() == before


def test_flag_errors_come_before_the_output_folder_is_made(tmp_path, prior_dir, capsys):
    make_images(tmp_path / "in", 1)
    assert run("restore", "-i", tmp_path / "in", "-o", tmp_path / "out", "--task", "denoise", "--threads", "0",
               prior=prior_dir) == 2
    assert "--threads must be >= 1" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_interrupted_run_keeps_the_records_of_images_written(tmp_path, prior_dir, monkeypatch):
    """Ctrl-C after an image is written: the rerun skips it (its record was saved on the way out)."""
    from nfc_dps.cli import restore as restore_cli

    make_images(tmp_path / "in", 3)
    real, calls = restore_cli.RestoreRun._restore_jobs, []

    def interrupted(self, jobs):
        calls.append(len(jobs))
        if len(calls) == 2:
            raise KeyboardInterrupt
        real(self, jobs)

    monkeypatch.setattr(restore_cli.RunRecords, "save", lambda self, final=False: None)  # only the final write
    monkeypatch.setattr(restore_cli.RestoreRun, "_restore_jobs", interrupted)
    out = tmp_path / "out"
    assert run("restore", "-i", tmp_path / "in", "-o", out, "--task", "denoise", prior=prior_dir) == 130
    monkeypatch.undo()
    assert list(json.loads((out / "manifest.json").read_text())["images"]) == ["im0.png"]
    assert run("restore", "-i", tmp_path / "in", "-o", out, "--task", "denoise", prior=prior_dir) == 0
    assert [r["status"] for r in rows(out)] == ["skipped", "done", "done"]


def test_images_in_subfolders_are_named_not_silently_skipped(tmp_path, prior_dir, capsys):
    make_images(tmp_path / "in", 1)
    make_images(tmp_path / "in" / "sub", 2)
    assert run("restore", "-i", tmp_path / "in", "-o", tmp_path / "in" / "out", "--task", "denoise",
               prior=prior_dir) == 0
    assert "2 image(s) in subfolders" in capsys.readouterr().err
    assert run("restore", "-i", tmp_path / "in", "-o", tmp_path / "in" / "out", "--task", "denoise",
               prior=prior_dir) == 0  # its own outputs inside the input folder are not counted
    assert "2 image(s) in subfolders" in capsys.readouterr().err


def test_a_relative_param_path_is_recorded_absolute(tmp_path, prior_dir, monkeypatch, capsys):
    """resolved_config.json must restore from any folder: a relative --param kernel_path is
    recorded as the absolute path it meant; a different prior than the recorded one is named."""
    make_images(tmp_path / "in", 1)
    np.save(tmp_path / "k.npy", np.full((3, 3), 1 / 9))
    monkeypatch.chdir(tmp_path)
    assert run("restore", "-i", "in", "-o", "out", "--task", "deblur_kernel", "--param", "kernel_path=k.npy",
               prior=prior_dir) == 0
    resolved = tmp_path / "out" / "resolved_config.json"
    assert json.loads(resolved.read_text())["task"]["kernel_path"] == str(tmp_path / "k.npy")
    capsys.readouterr()
    assert run("restore", "-i", "in", "-o", "out2", "--config", resolved, prior=prior_dir) == 0
    assert "was written with the prior" not in capsys.readouterr().err
    # with another prior (a copy of the same weights): the record's is named in a warning
    import shutil

    shutil.copytree(prior_dir, tmp_path / "other_prior")
    assert run("restore", "-i", "in", "-o", "out3", "--config", resolved, prior=str(tmp_path / "other_prior")) == 0
    assert "was written with the prior" in capsys.readouterr().err


def test_simulate_sr_crops_to_factor(tmp_path):
    (tmp_path / "clean").mkdir()
    write_image(tmp_path / "clean" / "a.png", smooth(34, 33))
    assert run("simulate", "-i", tmp_path / "clean", "-o", tmp_path / "sim", "--config",
               Path(__file__).resolve().parents[1] / "configs" / "sr_bicubic.yaml") == 0
    assert read_image(tmp_path / "sim/measurements/a.png")[0].shape == (8, 8, 3)
    assert read_image(tmp_path / "sim/ground_truth/a.png")[0].shape == (32, 32, 3)
    rec = json.loads((tmp_path / "sim/simulation.json").read_text())
    assert rec["images"][0]["crop"] == [1, 0, 32, 32] and rec["task"]["task"] == "sr_bicubic"


# ---------------------------------------------------------------- demo, convert-adm


def test_demo_small(tmp_path, prior_dir, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--output", str(out), "--prior", prior_dir, "--size", "32", "--steps", "1"]) == 0
    printed = capsys.readouterr().out
    assert "astronaut" in printed and "PSNR" in printed
    grid, _ = read_image(out / "grid.png")
    assert grid.shape[0] > 3 * 32 and grid.shape[1] > 6 * 32
    lines = (out / "metrics.csv").read_text().strip().splitlines()
    assert lines[0].startswith("task,image") and len(lines) == 7
    for task in ("sr_bicubic", "inpaint_box", "deblur_gaussian"):
        for name in ("astronaut", "coffee"):
            for kind in ("measurement", "restored", "ground_truth"):
                assert image_opens(out / task / f"{name}_{kind}.png")
    assert read_image(out / "sr_bicubic" / "astronaut_restored.png")[0].shape == (32, 32, 3)
    # each row scores its restored image against its ground truth (to 8-bit PNG rounding)
    import csv

    from skimage.metrics import peak_signal_noise_ratio

    with open(out / "metrics.csv") as f:
        for row in csv.DictReader(f):
            restored = read_image(out / row["task"] / f"{row['image']}_restored.png")[0]
            truth = read_image(out / row["task"] / f"{row['image']}_ground_truth.png")[0]
            want = peak_signal_noise_ratio(truth, np.clip(restored, 0, 1), data_range=1.0)
            assert float(row["psnr"]) == pytest.approx(want, abs=0.05), row
    box = out / "inpaint_box"
    assert not np.array_equal(read_image(box / "coffee_restored.png")[0], read_image(box / "coffee_measurement.png")[0])
    capsys.readouterr()
    assert main(["demo", "--output", str(tmp_path / "all"), "--prior", prior_dir, "--size", "32", "--steps", "1",
                 "--tasks", "all"]) == 0
    assert len((tmp_path / "all" / "metrics.csv").read_text().strip().splitlines()) == 11
    assert main(["demo", "--output", str(tmp_path / "bad"), "--prior", prior_dir, "--tasks", "sr4"]) == 2
    assert "--tasks sr4: choose from" in capsys.readouterr().err and not (tmp_path / "bad").exists()


def test_convert_adm_errors(tmp_path, monkeypatch, capsys):
    assert main(["convert-adm", str(tmp_path / "missing.pt"), str(tmp_path / "o"), "--preset", "ffhq256"]) == 2
    assert "no such file" in capsys.readouterr().err
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    assert main(["convert-adm", str(tmp_path / "junk.pt"), str(tmp_path / "o"), "--preset", "ffhq256"]) == 1
    assert "junk.pt" in capsys.readouterr().err
    assert main(["convert-adm", str(tmp_path / "junk.pt"), str(tmp_path / "o"), "--preset", "lsun"]) == 2
    import nfc_dps.priors as priors

    monkeypatch.delattr(priors, "adm", raising=False)
    monkeypatch.setitem(sys.modules, "nfc_dps.priors.adm", None)
    assert main(["convert-adm", str(tmp_path / "junk.pt"), str(tmp_path / "o"), "--preset", "ffhq256"]) == 2
    assert "not available" in capsys.readouterr().err


# ---------------------------------------------------------------- killed mid-folder


@pytest.mark.slow
def test_sigkill_mid_folder_then_resume(tmp_path, prior_dir):
    inp, out = tmp_path / "in", tmp_path / "out"
    make_images(inp, 5)
    argv = ["restore", "-i", str(inp), "-o", str(out), "--task", "denoise", "--prior", prior_dir,
            "--steps", "60", "--quiet"]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "nfc_dps", *argv], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    done: dict = {}
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if (out / "manifest.json").is_file():
                done = json.loads((out / "manifest.json").read_text())["images"]  # atomic: always whole
                if done:
                    proc.send_signal(signal.SIGKILL)
                    break
            time.sleep(0.01)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert done, proc.stderr.read().decode()[-2000:]
    assert proc.returncode == -signal.SIGKILL
    done = json.loads((out / "manifest.json").read_text())["images"]
    assert 1 <= len(done) < 5, "the run finished before it could be killed: raise --steps"
    stamps = {n: (out / n).stat().st_mtime_ns for n in done}

    assert main(argv) == 0  # resume (the lock of the killed run is stale)
    manifest = json.loads((out / "manifest.json").read_text())["images"]
    assert sorted(manifest) == [f"im{i}.png" for i in range(5)]
    for n, entry in done.items():
        assert manifest[n] == entry and (out / n).stat().st_mtime_ns == stamps[n]  # not recomputed
    assert all(image_opens(out / f"im{i}.png") for i in range(5))
    assert not list(out.glob(f".*{TEMP_SUFFIX}")) and not (out / LOCK_FILE).exists()
    statuses = {r["name"]: r["status"] for r in rows(out)}
    assert all(statuses[n] == "skipped" for n in done)

    fresh = tmp_path / "fresh"  # an uninterrupted run gives the same images
    assert main([*argv[:4], str(fresh), *argv[5:]]) == 0
    for i in range(5):
        np.testing.assert_array_equal(read_image(out / f"im{i}.png")[0], read_image(fresh / f"im{i}.png")[0])


# ---------------------------------------------------------------- torchrun sharding


def _torchrun_restore(nproc: int, argv: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--standalone",
           "-m", "nfc_dps", *argv]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_restore_under_torchrun_equals_one_process_and_resumes(tmp_path, prior_dir):
    """2 gloo processes give byte-identical images and the same records as 1 process; a rerun
    skips everything; the shards of an interrupted sharded run are merged into the manifest."""
    inp = tmp_path / "in"
    make_images(inp, 5)
    (inp / "broken.png").write_bytes(b"not a png")
    base = ["restore", "-i", str(inp), "--task", "deblur_gaussian", "--param", "boundary=circular", "--prior", prior_dir,
            "--steps", "2", "--quiet"]
    single, sharded = tmp_path / "single", tmp_path / "sharded"
    assert main(base + ["-o", str(single), "--threads", "1"]) == 1  # broken.png fails: exit 1
    p = _torchrun_restore(2, base + ["-o", str(sharded), "--threads", "1"])
    assert p.returncode != 0 and "broken.png" in p.stderr, p.stderr[-3000:]  # the failure is reported, exit 1
    for i in range(5):
        assert (single / f"im{i}.png").read_bytes() == (sharded / f"im{i}.png").read_bytes(), i
    volatile = ("seconds",)
    strip = [{k: v for k, v in r.items() if k not in volatile} for r in rows(single)]
    assert [{k: v for k, v in r.items() if k not in volatile} for r in rows(sharded)] == strip
    m1 = json.loads((single / "manifest.json").read_text())["images"]
    m2 = json.loads((sharded / "manifest.json").read_text())["images"]
    assert sorted(m1) == sorted(m2) == [f"im{i}.png" for i in range(5)]
    assert all(m1[n]["key"] == m2[n]["key"] for n in m1)
    summary = json.loads((sharded / "summary.json").read_text())
    assert summary["complete"] and summary["counts"] == {"images": 6, "restored": 5, "skipped_done_before": 0,
                                                         "failed": 1}
    assert not (sharded / ".shards").exists()
    assert not (sharded / LOCK_FILE).exists()

    # resume under torchrun: every image skipped, nothing rewritten
    stamps = {n: (sharded / n).stat().st_mtime_ns for n in m2}
    p = _torchrun_restore(2, base + ["-o", str(sharded), "--threads", "1"])
    assert p.returncode != 0 and "broken.png" in p.stderr, p.stderr[-3000:]  # still failing: exit 1
    assert {r["name"]: r["status"] for r in rows(sharded)} == {**{n: "skipped" for n in m2}, "broken.png": "failed"}
    assert {n: (sharded / n).stat().st_mtime_ns for n in m2} == stamps

    # a sharded run killed before its merge leaves shards: the next run (any size) folds them in
    shards = sharded / ".shards"
    shards.mkdir(exist_ok=True)
    names = sorted(m2)
    for rank in (0, 1):
        mine = names[rank::2]
        (shards / f"rank{rank}.json").write_text(json.dumps({"names": mine, "images": {n: m2[n] for n in mine},
                                                             "rows": []}))
    (sharded / "manifest.json").unlink()
    assert main(base + ["-o", str(sharded), "--threads", "1"]) == 1
    assert {r["name"]: r["status"] for r in rows(sharded)} == {**{n: "skipped" for n in m2}, "broken.png": "failed"}
    assert {n: (sharded / n).stat().st_mtime_ns for n in m2} == stamps
    assert not list(shards.glob("rank*.json"))


@pytest.mark.slow
def test_a_second_run_is_refused_on_every_rank(tmp_path, prior_dir):
    """The folder lock holds for a torchrun group: a live run's lock refuses both ranks (exit 2)."""
    inp, out = tmp_path / "in", tmp_path / "out"
    make_images(inp, 2)
    out.mkdir()
    other = hold_lock(out)
    try:
        p = _torchrun_restore(2, ["restore", "-i", str(inp), "-o", str(out), "--task", "denoise",
                                  "--prior", prior_dir, "--steps", "1", "--quiet"])
    finally:
        other.kill()
        other.wait()
    assert p.returncode != 0
    assert p.stderr.count(f"pid {other.pid}") == 1, p.stderr[-3000:]  # rank 0 says why, once
    assert not list(out.glob("*.png"))


@pytest.mark.slow
def test_a_usage_error_under_torchrun_exits_2_on_every_rank(tmp_path):
    """U6: rank 1 refused and exited first, and torchrun stopped rank 0 (exitcode -15, SIGTERM),
    possibly before its message. Now rank 0 says why once and exits first (torchrun's root cause),
    every rank exits 2. torchrun's own status (1) and ChildFailedError traceback are the launcher's."""
    import re

    missing = tmp_path / "missing"
    p = _torchrun_restore(2, ["restore", "-i", str(missing), "-o", str(tmp_path / "out"), "--task", "denoise",
                              "--quiet"])
    assert p.stderr.count(f"--input {missing}: no such file or folder") == 1, p.stderr[-3000:]
    assert re.findall(r"^\s*exitcode\s*:\s*(-?\d+)", p.stderr, re.M) == ["2", "2"], p.stderr[-3000:]  # the table
    root = p.stderr.split("Root Cause")[1]
    assert re.search(r"rank\s*:\s*0 ", root), p.stderr[-3000:]
    assert "terminated (SIGTERM)" not in p.stderr
