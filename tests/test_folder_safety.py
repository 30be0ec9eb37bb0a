"""What a run reads is never what it writes: folder relations, manifests that change before the
outputs they describe, records of interrupted runs, names a file system gives (reliability battery)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from test_cli import make_images, run, smooth

from nfc_dps.cli import main
from nfc_dps.io import read_image, write_image


def _bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.mark.parametrize("sub, task", [("measurements", "deblur_gaussian"), ("ground_truth", "sr_bicubic")])
def test_simulate_refuses_an_input_inside_its_output_folder(tmp_path, capsys, sub, task):
    photos = tmp_path / "p" / sub
    make_images(photos, 2)
    write_image(photos / "odd.png", np.full((37, 35, 4), 0.5, np.float32))  # RGBA, not a multiple of 4
    before = _bytes(photos)
    params = ["--param", "boundary=circular"] if task.startswith("deblur") else []  # 61 px kernel, 32 px images
    code = run("simulate", "-i", photos, "-o", tmp_path / "p", "--task", task, *params)
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"--input {photos} (folder) lies in {sub}/ of the output folder" in err and "Traceback" not in err
    assert _bytes(photos) == before


def test_restore_refuses_its_own_std_folder_as_input(tmp_path, prior_dir, capsys):
    out = tmp_path / "out"
    make_images(tmp_path / "in", 1)
    assert run("restore", "-i", tmp_path / "in", "-o", out, "--task", "denoise", "--preset", "fast",
               "--samples", "2", prior=prior_dir) == 0
    before = _bytes(out / "std")
    assert run("restore", "-i", out / "std", "-o", out, "--task", "denoise", "--preset", "fast",
               "--samples", "2", prior=prior_dir) == 2
    assert "(folder) lies in std/ of the output folder" in capsys.readouterr().err
    assert _bytes(out / "std") == before


def test_ground_truth_folder_as_output_is_named_as_such(tmp_path, prior_dir, capsys):
    make_images(tmp_path / "in", 1)
    gt = tmp_path / "gt"
    make_images(gt, 1)
    assert run("restore", "-i", tmp_path / "in", "-o", gt, "--gt", gt, "--task", "denoise", prior=prior_dir) == 2
    assert f"--gt {gt} (folder) is the output folder" in capsys.readouterr().err


def test_an_output_folder_inside_the_input_folder_or_above_it_is_fine(tmp_path, prior_dir):
    inp = tmp_path / "in"
    make_images(inp, 1)
    assert run("restore", "-i", inp, "-o", inp / "restored", "--task", "denoise", prior=prior_dir) == 0
    assert (inp / "restored" / "im0.png").is_file()
    assert run("restore", "-i", inp, "-o", tmp_path, "--task", "denoise", prior=prior_dir) == 0  # -o . above -i data
    assert (tmp_path / "im0.png").is_file() and (inp / "im0.png").is_file()
    assert run("simulate", "-i", inp, "-o", tmp_path / "sim_above", "--task", "denoise") == 0
    assert run("restore", "-i", inp / "im0.png", "-o", tmp_path / "x", "--task", "denoise", prior=prior_dir) == 0


def test_simulate_refuses_a_kernel_folder_it_would_write_into(tmp_path, capsys):
    make_images(tmp_path / "in", 1)
    kernels = tmp_path / "sim" / "kernels"
    kernels.mkdir(parents=True)
    np.save(kernels / "im0.npy", np.ones((3, 3)) / 9)
    assert run("simulate", "-i", tmp_path / "in", "-o", tmp_path / "sim", "--task", "deblur_kernel",
               "--param", f"kernel_path={kernels}") == 2
    assert "--param kernel_path" in capsys.readouterr().err and (kernels / "im0.npy").is_file()


class _Killed(BaseException):
    """Stands for kill -9: no handler of the run sees it."""


def test_a_killed_run_of_other_settings_is_never_taken_for_the_earlier_one(tmp_path, prior_dir, monkeypatch):
    from nfc_dps.cli import records, restore

    inp, out = tmp_path / "in", tmp_path / "out"
    make_images(inp, 3)
    args = ("restore", "-i", inp, "-o", out, "--task", "denoise")
    assert run(*args, "--noise-sigma", "0.05", prior=prior_dir) == 0
    first = _bytes(out)
    # the other settings' run: throttled saves never come, and it dies after replacing two outputs
    monkeypatch.setattr(records.RunRecords, "save", lambda self, final=False: None)
    written = []
    real = restore.write_outputs

    def dying(*a, **k):
        if len(written) == 2:
            raise _Killed
        written.append(1)
        return real(*a, **k)

    monkeypatch.setattr(restore, "write_outputs", dying)
    with pytest.raises(_Killed):
        run(*args, "--noise-sigma", "0.2", prior=prior_dir)
    monkeypatch.undo()
    assert run(*args, "--noise-sigma", "0.05", prior=prior_dir) == 0
    again = _bytes(out)
    assert {n: again[n] for n in first if n.endswith(".png")} == {n: b for n, b in first.items() if n.endswith(".png")}


def test_a_rerun_with_fewer_samples_leaves_no_stale_maps(tmp_path, prior_dir):
    inp, out = tmp_path / "in", tmp_path / "out"
    make_images(inp, 1)
    args = ("restore", "-i", inp, "-o", out, "--task", "denoise", "--preset", "fast")
    assert run(*args, "--samples", "3", "--save-samples", prior=prior_dir) == 0
    assert sorted(p.name for p in (out / "samples").iterdir()) == ["im0_0.png", "im0_1.png", "im0_2.png"]
    assert run(*args, "--samples", "2", "--save-samples", prior=prior_dir) == 0
    assert sorted(p.name for p in (out / "samples").iterdir()) == ["im0_0.png", "im0_1.png"]
    assert run(*args, prior=prior_dir) == 0
    assert not list((out / "samples").iterdir()) and not list((out / "std").iterdir())
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["images"]["im0.png"]["outputs"] == ["im0.png"]


def test_a_symlink_loop_in_the_input_is_one_failed_entry(tmp_path, prior_dir, capsys):
    inp = tmp_path / "in"
    make_images(inp, 1)
    (inp / "loop.png").symlink_to(inp / "loop.png")
    (inp / "sub").mkdir()
    (inp / "sub" / "self").symlink_to(inp / "sub" / "self")
    assert run("restore", "-i", inp, "-o", tmp_path / "out", "--task", "denoise", prior=prior_dir) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "FAILED loop.png: symbolic link in a loop" in err
    assert (tmp_path / "out" / "im0.png").is_file()
    assert run("restore", "-i", inp / "loop.png", "-o", tmp_path / "out2", "--task", "denoise", prior=prior_dir) == 2
    err = capsys.readouterr().err
    assert f"--input {inp / 'loop.png'}: no such file" in err and "Traceback" not in err


def test_a_file_name_that_is_not_utf8_is_restored_and_simulated(tmp_path, prior_dir):
    inp = tmp_path / "in"
    make_images(inp, 1)
    latin1 = Path(os.fsdecode(bytes(inp) + b"/caf\xe9.png"))
    shutil.copy(inp / "im0.png", latin1)
    assert run("restore", "-i", inp, "-o", tmp_path / "out", "--task", "denoise", prior=prior_dir) == 0
    assert (tmp_path / "out" / latin1.name).is_file()
    assert "caf\\udce9.png,done" in (tmp_path / "out" / "results.csv").read_text(encoding="utf-8")
    assert run("simulate", "-i", inp, "-o", tmp_path / "sim", "--task", "denoise") == 0
    assert run("restore", "--config", tmp_path / "sim" / "simulation.json", "-o", tmp_path / "out2",
               prior=prior_dir) == 0
    assert sorted(p.name for p in (tmp_path / "out2").glob("*.png")) == sorted([latin1.name, "im0.png"])


def _unreadable(monkeypatch, folder: Path) -> None:
    """``folder`` cannot be listed (as for a user without read permission; the tests may run as root)."""
    real = Path.iterdir

    def iterdir(self):
        if self.resolve() == folder.resolve():
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "iterdir", iterdir)


@pytest.mark.parametrize("which", ["input", "gt"])
def test_an_unreadable_folder_is_a_clear_error_before_any_output(tmp_path, prior_dir, monkeypatch, capsys, which):
    inp, gt = tmp_path / "in", tmp_path / "gt"
    make_images(inp, 1)
    make_images(gt, 1)
    _unreadable(monkeypatch, inp if which == "input" else gt)
    assert run("restore", "-i", inp, "-o", tmp_path / "out", "--task", "denoise", "--gt", gt, prior=prior_dir) == 2
    err = capsys.readouterr().err
    assert f"--{which} {inp if which == 'input' else gt}: cannot read the folder (Permission denied)" in err
    assert not (tmp_path / "out").exists()
    if which == "input":
        assert run("simulate", "-i", inp, "-o", tmp_path / "sim", "--task", "denoise") == 2
        assert "cannot read the folder" in capsys.readouterr().err and not (tmp_path / "sim").exists()


def test_an_interrupted_resimulation_is_never_restored_as_the_earlier_one(tmp_path, prior_dir, monkeypatch, capsys):
    from nfc_dps.cli import simulate

    inp, sim = tmp_path / "in", tmp_path / "sim"
    make_images(inp, 3)
    assert run("simulate", "-i", inp, "-o", sim, "--task", "denoise", "--noise-sigma", "0.01") == 0
    calls = []
    real = simulate.nio.write_image

    def dying(path, *a, **k):
        calls.append(path)
        if len(calls) == 3:
            raise _Killed
        return real(path, *a, **k)

    monkeypatch.setattr(simulate.nio, "write_image", dying)
    with pytest.raises(_Killed):
        run("simulate", "-i", inp, "-o", sim, "--task", "denoise", "--noise-sigma", "0.3")
    monkeypatch.undo()
    code = run("restore", "--config", sim / "simulation.json", "-o", tmp_path / "out", prior=prior_dir)
    err = capsys.readouterr().err
    assert code == 2 and "was interrupted" in err and "rerun simulate" in err
    # rerunning either simulation makes the folder whole again
    assert run("simulate", "-i", inp, "-o", sim, "--task", "denoise", "--noise-sigma", "0.01") == 0
    assert run("restore", "--config", sim / "simulation.json", "-o", tmp_path / "out", prior=prior_dir) == 0
    record = json.loads((sim / "simulation.json").read_text())
    assert "incomplete" not in record and record["simulated_task"]["noise_sigma"] == 0.01


def test_simulate_names_the_entries_it_could_not_use(tmp_path, capsys):
    inp = tmp_path / "in"
    make_images(inp, 1)
    (inp / "notes.txt").write_text("x")
    assert run("simulate", "-i", inp, "-o", tmp_path / "sim", "--task", "denoise") == 1
    assert "FAILED notes.txt: unsupported file type '.txt'" in capsys.readouterr().err


def _unet_prior(folder: Path, channels: int = 3, nan: bool = False) -> str:
    import torch
    from diffusers import UNet2DModel

    torch.manual_seed(0)
    unet = UNet2DModel(sample_size=16, in_channels=channels, out_channels=channels, block_out_channels=(8, 16),
                       norm_num_groups=4, layers_per_block=1,
                       down_block_types=("DownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "UpBlock2D"))
    if nan:
        with torch.no_grad():
            unet.conv_out.weight.fill_(float("nan"))
    unet.save_pretrained(folder)
    (folder / "nfc_dps_prior.json").write_text(json.dumps({"parameterization": "edm"}))
    return str(folder)


@pytest.mark.parametrize("case", ["prior_weight=0", "sigma_min=-1", "ddrm with SR", "gray prior, RGB images", "NaN prior"])
def test_setup_errors_are_one_usage_error_before_any_image(tmp_path, prior_dir, monkeypatch, capsys, case):
    from nfc_dps.cli import preflight

    make_images(tmp_path / "in", 2)
    prior, extra = prior_dir, []
    if case in ("prior_weight=0", "sigma_min=-1"):
        extra = ["--task", "denoise", "--set", case]
    elif case == "ddrm with SR":
        extra = ["--task", "sr_bicubic", "--method", "ddrm"]
        monkeypatch.setattr(preflight, "open_prior", lambda *a: pytest.fail("the prior loaded"))
    else:
        extra = ["--task", "denoise"]
        prior = _unet_prior(tmp_path / "p", channels=1 if case.startswith("gray") else 3, nan=case == "NaN prior")
    code = run("restore", "-i", tmp_path / "in", "-o", tmp_path / "out", *extra, prior=prior)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "FAILED" not in err and "Traceback" not in err and err.count("error:") == 1, err
    needle = {"prior_weight=0": "prior_weight must be finite and > 0", "sigma_min=-1": "sigma_min must be a finite number >= 0",
              "ddrm with SR": "--method ddrm: DDRM needs a diagonalisable operator",
              "gray prior, RGB images": "the prior models 1-channel images but im0.png has 3 channel(s)",
              "NaN prior": "the prior returns NaN/Inf"}[case]
    assert needle in err
    assert not list((tmp_path / "out").glob("*.png")) if (tmp_path / "out").exists() else True


@pytest.mark.parametrize("bad", [["--seed", "-1"], ["--image-names", "astronaut,nosuchimage"],
                                 ["--protocol", "paper", "--image-names", ""]])
def test_a_refused_bench_run_leaves_its_folder_usable(tmp_path, capsys, bad):
    from nfc_dps.bench.cli import main as bench

    out = tmp_path / "bench"
    args = ["--protocol", "local", "--out", str(out), "--size", "16", "--zoom", "1", "--image-names", "astronaut",
            "--tasks", "deblur_gaussian", "--methods", "tv", "--threads", "1", "--device", "cpu", "--no-plots"]
    assert bench(args + bad) == 2
    capsys.readouterr()
    assert not (out / "config.json").exists()
    assert bench(args) == 0, capsys.readouterr()
    assert (out / "results.csv").is_file()


def test_sigterm_stops_like_ctrl_c_with_a_message_and_records(tmp_path, prior_dir, monkeypatch, capsys):
    import signal

    from nfc_dps.cli import restore

    inp, out = tmp_path / "in", tmp_path / "out"
    make_images(inp, 3)
    real, calls = restore.write_outputs, []

    def terminated_at_the_second(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*a, **k)

    monkeypatch.setattr(restore, "write_outputs", terminated_at_the_second)
    args = ("restore", "-i", inp, "-o", out, "--task", "denoise")
    assert run(*args, prior=prior_dir) == 143
    assert "terminated (SIGTERM); rerun the same command to resume" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert list(json.loads((out / "manifest.json").read_text())["images"]) == ["im0.png"]
    monkeypatch.undo()
    assert run(*args, prior=prior_dir) == 0
    assert json.loads((out / "summary.json").read_text())["counts"]["skipped_done_before"] == 1


def test_a_refused_run_leaves_no_empty_output_folder(tmp_path, capsys):
    make_images(tmp_path / "in", 1)
    out = tmp_path / "new" / "out"
    assert run("restore", "-i", tmp_path / "in", "-o", out, "--task", "denoise", "--prior", tmp_path / "noprior") == 2
    assert "cannot load" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()
    existing = tmp_path / "existing"
    existing.mkdir()
    assert run("restore", "-i", tmp_path / "in", "-o", existing, "--task", "denoise", "--prior", tmp_path / "noprior") == 2
    assert existing.is_dir()  # a folder the user had stays


def test_restore_keeps_the_samples_in_memory_only_when_it_writes_them(tmp_path, prior_dir, monkeypatch):
    import nfc_dps.api

    seen, real = [], nfc_dps.api.restore

    def spy(*a, **k):
        seen.append(k.get("keep_samples", True))
        return real(*a, **k)

    monkeypatch.setattr(nfc_dps.api, "restore", spy)
    make_images(tmp_path / "in", 1)
    args = ("restore", "-i", tmp_path / "in", "--task", "denoise", "--preset", "fast", "--samples", "2")
    assert run(*args, "-o", tmp_path / "a", prior=prior_dir) == 0
    assert run(*args, "--save-samples", "-o", tmp_path / "b", prior=prior_dir) == 0
    assert seen == [False, True]
    assert (tmp_path / "a" / "std" / "im0.png").is_file() and (tmp_path / "b" / "samples" / "im0_1.png").is_file()


def test_inputs_restored_with_a_caveat_are_noted(tmp_path, prior_dir, capsys):
    from PIL import Image

    inp = tmp_path / "in"
    inp.mkdir()
    pages = [Image.fromarray((smooth(phase=i) * 255).astype(np.uint8)) for i in range(3)]
    pages[0].save(inp / "stack.tif", save_all=True, append_images=pages[1:])
    write_image(inp / "tiny.png", smooth(8, 8))
    code = main(["restore", "-i", str(inp), "-o", str(tmp_path / "out"), "--task", "deblur_kernel", "--param",
                 f"kernel_path={_kernel(tmp_path, 11)}", "--param", "boundary=circular", "--prior", prior_dir,
                 "--steps", "2"])  # notes: not under -q
    err = capsys.readouterr().err
    assert code == 0, err
    assert "note stack.tif: only the first of its 3 pages/frames is restored" in err
    assert "note tiny.png: the image is 8x8 pixels" in err and "the blur kernel (11x11) is larger than the image (8x8)" in err
    assert read_image(tmp_path / "out" / "stack.png")[0].shape == (32, 32, 3)


def _kernel(folder: Path, size: int) -> Path:
    k = np.ones((size, size)) / size**2
    np.save(folder / "k.npy", k)
    return folder / "k.npy"


@pytest.mark.slow
def test_train_prior_takes_non_utf8_names_and_a_refused_run_leaves_no_work_folder(tmp_path, capsys):
    images = tmp_path / "images"
    make_images(images, 2)
    shutil.copy(images / "im0.png", Path(os.fsdecode(bytes(images) + b"/caf\xe9.png")))
    tiny = ["--arch", "unet", "--widths", "8,16", "--layers", "1", "--crop", "16", "--batch", "2", "--threads", "1",
            "--quiet"]
    assert main(["train-prior", "--workdir", str(tmp_path / "work"), "--images", str(images), "--steps", "1",
                 *tiny]) == 0, capsys.readouterr().err
    assert (tmp_path / "work" / "state.pt").is_file()
    assert main(["train-prior", "--workdir", str(tmp_path / "new" / "work"), "--images", str(tmp_path / "none"),
                 "--steps", "1", *tiny]) == 2
    assert "--images" in capsys.readouterr().err and not (tmp_path / "new" / "work").exists()


def test_calibrate_demo_and_prior_report_refuse_setups_once_without_traceback(tmp_path, prior_dir, monkeypatch, capsys):
    from nfc_dps.cli import preflight

    clean = tmp_path / "clean"
    make_images(clean, 9)
    base = ("calibrate", "--images", clean, "--samples", "2", "--preset", "fast", "--out", tmp_path / "c.json")
    monkeypatch.setattr(preflight, "open_prior", lambda *a: pytest.fail("the prior loaded"))
    assert run(*base, "--task", "sr_bicubic", "--method", "ddrm", prior=prior_dir) == 2
    assert "--method ddrm: DDRM needs a diagonalisable operator" in capsys.readouterr().err
    monkeypatch.undo()
    gray = _unet_prior(tmp_path / "gray", channels=1)
    assert run(*base, "--task", "denoise", prior=gray) == 2
    assert "the prior models 1-channel images" in capsys.readouterr().err
    _unreadable(monkeypatch, clean)
    assert run(*base, "--task", "denoise", prior=prior_dir) == 2
    assert f"--images {clean}: cannot read the folder" in capsys.readouterr().err
    monkeypatch.undo()
    assert run("demo", "-o", tmp_path / "demo", "--size", "32", prior=gray) == 2
    err = capsys.readouterr().err
    assert "the prior models 1-channel images" in err and "Traceback" not in err and not (tmp_path / "demo").exists()
    assert main(["prior-report", "--prior", prior_dir, "--timing-runs", "0", "--out", str(tmp_path / "r.json")]) == 2
    assert "--timing-runs must be >= 1" in capsys.readouterr().err


def test_stale_file_cleanup_never_removes_an_output_of_this_run(tmp_path):
    from nfc_dps.cli.common import Log
    from nfc_dps.cli.records import RunRecords

    (tmp_path / "a_lower.png").write_bytes(b"this run's output for the input a_lower.png")
    (tmp_path / "std").mkdir()
    (tmp_path / "std" / "a.npy").write_bytes(b"stale")
    records = RunRecords(tmp_path, Log(True), {}, None, overwrite=False)
    records.remove_unlisted(["a.png", "a_lower.png", "std/a.npy"], ["a.png"], keep={"a.png", "a_lower.png"})
    assert (tmp_path / "a_lower.png").is_file() and not (tmp_path / "std" / "a.npy").exists()


def test_an_animated_png_is_noted(tmp_path, prior_dir, capsys):
    from PIL import Image

    inp = tmp_path / "in"
    inp.mkdir()
    frames = [Image.fromarray((smooth(phase=i) * 255).astype(np.uint8)) for i in range(2)]
    frames[0].save(inp / "anim.png", save_all=True, append_images=frames[1:])
    assert main(["restore", "-i", str(inp), "-o", str(tmp_path / "out"), "--task", "denoise", "--prior", prior_dir,
                 "--steps", "2"]) == 0
    assert "note anim.png: only the first of its 2 pages/frames is restored" in capsys.readouterr().err


@pytest.mark.slow
def test_train_prior_names_a_symlink_loop_and_trains_on_the_rest(tmp_path, capsys):
    images = tmp_path / "images"
    make_images(images, 2)
    (images / "loop.png").symlink_to(images / "loop.png")
    tiny = ["--widths", "8,16", "--crop", "16", "--batch", "2", "--threads", "1", "--quiet"]
    assert main(["train-prior", "--workdir", str(tmp_path / "work"), "--images", str(images), "--steps", "1",
                 *tiny]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "loop.png" in err and (tmp_path / "work" / "state.pt").is_file()


def test_simulate_stops_on_a_full_disk_and_records_what_it_finished(tmp_path, monkeypatch, capsys):
    """A full disk stops simulate at the image it hits (every later one would fail alike); the
    simulation record lists the images finished before it, and the error says what to do."""
    from test_cli import _full_disk

    make_images(tmp_path / "in", 3)
    out = tmp_path / "sim"
    _full_disk(monkeypatch, "im1.png")
    assert run("simulate", "-i", tmp_path / "in", "-o", out, "--task", "denoise") == 2
    err = capsys.readouterr().err
    assert "No space left on device" in err and "stopped after 1 of 3 image(s)" in err and "Traceback" not in err
    record = json.loads((out / "simulation.json").read_text())
    assert [r["name"] for r in record["images"]] == ["im0.png"]


def test_demo_names_the_task_on_a_nan_restoration_or_a_full_disk(tmp_path, prior_dir, monkeypatch, capsys):
    from test_cli import _full_disk

    from nfc_dps.cli import demo

    with monkeypatch.context() as m:
        m.setattr(demo, "restore", lambda *a, **k: (_ for _ in ()).throw(FloatingPointError("NaN/Inf in the output")))
        assert run("demo", "-o", tmp_path / "demo", "--size", "32", prior=prior_dir) == 2
    err = capsys.readouterr().err
    assert "demo sr_bicubic: NaN/Inf in the output" in err and "Traceback" not in err
    _full_disk(monkeypatch, "grid.png")
    assert run("demo", "-o", tmp_path / "demo", "--size", "32", "--tasks", "sr_bicubic", prior=prior_dir) == 2
    err = capsys.readouterr().err
    assert "grid.png: No space left on device" in err and "Traceback" not in err


# ---------------------------------------------------------------- files no nfc-dps run wrote (N1)


def _tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (relative path -> bytes)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_restore_refuses_the_folder_of_the_original_photos(tmp_path, prior_dir, capsys):
    photos, inp = tmp_path / "photos", tmp_path / "in"
    make_images(photos, 2)
    (photos / "notes.txt").write_text("the originals")
    make_images(inp, 2, c=1)  # the measurements, named as the originals
    before = _tree(photos)
    code = run("restore", "-i", inp, "-o", photos, "--task", "denoise", prior=prior_dir)
    err = capsys.readouterr().err
    assert code == 2, err
    assert str(photos / "im0.png") in err and "--overwrite" in err and "Traceback" not in err
    assert _tree(photos) == before  # nothing replaced, nothing added (no records, no lock file)
    assert run("restore", "-i", inp, "-o", photos, "--task", "denoise", "--overwrite", prior=prior_dir) == 0
    assert _tree(photos)["im0.png"] != before["im0.png"] and _tree(photos)["notes.txt"] == before["notes.txt"]


def test_restore_refuses_to_replace_a_users_results_csv(tmp_path, prior_dir, capsys):
    make_images(tmp_path / "in", 1)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "results.csv").write_text("photo,rating\nim0.png,5\n")
    before = _tree(mine)
    assert run("restore", "-i", tmp_path / "in", "-o", mine, "--task", "denoise", prior=prior_dir) == 2
    err = capsys.readouterr().err
    assert str(mine / "results.csv") in err and "Traceback" not in err
    assert _tree(mine) == before


def test_a_file_added_to_an_output_folder_is_not_replaced_by_a_rerun(tmp_path, prior_dir, capsys):
    inp, out = tmp_path / "in", tmp_path / "out"
    make_images(inp, 1)
    argv = ("restore", "-i", inp, "-o", out, "--task", "denoise")
    assert run(*argv, prior=prior_dir) == 0
    write_image(out / "holiday.png", smooth(phase=7))  # the user's own picture, put there later
    ours = (out / "holiday.png").read_bytes()
    write_image(inp / "holiday.png", smooth(phase=2))
    assert run(*argv, prior=prior_dir) == 2
    assert str(out / "holiday.png") in capsys.readouterr().err
    assert (out / "holiday.png").read_bytes() == ours
    assert run(*argv, prior=prior_dir, steps=3) == 2  # other settings: still not replaced
    assert (out / "holiday.png").read_bytes() == ours


def test_simulate_refuses_to_replace_files_it_did_not_write(tmp_path, capsys):
    clean, data = tmp_path / "clean", tmp_path / "data"
    make_images(clean, 2)
    make_images(data / "ground_truth", 1, c=1)  # the user's own ground_truth/im0.png
    before = _tree(data)
    assert run("simulate", "-i", clean, "-o", data, "--task", "denoise") == 2
    err = capsys.readouterr().err
    assert str(data / "ground_truth" / "im0.png") in err and "--overwrite" in err and "Traceback" not in err
    assert _tree(data) == before
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "simulation.json").write_text('{"my": "notes"}')
    assert run("simulate", "-i", clean, "-o", tmp_path / "mine", "--task", "denoise") == 2
    assert str(tmp_path / "mine" / "simulation.json") in capsys.readouterr().err
    assert run("simulate", "-i", clean, "-o", data, "--task", "denoise", "--overwrite") == 0
    assert _tree(data)["ground_truth/im0.png"] != before["ground_truth/im0.png"]
    assert run("simulate", "-i", clean, "-o", data, "--task", "denoise", "--noise-sigma", "0.2") == 0  # its own


def test_the_outputs_of_a_run_killed_before_its_records_stay_its_own(tmp_path, prior_dir, monkeypatch):
    """A run killed after writing outputs that no manifest entry or simulation record lists yet:
    the rerun replaces them (they are its own), as before."""
    from nfc_dps.cli import restore, simulate

    inp, out = tmp_path / "in", tmp_path / "out"
    make_images(inp, 3)
    real = restore.write_outputs

    def dying(*a, **k):
        real(*a, **k)
        raise _Killed

    monkeypatch.setattr(restore, "write_outputs", dying)
    argv = ("restore", "-i", inp, "-o", out, "--task", "denoise", "--preset", "fast", "--samples", "2")
    with pytest.raises(_Killed):
        run(*argv, prior=prior_dir)
    monkeypatch.undo()
    assert (out / "im0.png").is_file() and (out / "std" / "im0.npy").is_file()
    assert run(*argv, prior=prior_dir) == 0
    assert [r["status"] for r in _rows(out)] == ["done"] * 3
    assert "unfinished" not in json.loads((out / "manifest.json").read_text())

    calls, write = [], simulate.nio.write_image

    def dying_write(path, *a, **k):
        calls.append(path)
        if len(calls) == 3:
            raise _Killed
        return write(path, *a, **k)

    monkeypatch.setattr(simulate.nio, "write_image", dying_write)
    with pytest.raises(_Killed):
        run("simulate", "-i", inp, "-o", tmp_path / "sim", "--task", "denoise")
    monkeypatch.undo()
    assert (tmp_path / "sim" / "measurements" / "im0.png").is_file()
    assert run("simulate", "-i", inp, "-o", tmp_path / "sim", "--task", "denoise") == 0


def _rows(out: Path) -> list[dict]:
    import csv

    with open(out / "results.csv") as f:
        return list(csv.DictReader(f))


# ---------------------------------------------------------------- interval names (N3)


def _calibration_file(tmp_path: Path, prior: str) -> Path:
    from nfc_dps.conformal import DEFAULT_EPS, Calibration, prior_fingerprint, sampler_fields
    from nfc_dps.priors.default import load_prior
    from nfc_dps.samplers import get_config

    cal = Calibration(q=1.7, coverage=0.9, rule="pooled", eps=DEFAULT_EPS, n_images=12, num_samples=2, method="nfc",
                      preset="fast", sampler=sampler_fields(get_config("nfc", "fast", num_levels=2)),
                      prior={"fingerprint": prior_fingerprint(load_prior(prior))},
                      task={"task": "denoise", "noise_sigma": 0.025})
    return cal.save(tmp_path / "cal.json")


def test_interval_names_never_replace_an_earlier_runs_restoration(tmp_path, prior_dir, capsys):
    inp, out = tmp_path / "in", tmp_path / "out"
    inp.mkdir()
    write_image(inp / "a_lower.png", smooth())
    write_image(inp / "a.png", smooth(phase=1))
    base = ("restore", "-o", out, "--task", "denoise", "--preset", "fast", "--samples", "2")
    assert run(*base, "-i", inp / "a_lower.png", prior=prior_dir) == 0
    restored = (out / "a_lower.png").read_bytes()
    cal = ("--calibration", _calibration_file(tmp_path, prior_dir))
    for extra in ((), ("--overwrite",)):
        assert run(*base, "-i", inp / "a.png", *cal, *extra, prior=prior_dir) == 2
        err = capsys.readouterr().err
        assert "a_lower.png" in err and "a.png" in err and "manifest.json" in err and "Traceback" not in err
        assert "would overwrite the restoration of a_lower.png" in err
        assert (out / "a_lower.png").read_bytes() == restored and not (out / "a.png").exists()
    listed = [o for e in json.loads((out / "manifest.json").read_text())["images"].values() for o in e["outputs"]]
    assert listed.count("a_lower.png") == 1


def test_a_restoration_never_replaces_an_earlier_runs_interval(tmp_path, prior_dir, capsys):
    inp, out = tmp_path / "in", tmp_path / "out"
    inp.mkdir()
    write_image(inp / "a.png", smooth())
    base = ("restore", "-o", out, "--task", "denoise", "--preset", "fast", "--samples", "2")
    cal = ("--calibration", _calibration_file(tmp_path, prior_dir))
    assert run(*base, "-i", inp / "a.png", *cal, prior=prior_dir) == 0
    lower = (out / "a_lower.png").read_bytes()
    write_image(inp / "a_lower.png", smooth(phase=1))
    assert run(*base, "-i", inp / "a_lower.png", prior=prior_dir) == 2
    err = capsys.readouterr().err
    assert "would overwrite the lower interval bound of a.png" in err and "Traceback" not in err
    assert (out / "a_lower.png").read_bytes() == lower
    # a.png redone without --calibration in the same run frees the name: no refusal, listed once
    assert run(*base, "-i", inp, prior=prior_dir) == 0
    images = json.loads((out / "manifest.json").read_text())["images"]
    assert images["a.png"]["outputs"][0] == "a.png" and "a_lower.png" not in images["a.png"]["outputs"]
    assert images["a_lower.png"]["outputs"][0] == "a_lower.png" and not (out / "a_upper.png").exists()


def test_a_rerun_replaces_the_files_of_an_image_stopped_half_written(tmp_path, prior_dir, monkeypatch):
    """An image whose restoration failed to write after its std map (a write error: the run goes
    on and ends), and a simulation stopped by a full disk after an image's truth: the rerun
    replaces those files (they are nfc-dps's), as before."""
    import errno
    import sys

    import nfc_dps.io as nio

    inp, out, sim = tmp_path / "in", tmp_path / "out", tmp_path / "sim"
    make_images(inp, 3)
    real = nio.atomic_write_bytes

    def failing_at(target: Path, code: int):
        def write(path, data):
            if Path(path) == target:
                raise OSError(code, os.strerror(code), str(path))
            return real(path, data)
        return write

    restore = ("restore", "-i", inp, "-o", out, "--task", "denoise", "--preset", "fast", "--samples", "2",
               "--prior", prior_dir)
    simulate = ("simulate", "-i", inp, "-o", sim, "--task", "denoise")
    for target, code, exit_code, written, args in (
            (out / "im1.png", errno.EIO, 1, out / "std" / "im1.npy", restore),
            (sim / "measurements" / "im1.png", errno.ENOSPC, 2, sim / "ground_truth" / "im1.png", simulate)):
        with monkeypatch.context() as m:
            m.setattr(nio, "atomic_write_bytes", failing_at(target, code))
            m.setattr(sys.modules[real.__module__], "atomic_write_bytes", failing_at(target, code))
            assert run(*args) == exit_code
        assert written.is_file() and not target.exists()
        assert run(*args) == 0
