"""train-prior: end to end on tiny folders, export -> load_prior, resume, bad input, the two designs.

Networks are tiny (widths 8,16, crops of 16 px, a few steps): these tests check wiring,
determinism and error handling, not quality.
"""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import nfc_dps
from nfc_dps import cli
from nfc_dps import io as nio
from nfc_dps.priors import EDMDenoiser, TiledPrior
from nfc_dps.priors.archs import build_unet
from nfc_dps.priors.diffusers_prior import _UNetCall
from nfc_dps.training import TrainConfig, TrainingError, train_prior
from nfc_dps.training import loop as train_loop
from nfc_dps.training.data import CropSampler, DeadLeaves
from nfc_dps.training.state import check_fingerprint, fingerprint, legacy_fingerprint, read_state

pytestmark = pytest.mark.slow  # trains small networks

TINY = ["--widths", "8,16", "--crop", "16", "--batch", "4", "--threads", "1", "--eval-crop", "32", "-q"]


def _smooth(rng: np.random.Generator, h: int, w: int, c: int) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w] / max(h, w)
    base = 0.5 + 0.3 * np.sin(6 * x + rng.uniform(0, 6)) * np.cos(4 * y)
    img = base[..., None] + 0.05 * rng.standard_normal((h, w, c))
    return np.clip(img, 0, 1)[..., 0] if c == 1 else np.clip(img, 0, 1)


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    """Gray 16-bit and RGB 8-bit images (one in a subfolder), a corrupt PNG, a too-small image, a text file."""
    d = tmp_path / "images"
    (d / "sub").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(3):
        nio.write_image(d / f"gray{i}.png", _smooth(rng, 40 + 8 * i, 48, 1), bit_depth=16)
    for i in range(3):
        nio.write_image(d / "sub" / f"rgb{i}.png", _smooth(rng, 48, 56, 3))
    nio.write_image(d / "tiny.png", _smooth(rng, 10, 12, 1))
    (d / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    (d / "notes.txt").write_text("not an image")
    return d


def _cfg(workdir: Path, images: Path, **kw) -> TrainConfig:
    base = dict(workdir=workdir, images=images, widths=(8, 16), crop=16, batch=4, log_every=2, progress=False,
                eval_crop=32)
    return TrainConfig(**{**base, **kw})


def _quiet(msg: str) -> None:
    pass


def _same_state(a: Path, b: Path) -> None:
    sa, sb = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    assert sa["step"] == sb["step"]
    for key in ("model", "ema"):
        for k in sa[key]:
            assert torch.equal(sa[key][k], sb[key][k]), f"{key}.{k} differs"
    for pa, pb in zip(sa["opt"]["state"].values(), sb["opt"]["state"].values()):
        assert torch.equal(pa["exp_avg"], pb["exp_avg"]) and torch.equal(pa["exp_avg_sq"], pb["exp_avg_sq"])
    assert torch.equal(sa["rng"], sb["rng"]) and torch.equal(sa["torch_rng"], sb["torch_rng"])
    assert sa["opt"]["param_groups"] == sb["opt"]["param_groups"]


def _resume(cfg: TrainConfig, monkeypatch, from_step: int) -> None:
    """Run ``cfg`` on a work folder saved at ``from_step`` and check that it resumed there: it says
    so and draws only the batches of the steps left (a run that ignored the state and trained from
    step 0 would end in the same state, training being deterministic)."""
    real_batch, calls, lines = CropSampler.batch, [], []

    def counting_batch(self, n, gen):
        calls.append(n)
        return real_batch(self, n, gen)

    monkeypatch.setattr(CropSampler, "batch", counting_batch)
    try:
        res = train_prior(cfg, log=lines.append)
    finally:
        monkeypatch.setattr(CropSampler, "batch", real_batch)
    assert any(line.startswith("resumed from") and line.endswith(f"at step {from_step}") for line in lines), lines
    assert len(calls) == res.step - from_step


def test_train_prior_cli_end_to_end(folder: Path, tmp_path: Path, capsys) -> None:
    wd, out = tmp_path / "work", tmp_path / "prior"
    rc = cli.main(["train-prior", "--workdir", str(wd), "--images", str(folder), "--steps", "4", "--save-every", "2",
                   "--log-every", "2", "--export", str(out)] + TINY)
    err = capsys.readouterr().err
    assert rc == 0, err
    # unreadable and too-small files are skipped and named
    assert "broken.png" in err and "tiny.png" in err and "smaller than the 16x16 crop" in err
    cfg = json.loads((wd / "train_config.json").read_text())
    assert sorted(Path(s["file"]).name for s in cfg["skipped"]) == ["broken.png", "tiny.png"]
    assert len(cfg["train_images"]) + len(cfg["heldout_images"]) == 6 and cfg["heldout_images"]
    assert cfg["config"]["channels"] == 3  # RGB present: gray images are replicated
    st = torch.load(wd / "state.pt", weights_only=True)
    assert st["step"] == 4 and set(st) >= {"model", "ema", "opt", "step", "rng", "torch_rng", "args", "config"}
    assert [r.split(",")[0] for r in (wd / "loss.csv").read_text().split()[1:]] == ["2", "4"]
    held = (wd / "heldout.csv").read_text().splitlines()
    assert held[0].startswith("step,psnr_0.05,psnr_0.1,psnr_0.2") and len(held) == 3
    assert (wd / "loss.png").is_file()
    prior = nfc_dps.load_prior(out, precision="float32")
    assert isinstance(prior, TiledPrior) and prior.tile == 16 and prior.channels == 3
    x = torch.rand(1, 3, 24, 40) * 2 - 1
    y = prior(x + 0.2 * torch.randn_like(x), 0.2)
    assert y.shape == x.shape and torch.isfinite(y).all()


def test_gray_folder_gives_a_one_channel_prior(folder: Path, tmp_path: Path) -> None:
    gray = tmp_path / "gray"
    gray.mkdir()
    for p in folder.glob("gray*.png"):
        (gray / p.name).write_bytes(p.read_bytes())
    res = train_prior(_cfg(tmp_path / "w", gray, steps=2, export=tmp_path / "p", holdout=0.3), log=_quiet)
    prior = nfc_dps.load_prior(tmp_path / "p", precision="float32")
    assert prior.channels == 1 and res.step == 2
    assert res.heldout is not None and all(np.isfinite(v) for v in res.heldout["mean"].values())


def test_resume_equals_uninterrupted(folder: Path, tmp_path: Path, monkeypatch) -> None:
    # small, fast-refreshing dead leaves so the resumed run must rebuild refreshed slots
    monkeypatch.setattr(train_loop, "DeadLeaves", functools.partial(DeadLeaves, count=2, size=32, refresh_every=2))
    kw = dict(dead_leaves=0.3, save_every=100)
    train_prior(_cfg(tmp_path / "a", folder, steps=7, **kw), log=_quiet)
    train_prior(_cfg(tmp_path / "b", folder, steps=3, **kw), log=_quiet)
    _resume(_cfg(tmp_path / "b", folder, steps=7, **kw), monkeypatch, from_step=3)
    _same_state(tmp_path / "a" / "state.pt", tmp_path / "b" / "state.pt")


class _Killed(BaseException):
    """Stands for SIGKILL: not an Exception nor a KeyboardInterrupt, so nothing is saved on the way out."""


def test_killed_run_reruns_from_its_last_save(folder: Path, tmp_path: Path, monkeypatch) -> None:
    wd = tmp_path / "killed"
    real_batch, calls = CropSampler.batch, []

    def dying_batch(self, n, gen):
        calls.append(n)
        if len(calls) == 6:  # while computing step 6: steps 1-5 are logged, step 4 was the last save
            raise _Killed()
        return real_batch(self, n, gen)

    monkeypatch.setattr(CropSampler, "batch", dying_batch)
    with pytest.raises(_Killed):
        train_prior(_cfg(wd, folder, steps=100, save_every=2, log_every=1), log=_quiet)
    monkeypatch.setattr(CropSampler, "batch", real_batch)
    assert torch.load(wd / "state.pt", weights_only=True)["step"] == 4
    assert not list(wd.glob(".*tmp"))  # atomic saves leave no temporary file behind
    _resume(_cfg(wd, folder, steps=7, save_every=2, log_every=1), monkeypatch, from_step=4)
    train_prior(_cfg(tmp_path / "straight", folder, steps=7, save_every=2, log_every=1), log=_quiet)
    _same_state(wd / "state.pt", tmp_path / "straight" / "state.pt")
    steps = [int(r.split(",")[0]) for r in (wd / "loss.csv").read_text().split()[1:]]
    assert steps == list(range(1, 8))  # the row of step 5 logged after the last save is not repeated


def test_bad_inputs_are_clear_errors(folder: Path, tmp_path: Path, capsys) -> None:
    empty = tmp_path / "empty"
    (empty / "sub").mkdir(parents=True)
    (empty / "readme.txt").write_text("x")
    assert cli.main(["train-prior", "--workdir", str(tmp_path / "w"), "--images", str(empty), "--steps", "1"] + TINY) == 2
    assert "no image files found" in capsys.readouterr().err
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "a.png").write_bytes(b"garbage")
    with pytest.raises(TrainingError, match=r"a\.png"):
        train_prior(_cfg(tmp_path / "w2", bad, steps=1), log=_quiet)
    with pytest.raises(TrainingError, match="no training image of at least 64x64"):
        train_prior(_cfg(tmp_path / "w3", folder, steps=1, crop=64), log=_quiet)
    with pytest.raises(TrainingError, match="budget"):
        train_prior(_cfg(tmp_path / "w4", folder), log=_quiet)
    assert cli.main(["train-prior", "--workdir", str(tmp_path / "w5"), "--channels", "2", "--steps", "1"]) == 2


def test_mismatched_workdir_names_the_keys(folder: Path, tmp_path: Path, capsys) -> None:
    wd = tmp_path / "w"
    train_prior(_cfg(wd, folder, steps=2), log=_quiet)
    assert cli.main(["train-prior", "--workdir", str(wd), "--images", str(folder), "--steps", "3",
                     "--arch", "unet-pixelnorm"] + TINY) == 2
    assert "arch: 'unet' in the work folder, 'unet-pixelnorm' now" in capsys.readouterr().err
    other = tmp_path / "other"
    other.mkdir()
    for p in (folder / "sub").glob("*.png"):
        (other / p.name).write_bytes(p.read_bytes())
    with pytest.raises(TrainingError, match=r"data\.source"):
        train_prior(_cfg(wd, other, steps=3), log=_quiet)
    with pytest.raises(TrainingError, match="channels: 3 in the work folder, 1 now"):
        train_prior(_cfg(wd, folder, steps=3, channels=1), log=_quiet)
    assert torch.load(wd / "state.pt", weights_only=True)["step"] == 2  # nothing was mixed in


def test_earlier_state_format_is_converted(tmp_path: Path) -> None:
    """A state.pt of the earlier scripts/train_prior.py (numpy RNG state, argparse values with Paths)."""
    path = tmp_path / "state.pt"
    args = vars(argparse.Namespace(workdir=tmp_path, crop=48, batch=32, lr=2e-4, export=tmp_path / "e"))
    torch.save({"model": {}, "ema": {}, "opt": {}, "step": 7, "rng": np.random.default_rng(0).bit_generator.state,
                "torch_rng": torch.get_rng_state(), "args": args}, path)
    st = read_state(path)
    assert st["step"] == 7 and st["rng"] is None and st["legacy"]
    assert st["config"] == legacy_fingerprint(args)
    assert st["config"] == fingerprint("unet", (48, 96, 192), 1, 3, 48, "builtin", 0.25, (1.0, 0.75, 0.5), None)
    with pytest.raises(TrainingError, match="crop: 48 in the work folder, 64 now"):
        check_fingerprint(tmp_path, st["config"], {**st["config"], "crop": 64})
    path.write_bytes(b"torn")
    with pytest.raises(TrainingError, match="cannot read the training state"):
        read_state(path)


class _Payload:
    """A pickle that runs code when unpickled: it writes the file it names."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "ran"))


def test_a_state_that_pickles_code_is_refused_and_never_run(folder: Path, tmp_path: Path) -> None:
    """state.pt needing the full unpickler is refused, naming it, before anything in it runs."""
    wd = tmp_path / "w"
    wd.mkdir()
    marker = tmp_path / "payload_ran"
    torch.save({"model": {}, "ema": {}, "opt": {}, "step": 1, "evil": _Payload(marker)}, wd / "state.pt")
    with pytest.raises(TrainingError, match=r"state\.pt: refused.*never unpickles more than weights"):
        read_state(wd / "state.pt")
    with pytest.raises(TrainingError, match=r"state\.pt: refused"):
        train_prior(_cfg(wd, folder, steps=2), log=_quiet)
    assert not marker.exists()


def test_init_from_warm_starts_and_checks_the_network(folder: Path, tmp_path: Path) -> None:
    train_prior(_cfg(tmp_path / "a", folder, steps=2, export=tmp_path / "pa"), log=_quiet)
    train_prior(_cfg(tmp_path / "b", folder, steps=0, export=tmp_path / "pb", init_from=tmp_path / "pa",
                     widths=None, crop=None), log=_quiet)
    a = nfc_dps.load_prior(tmp_path / "pa", precision="float32").state_dict()
    b = nfc_dps.load_prior(tmp_path / "pb", precision="float32").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(TrainingError, match="widths"):
        train_prior(_cfg(tmp_path / "c", folder, steps=1, init_from=tmp_path / "pa", widths=(8, 8)), log=_quiet)


def test_crop_sampler_crops_are_windows_under_the_8_symmetries() -> None:
    # pixel values encode their position: channel 0 = row / 100, 1 = column / 100, 2 = image / 10
    images = []
    for k, (h, w) in enumerate(((20, 30), (17, 17))):
        yy, xx = np.mgrid[0:h, 0:w]
        images.append(np.stack([yy / 100, xx / 100, np.full((h, w), k / 10)], axis=2).astype(np.float32))
    sampler = CropSampler(images, 8, "cpu")
    crops = ((sampler.batch(200, torch.Generator().manual_seed(0)) + 1) / 2).numpy()
    again = ((sampler.batch(200, torch.Generator().manual_seed(0)) + 1) / 2).numpy()
    assert np.array_equal(crops, again)
    i, j = np.mgrid[0:8, 0:8]
    maps = [(i, j), (j, 7 - i), (7 - i, 7 - j), (7 - j, i), (i, 7 - j), (7 - j, 7 - i), (7 - i, j), (j, i)]
    seen, per_image, origins = set(), [0, 0], [set(), set()]
    for c in crops:
        k = int(round(c[2, 0, 0] * 10))
        ys, xs = np.rint(c[0] * 100).astype(int), np.rint(c[1] * 100).astype(int)
        y0, x0 = ys.min(), xs.min()
        assert np.all(np.rint(c[2] * 10) == k) and y0 + 8 <= images[k].shape[0] and x0 + 8 <= images[k].shape[1]
        match = [m for m, (a, b) in enumerate(maps) if np.array_equal(ys - y0, a) and np.array_equal(xs - x0, b)]
        assert match, "a crop is not a window of a pool image under a flip/rotation"
        seen.add(match[0])
        per_image[k] += 1
        origins[k].add((y0, x0))
    assert seen == set(range(8))
    assert per_image[0] > per_image[1] > 0  # drawn in proportion to the image's area (600 vs 289 pixels)
    # the windows move over the whole image: corners reached, many distinct origins (13 x 23 possible)
    ys, xs = zip(*origins[0])
    assert (min(ys), max(ys), min(xs), max(xs)) == (0, 20 - 8, 0, 30 - 8) and len(origins[0]) > 50


def test_dead_leaves_schedule_round_robin() -> None:
    dl = DeadLeaves(0, 3, count=3, refresh_every=10)
    assert dl.generations(0) == [0, 1, 2] and dl.generations(9) == [0, 1, 2]
    assert dl.generations(10) == [3, 1, 2] and dl.generations(25) == [3, 4, 2]
    assert dl.generations(40) == [6, 4, 5]


def test_pixelnorm_output_does_not_depend_on_the_image_size() -> None:
    """unet-pixelnorm: a crop denoised alone equals the same crop of the larger image, away from borders."""
    x = torch.rand(1, 3, 160, 160) * 2 - 1
    sigma = torch.tensor([0.3])
    oy, ox, c, margin = 32, 48, 96, 32  # even offsets (the down-sampling grid); margin > receptive radius
    diffs = {}
    for arch in ("unet-pixelnorm", "unet"):
        torch.manual_seed(0)
        net = build_unet(arch, 3, (8, 16), 1, 32).eval().requires_grad_(False)
        with torch.no_grad():
            for p in net.parameters():  # zero-initialised output layers would hide everything
                p.add_(0.05 * torch.randn_like(p))
        d = EDMDenoiser(_UNetCall(net, "float32", channels_last=arch == "unet-pixelnorm"), size_multiple=2)
        with torch.no_grad():
            big = d(x, sigma)[..., oy : oy + c, ox : ox + c]
            small = d(x[..., oy : oy + c, ox : ox + c], sigma)
        diffs[arch] = float((big - small)[..., margin:-margin, margin:-margin].abs().max())
    assert diffs["unet-pixelnorm"] < 1e-5
    assert diffs["unet"] > 1e-3  # GroupNorm and attention see the whole input


def test_pixelnorm_export_loads_untiled(folder: Path, tmp_path: Path) -> None:
    train_prior(_cfg(tmp_path / "w", folder, steps=2, arch="unet-pixelnorm", export=tmp_path / "p"), log=_quiet)
    cfg = json.loads((tmp_path / "p" / "nfc_dps_prior.json").read_text())
    assert cfg["arch"] == "unet-pixelnorm" and "tile" not in cfg
    prior = nfc_dps.load_prior(tmp_path / "p", precision="float32")
    assert isinstance(prior, EDMDenoiser) and prior.size_multiple == 2
    assert not any(isinstance(m, torch.nn.GroupNorm) for m in prior.modules())
    x = torch.rand(2, 3, 24, 32) * 2 - 1
    assert torch.isfinite(prior(x, 0.5)).all()


def test_learning_rate_warms_up_and_cools_down_by_the_absolute_step(tmp_path: Path) -> None:
    cfg = TrainConfig(workdir=tmp_path, steps=10, lr=1e-3, warmup=2, cooldown=4)
    got = [train_loop.learning_rate(cfg, s) for s in range(10)]
    want = [5e-4, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3, 7.5e-4, 5e-4, 2.5e-4]
    assert got == pytest.approx(want)
    assert train_loop.learning_rate(TrainConfig(workdir=tmp_path, steps=10, lr=1e-3), 9) == 1e-3
    with pytest.raises(TrainingError, match="--cooldown N needs --steps"):
        train_prior(TrainConfig(workdir=tmp_path / "w", minutes=1, cooldown=5), log=_quiet)
    with pytest.raises(TrainingError, match="--cooldown 20 is longer than --steps 10"):
        train_prior(TrainConfig(workdir=tmp_path / "w", steps=10, cooldown=20), log=_quiet)


def test_a_killed_run_resumes_its_cooldown(folder: Path, tmp_path: Path, monkeypatch) -> None:
    kw = dict(steps=6, cooldown=4, save_every=2, log_every=1)
    real_batch, calls = CropSampler.batch, []

    def dying_batch(self, n, gen):
        calls.append(n)
        if len(calls) == 5:  # inside the decay, after the save at step 4
            raise _Killed()
        return real_batch(self, n, gen)

    monkeypatch.setattr(CropSampler, "batch", dying_batch)
    with pytest.raises(_Killed):
        train_prior(_cfg(tmp_path / "killed", folder, **kw), log=_quiet)
    monkeypatch.setattr(CropSampler, "batch", real_batch)
    _resume(_cfg(tmp_path / "killed", folder, **kw), monkeypatch, from_step=4)
    train_prior(_cfg(tmp_path / "straight", folder, **kw), log=_quiet)
    _same_state(tmp_path / "killed" / "state.pt", tmp_path / "straight" / "state.pt")
    no_decay = tmp_path / "no_decay"
    train_prior(_cfg(no_decay, folder, **{**kw, "cooldown": 0}), log=_quiet)
    a = torch.load(no_decay / "state.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "straight" / "state.pt", weights_only=True)["model"]
    assert any(not torch.equal(a[k], b[k]) for k in a)  # the decay did change the updates


def _interrupting_batch(monkeypatch, at_call: int, interrupt) -> None:
    """CropSampler.batch that calls ``interrupt()`` on call ``at_call``, after drawing the batch:
    inside the step, its random draws made."""
    real_batch, calls = CropSampler.batch, []

    def batch(self, n, gen):
        out = real_batch(self, n, gen)
        calls.append(n)
        if len(calls) == at_call:
            interrupt()
        return out

    monkeypatch.setattr(CropSampler, "batch", batch)


def test_sigterm_finishes_the_step_then_saves(folder: Path, tmp_path: Path, monkeypatch) -> None:
    """SIGTERM in the middle of a step: the step completes and is saved, and resuming it equals an
    uninterrupted run (a state saved mid-step carried the next step's random draws)."""
    import os
    import signal

    wd = tmp_path / "term"
    _interrupting_batch(monkeypatch, 3, lambda: os.kill(os.getpid(), signal.SIGTERM))
    with pytest.raises(KeyboardInterrupt):
        train_prior(_cfg(wd, folder, steps=100, save_every=100, log_every=1), log=_quiet)
    assert torch.load(wd / "state.pt", weights_only=True)["step"] == 3
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is put back
    monkeypatch.undo()
    _resume(_cfg(wd, folder, steps=6, save_every=100, log_every=1), monkeypatch, from_step=3)
    train_prior(_cfg(tmp_path / "straight", folder, steps=6, save_every=100, log_every=1), log=_quiet)
    _same_state(wd / "state.pt", tmp_path / "straight" / "state.pt")


def test_an_interrupt_inside_a_step_keeps_the_last_save(folder: Path, tmp_path: Path, monkeypatch) -> None:
    def interrupt() -> None:
        raise KeyboardInterrupt("a second Ctrl-C")

    wd = tmp_path / "hard"
    _interrupting_batch(monkeypatch, 6, interrupt)  # inside step 6; step 4 was the last save
    with pytest.raises(KeyboardInterrupt):
        train_prior(_cfg(wd, folder, steps=100, save_every=2, log_every=1), log=_quiet)
    assert torch.load(wd / "state.pt", weights_only=True)["step"] == 4
    monkeypatch.undo()
    _resume(_cfg(wd, folder, steps=7, save_every=2, log_every=1), monkeypatch, from_step=4)
    train_prior(_cfg(tmp_path / "straight", folder, steps=7, save_every=2, log_every=1), log=_quiet)
    _same_state(wd / "state.pt", tmp_path / "straight" / "state.pt")


def test_final_export_replaces_an_older_export(folder: Path, tmp_path: Path) -> None:
    wd, out = tmp_path / "w", tmp_path / "prior"
    train_prior(_cfg(wd, folder, steps=2, export=out), log=_quiet)
    train_prior(_cfg(wd, folder, steps=4), log=_quiet)  # no export: the folder still holds step 2
    train_prior(_cfg(wd, folder, steps=4, export=out), log=_quiet)  # nothing to train: export step 4
    assert json.loads((out / "train_info.json").read_text())["step"] == 4
    ema = torch.load(wd / "state.pt", weights_only=True)["ema"]
    exported = nfc_dps.load_prior(out, precision="float32").state_dict()
    weights = {k.split("unet.", 1)[1]: v for k, v in exported.items() if "unet." in k}
    assert all(torch.allclose(weights[k], ema[k].half().float()) for k in ema)


def test_resume_keeps_each_file_on_its_side_of_the_split(folder: Path, tmp_path: Path) -> None:
    """Removing the held-out file never moves a file trained on into the held-out set."""
    import shutil

    data = tmp_path / "data"
    shutil.copytree(folder / "sub", data)
    wd = tmp_path / "w"
    res = train_prior(_cfg(wd, data, steps=2, holdout=0.01, export=tmp_path / "p"), log=_quiet)
    split = json.loads((wd / "train_config.json").read_text())
    assert len(split["heldout_images"]) == 1 and res.heldout is not None  # the lowest hash, held out
    (data / split["heldout_images"][0]).unlink()
    train_prior(_cfg(wd, data, steps=3, holdout=0.01), log=_quiet)
    after = json.loads((wd / "train_config.json").read_text())
    assert after["heldout_images"] == [] and after["train_images"] == split["train_images"]
    nio.write_image(data / "new.png", _smooth(np.random.default_rng(1), 48, 48, 3))
    train_prior(_cfg(wd, data, steps=4, holdout=0.01), log=_quiet)  # a new file: the hash rule alone
    assert "new.png" in json.loads((wd / "train_config.json").read_text())["train_images"]


def test_resume_refuses_another_seed_and_ignores_init_from(folder: Path, tmp_path: Path) -> None:
    wd = tmp_path / "w"
    train_prior(_cfg(wd, folder, steps=2, seed=5, export=tmp_path / "p"), log=_quiet)
    with pytest.raises(TrainingError, match="--seed 5, this run asks for 7"):
        train_prior(_cfg(wd, folder, steps=3, seed=7), log=_quiet)
    train_prior(_cfg(wd, folder, steps=3), log=_quiet)  # no --seed: the work folder's own
    train_prior(_cfg(tmp_path / "straight", folder, steps=3, seed=5), log=_quiet)
    _same_state(wd / "state.pt", tmp_path / "straight" / "state.pt")
    warnings: list[str] = []
    train_prior(_cfg(wd, folder, steps=3, init_from=tmp_path / "p"), log=_quiet, warn=warnings.append)
    assert any("--init-from" in w and "is ignored" in w for w in warnings)


def test_a_state_from_another_device_reseeds_with_a_warning(folder: Path, tmp_path: Path) -> None:
    wd = tmp_path / "w"
    train_prior(_cfg(wd, folder, steps=2), log=_quiet)
    state = torch.load(wd / "state.pt", weights_only=True)
    state["rng"], state["rng_device"] = torch.zeros(16, dtype=torch.uint8), "cuda"  # a CUDA generator's state
    torch.save(state, wd / "state.pt")
    warnings: list[str] = []
    res = train_prior(_cfg(wd, folder, steps=3), log=_quiet, warn=warnings.append)
    assert res.step == 3 and any("trained on cuda" in w for w in warnings)


def test_sigterm_during_the_last_export_lets_it_finish(folder: Path, tmp_path: Path, monkeypatch) -> None:
    """A time-limit SIGTERM that lands in the final save and export (a run ending on its budget
    between saves) no longer kills the process half-way: the export completes, then it stops."""
    import os
    import signal

    real = train_loop.export_prior

    def export_then_term(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    monkeypatch.setattr(train_loop, "export_prior", export_then_term)
    with pytest.raises(KeyboardInterrupt):
        train_prior(_cfg(tmp_path / "w", folder, steps=3, save_every=100, export=tmp_path / "p"), log=_quiet)
    assert json.loads((tmp_path / "p" / "train_info.json").read_text())["step"] == 3
    assert torch.load(tmp_path / "w" / "state.pt", weights_only=True)["step"] == 3
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_second_signal_during_a_save_stops_at_once(folder: Path, tmp_path: Path, monkeypatch) -> None:
    import os
    import signal

    real, calls = train_loop.write_state, []

    def write_twice_signalled(path, state):
        calls.append(state["step"])
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)  # the second one raises inside this save
        return real(path, state)

    monkeypatch.setattr(train_loop, "write_state", write_twice_signalled)
    with pytest.raises(KeyboardInterrupt):
        train_prior(_cfg(tmp_path / "w", folder, steps=3, save_every=100), log=_quiet)
    assert calls == [3]  # not saved a second time on the way out
