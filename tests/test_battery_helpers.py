"""Reliability checks of the helpers under the commands: the folder lock, prior-folder validation,
kernel files, API argument checks, streamed sample statistics, train-prior's folders and the
rank logic of usage errors under torchrun."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from nfc_dps.cli.common import LOCK_FILE, UsageError
from nfc_dps.cli.outputs import folder_lock

# ---------------------------------------------------------------- the folder lock (S4, S5)


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _racer(folder: str, rounds: int, start, attempted, released, results) -> None:
    """Each round: wait for the start, try the lock, report, hold it until both have tried."""
    for _ in range(rounds):
        start.wait()
        try:
            with folder_lock(Path(folder)):
                results.put(1)
                attempted.wait()
        except UsageError:
            results.put(0)
            attempted.wait()
        released.wait()


def test_two_runs_racing_for_a_stale_lock_never_both_hold_it(tmp_path: Path) -> None:
    """S5: a lock file left by a dead run, found by two runs at once: exactly one holds the lock,
    every round (the earlier read-pid / unlink / create takeover let both hold it)."""
    rounds = 1000
    ctx = mp.get_context("fork")
    start, attempted, released = (ctx.Barrier(3) for _ in range(3))
    results = ctx.Queue()
    procs = [ctx.Process(target=_racer, args=(str(tmp_path), rounds, start, attempted, released, results))
             for _ in range(2)]
    for p in procs:
        p.start()
    stale = str(_dead_pid())
    winners = []
    try:
        for _ in range(rounds):
            (tmp_path / LOCK_FILE).write_text(stale)
            start.wait(timeout=60)
            got = results.get(timeout=60) + results.get(timeout=60)
            attempted.wait(timeout=60)
            released.wait(timeout=60)
            winners.append(got)
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    assert winners == [1] * rounds, f"rounds with {sorted(set(winners))} holders: {winners.count(2)} with two"


_HOLDER = """
import sys, time
from pathlib import Path
from nfc_dps.cli.outputs import folder_lock
with folder_lock(Path(sys.argv[1])):
    print("locked", flush=True)
    time.sleep(60)
"""


def hold_lock(folder: Path) -> subprocess.Popen:
    """A process holding ``folder``'s lock (kill it to let go)."""
    p = subprocess.Popen([sys.executable, "-c", _HOLDER, str(folder)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "locked"
    return p


def test_a_killed_holder_frees_the_lock_and_a_live_one_is_named(tmp_path: Path) -> None:
    holder = hold_lock(tmp_path)
    try:
        with pytest.raises(UsageError, match=f"another nfc-dps run \\(pid {holder.pid}\\)"):
            with folder_lock(tmp_path):
                pass
    finally:
        holder.kill()
        holder.wait()
    assert (tmp_path / LOCK_FILE).exists()  # left behind by the kill, and free
    with folder_lock(tmp_path):
        assert (tmp_path / LOCK_FILE).read_text() == str(os.getpid())
    assert not (tmp_path / LOCK_FILE).exists()


# ---------------------------------------------------------------- train-prior's folders (S4, U3, low)

from test_train import TINY, _cfg, _quiet, folder  # noqa: E402,F401 - folder is a fixture

from nfc_dps import cli  # noqa: E402
from nfc_dps.training import TrainingError, train_prior  # noqa: E402


def test_train_prior_takes_the_work_folder_lock(folder: Path, tmp_path: Path, capsys) -> None:
    """S4: a second run on a work folder in use is refused (both ran, interleaving loss.csv)."""
    wd = tmp_path / "work"
    wd.mkdir()
    with folder_lock(wd):
        with pytest.raises(TrainingError, match=f"--workdir {wd}: another nfc-dps run \\(pid {os.getpid()}\\)"):
            train_prior(_cfg(wd, folder, steps=1), log=_quiet)
        assert cli.main(["train-prior", "--workdir", str(wd), "--images", str(folder), "--steps", "1"] + TINY) == 2
        assert "another nfc-dps run" in capsys.readouterr().err
    assert not (wd / "loss.csv").exists() and not (wd / "state.pt").exists()
    assert train_prior(_cfg(wd, folder, steps=1), log=_quiet).step == 1
    assert not (wd / LOCK_FILE).exists()


@pytest.mark.parametrize("flag", ["workdir", "export"])
def test_a_work_or_export_folder_equal_to_the_images_is_named(folder: Path, tmp_path: Path, flag: str) -> None:
    """U3: the folder left out of the scan was the image folder itself: 'no image files found'."""
    other = {"workdir": tmp_path / "w", "export": None}
    with pytest.raises(TrainingError, match=f"--{flag} {folder} is the --images folder"):
        train_prior(_cfg(**{**other, "images": folder, flag: folder}, steps=1), log=_quiet)
    with pytest.raises(TrainingError, match=f"--images {folder / 'sub'} lies inside --{flag} {folder}"):
        train_prior(_cfg(**{**other, "images": folder / "sub", flag: folder}, steps=1), log=_quiet)


def _unreadable(monkeypatch, *folders: Path) -> None:
    """os.scandir of ``folders`` fails as a folder without read permission does (tests run as root)."""
    real = os.scandir
    blocked = {str(f) for f in folders}

    def scandir(path="."):
        if os.fspath(path) in blocked:
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)


def test_unreadable_image_folders_are_named(folder: Path, tmp_path: Path, monkeypatch) -> None:
    """U3: an unreadable --images said 'no image files found'; an unreadable subfolder was skipped
    without a word."""
    with monkeypatch.context() as m:
        _unreadable(m, folder)
        with pytest.raises(TrainingError, match=f"--images {folder}: cannot read the folder \\(Permission denied\\)"):
            train_prior(_cfg(tmp_path / "w1", folder, steps=1), log=_quiet)
    lines: list[str] = []
    with monkeypatch.context() as m:
        _unreadable(m, folder / "sub")
        res = train_prior(_cfg(tmp_path / "w2", folder, steps=1), log=_quiet, warn=lines.append)
    assert f"skipped the folder {folder / 'sub'}: cannot read the folder (Permission denied); its images are not used" in lines
    assert (str(folder / "sub"), "cannot read the folder (Permission denied)") in res.skipped


def test_steps_0_claims_no_state_it_did_not_write(folder: Path, tmp_path: Path) -> None:
    lines: list[str] = []
    wd = tmp_path / "w"
    train_prior(_cfg(tmp_path / "a", folder, steps=1, export=tmp_path / "pa"), log=_quiet)
    # a new folder exports --init-from's weights (without it: refused, issue 51 P21)
    train_prior(_cfg(wd, folder, steps=0, export=tmp_path / "p", init_from=tmp_path / "pa", widths=None, crop=None),
                log=lines.append)
    assert not (wd / "state.pt").exists()
    assert not any("state in" in line for line in lines), lines
    assert lines[-1] == f"step 0: nothing trained, no state written to {wd}; prior of the initial weights in {tmp_path / 'p'}"


def test_a_held_out_image_too_small_for_a_psnr_is_skipped(folder: Path, tmp_path: Path) -> None:
    """A held-out 1x1 image gave a held-out PSNR (of one pixel)."""
    from nfc_dps import io as nio
    from nfc_dps.training.data import heldout_score, load_folder

    name = next(f"dot{i}.png" for i in range(1000) if heldout_score(f"dot{i}.png") < 0.05)
    nio.write_image(folder / name, np.full((1, 1), 0.5, np.float32))
    lines: list[str] = []
    data = load_folder(folder, None, 16, 0.05, log=lines.append)
    assert name not in [n for n, _ in data.heldout] + [n for n, _ in data.train]
    assert (str(folder / name), "1x1 pixels is smaller than the 16x16 crop: held out, but too small for the "
                                "held-out PSNR") in data.skipped
    assert any(line.startswith(f"skipped {folder / name}") for line in lines)


# ---------------------------------------------------------------- bfloat16 and the batch (S3)


def _tiny_unet(in_channels: int = 3, out_channels: int = 3):
    from diffusers import UNet2DModel

    torch.manual_seed(0)
    return UNet2DModel(sample_size=16, in_channels=in_channels, out_channels=out_channels, block_out_channels=(8, 16),
                       norm_num_groups=4, layers_per_block=1, down_block_types=("DownBlock2D", "DownBlock2D"),
                       up_block_types=("UpBlock2D", "UpBlock2D")).eval()


@pytest.mark.parametrize("channels_last", [False, True])
def test_bfloat16_network_output_does_not_depend_on_the_batch(channels_last: bool) -> None:
    """S3: under bfloat16 autocast the CPU kernels rounded an image alone in its batch differently
    from the same image beside others (up to 4/255 in a restoration); an image's result is now
    the same bits in any batch."""
    from nfc_dps.priors.base import EDMDenoiser
    from nfc_dps.priors.diffusers_prior import _UNetCall

    unet = _tiny_unet()
    if channels_last:
        unet = unet.to(memory_format=torch.channels_last)
    prior = EDMDenoiser(_UNetCall(unet, "bfloat16", channels_last), channels=3)
    gen = torch.Generator().manual_seed(1)
    x, s = torch.randn(5, 3, 48, 48, generator=gen), torch.tensor([0.3, 0.5, 1.0, 0.05, 2.0])
    with torch.inference_mode():
        together = prior.denoise(x, s)
        alone = torch.cat([prior.denoise(x[i:i + 1], s[i:i + 1]) for i in range(5)])
        pairs = torch.cat([prior.denoise(x[i:i + 2], s[i:i + 2]) for i in (0, 2)] + [prior.denoise(x[4:], s[4:])])
    assert torch.equal(alone, together) and torch.equal(pairs, together)


def _prior_folder(path: Path, unet=None, **prior_json) -> Path:
    """A tiny diffusers UNet saved as a prior folder with ``nfc_dps_prior.json`` = ``prior_json``."""
    (unet if unet is not None else _tiny_unet()).save_pretrained(path)
    (path / "nfc_dps_prior.json").write_text(json.dumps({"parameterization": "edm", **prior_json}))
    return path


def test_bfloat16_restorations_do_not_depend_on_the_batch(tmp_path: Path) -> None:
    """S3, the promise of README and docs/scale.md: under bfloat16 the restoration of an image of
    one tile is the same bits alone, in a batch, and at any max_batch."""
    import nfc_dps
    from nfc_dps.priors.diffusers_prior import load_diffusers_prior

    prior = load_diffusers_prior(_prior_folder(tmp_path / "p", tile=48), precision="bfloat16")
    x = torch.rand(3, 3, 48, 48, generator=torch.Generator().manual_seed(0))
    op = nfc_dps.build_operator("deblur_gaussian", image_size=(48, 48), boundary="circular")
    y = op.measure(x, sigma_y=0.05, generator=torch.Generator().manual_seed(1)).clamp(0, 1)
    kw = dict(prior=prior, progress=False, seed=[3, 4, 5], sigma_y=0.05, num_levels=3)
    together = nfc_dps.restore(y, op, **kw).image
    assert torch.equal(nfc_dps.restore(y, op, max_batch=1, **kw).image, together)
    alone = [nfc_dps.restore(y[i:i + 1], op, **{**kw, "seed": [3 + i]}).image for i in range(3)]
    assert torch.equal(torch.cat(alone), together)


# ---------------------------------------------------------------- prior folders that cannot be priors (S7)


@pytest.mark.parametrize("settings, key", [
    ({"sigma_data": -1}, "sigma_data"), ({"sigma_data": "0.5"}, "sigma_data"), ({"sigma_min": 0}, "sigma_min"),
    ({"sigma_max": float("nan")}, "sigma_max"), ({"sigma_min": 5.0, "sigma_max": 1.0}, "sigma_min"),
    ({"tile": 0}, "tile"), ({"tile": -48}, "tile"), ({"tile": 4.5}, "tile"), ({"tile": True}, "tile"),
    ({"tile": 16, "tile_overlap": "yes"}, "tile_overlap"), ({"power_law": [1, True]}, "power_law"),
    ({"parameterization": "ddpm", "prediction_type": "noise"}, "prediction_type"),
])
def test_nonsensical_prior_settings_are_refused_naming_file_and_key(tmp_path: Path, settings: dict, key: str) -> None:
    from nfc_dps.priors.diffusers_prior import load_diffusers_prior

    folder = _prior_folder(tmp_path / "p", **settings)
    with pytest.raises(ValueError, match=f"{folder / 'nfc_dps_prior.json'}: {key} "):
        load_diffusers_prior(folder)


@pytest.mark.parametrize("parameterization", ["edm", "ddpm"])
def test_a_unet_whose_output_is_not_its_input_image_is_refused(tmp_path: Path, parameterization: str) -> None:
    """S7: a UNet of 3 input and 1 output channels loaded and restored (exit 0)."""
    from nfc_dps import cli
    from nfc_dps.priors.diffusers_prior import load_diffusers_prior

    folder = _prior_folder(tmp_path / "p", _tiny_unet(3, 1), parameterization=parameterization)
    with pytest.raises(ValueError, match=f"{folder / 'config.json'}: out_channels 1 with in_channels 3"):
        load_diffusers_prior(folder)
    assert cli.main(["demo", "--output", str(tmp_path / "out"), "--prior", str(folder), "--steps", "1", "-q"]) == 2
    if parameterization == "ddpm":  # learned variance: twice the input's channels
        load_diffusers_prior(_prior_folder(tmp_path / "q", _tiny_unet(3, 6), parameterization="ddpm"))


def test_a_class_conditional_unet_is_refused_at_load(tmp_path: Path) -> None:
    from diffusers import UNet2DModel

    from nfc_dps.priors.diffusers_prior import load_diffusers_prior

    unet = UNet2DModel(sample_size=16, block_out_channels=(8, 16), norm_num_groups=4, layers_per_block=1,
                       down_block_types=("DownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "UpBlock2D"),
                       num_class_embeds=10)
    folder = _prior_folder(tmp_path / "p", unet)
    with pytest.raises(ValueError, match=f"{folder / 'config.json'}: num_class_embeds is 10"):
        load_diffusers_prior(folder)


# ---------------------------------------------------------------- kernel files (U8)


def test_a_complex_kernel_file_is_refused_naming_it(tmp_path: Path) -> None:
    """U8: the imaginary part of a complex .npy kernel was dropped without a word."""
    from nfc_dps.operators.kernels import load_kernel

    path = tmp_path / "k.npy"
    np.save(path, np.ones((5, 5)) * (1 + 1j))
    with pytest.raises(ValueError, match=f"kernel file '{path}' holds complex numbers \\(dtype complex128\\)"):
        load_kernel(path)
    np.save(path, np.ones((5, 5)))
    assert float(load_kernel(path).sum()) == pytest.approx(1.0)


# ---------------------------------------------------------------- API misuse (U7)


@pytest.fixture(scope="module")
def api_case(tmp_path_factory):
    import nfc_dps
    from nfc_dps.priors.diffusers_prior import load_diffusers_prior

    folder = _prior_folder(tmp_path_factory.mktemp("prior") / "p")
    op = nfc_dps.build_operator("denoise", image_size=(16, 16))
    y = torch.rand(1, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    return folder, load_diffusers_prior(folder), op, y


def test_restore_takes_a_prior_folder_path_and_refuses_other_objects(api_case) -> None:
    """U7: prior="a/path" was an AttributeError."""
    import nfc_dps

    folder, prior, op, y = api_case
    kw = dict(progress=False, num_levels=2)
    expected = nfc_dps.restore(y, op, prior=prior, **kw).image
    assert torch.equal(nfc_dps.restore(y, op, prior=str(folder), **kw).image, expected)
    assert torch.equal(nfc_dps.restore(y, op, prior=folder, **kw).image, expected)
    with pytest.raises(TypeError, match="prior must be a nfc_dps Prior .* got object"):
        nfc_dps.restore(y, op, prior=object(), **kw)


def test_restore_refuses_bad_overrides_and_empty_batches_and_takes_numpy_seeds(api_case) -> None:
    """U7: num_levels=2.5 (a linspace TypeError), an empty batch (a reduction RuntimeError) and
    seed=np.array(5) (iteration over a 0-d array)."""
    import nfc_dps

    _, prior, op, y = api_case
    kw = dict(prior=prior, progress=False)
    with pytest.raises(ValueError, match=r"restore\(num_levels=...\): key 'num_levels': expected an integer, got 2.5"):
        nfc_dps.restore(y, op, num_levels=2.5, **kw)
    with pytest.raises(ValueError, match=r"measurement has no pixels \(batch of shape \(0, 3, 16, 16\)\)"):
        nfc_dps.restore(y[:0], op, **kw)
    a = nfc_dps.restore(y, op, seed=np.array(5), num_levels=2, **kw).image
    assert torch.equal(a, nfc_dps.restore(y, op, seed=5, num_levels=2, **kw).image)
    with pytest.raises(TypeError, match="seed must be an int or a sequence of ints .*got float"):
        nfc_dps.restore(y, op, seed=np.array(5.0), **kw)
    assert nfc_dps.restore(y, op, num_levels=3.0, **kw).config.num_levels == 3  # a whole float, as in a config file


def test_bench_budgets_that_are_not_integers_are_named(capsys) -> None:
    from nfc_dps import cli

    for value in ("abc", "20,0"):
        assert cli.main(["bench", "--budgets", value, "--out", "unused"]) == 2
        assert f"--budgets '{value}': expected comma-separated integers >= 1" in capsys.readouterr().err


# ---------------------------------------------------------------- many samples (C4)


def test_sample_statistics_stream_chunk_by_chunk(api_case) -> None:
    """C4: the mean and std of K chains are merged a chunk at a time; keep_samples=False keeps
    no sample, and the statistics equal those of all the chains at once."""
    import nfc_dps

    _, prior, op, y = api_case
    y2 = torch.cat([y, y.flip(-1)])
    kw = dict(prior=prior, progress=False, preset="fast", num_samples=5, seed=[1, 2], langevin_steps=2, num_levels=3)
    whole = nfc_dps.restore(y2, op, **kw)
    streamed = nfc_dps.restore(y2, op, max_batch=3, keep_samples=False, **kw)
    assert streamed.samples is None and whole.samples.shape == (5, 2, 3, 16, 16)
    torch.testing.assert_close(streamed.image, whole.image, rtol=0, atol=1e-6)
    torch.testing.assert_close(streamed.std, whole.std, rtol=0, atol=1e-6)
    assert float(whole.std.mean()) > 0
    kept = nfc_dps.restore(y2, op, max_batch=3, **kw)
    assert torch.equal(kept.samples, whole.samples) and torch.equal(kept.image, streamed.image)


def test_many_samples_make_nothing_per_sample_before_the_first_network_call(api_case, monkeypatch) -> None:
    """C4: K = 1e6 made K generators (2.6 GB, 17 s) before the first network call; now only the
    chunk's own."""
    import nfc_dps

    _, prior, op, y = api_case
    made = []
    real = np.random.SeedSequence

    def counting(*args, **kw):
        made.append(1)
        return real(*args, **kw)

    class Stop(Exception):
        pass

    def stop(info):
        raise Stop

    monkeypatch.setattr(np.random, "SeedSequence", counting)
    with pytest.raises(Stop):
        nfc_dps.restore(y, op, prior=prior, progress=False, preset="fast", num_samples=10**5, max_batch=2,
                        keep_samples=False, callback=stop)
    assert len(made) <= 2


# ---------------------------------------------------------------- demo --size (C5)


def test_demo_size_is_bounded(tmp_path: Path, capsys) -> None:
    """C5: --size 100000 was a raw _ArrayMemoryError traceback."""
    from nfc_dps import cli
    from nfc_dps.cli.demo import MAX_SIZE

    prior = _prior_folder(tmp_path / "p")
    for size in (100000, MAX_SIZE + 16, 24):
        assert cli.main(["demo", "-o", str(tmp_path / "out"), "--prior", str(prior), "--size", str(size), "-q"]) == 2
        err = capsys.readouterr().err
        assert f"--size must be a multiple of 16 from 32 to {MAX_SIZE}" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- usage errors under torchrun (U6)


@pytest.mark.parametrize("rank", ["0", "1", "3"])
def test_usage_errors_print_once_on_rank_0_and_every_rank_exits_2(tmp_path: Path, rank: str, monkeypatch,
                                                                     capsys) -> None:
    """U6: every rank printed every usage error. The ranks of a group are faked by torchrun's
    environment (the errors come before any process group starts)."""
    from nfc_dps import cli

    monkeypatch.setenv("RANK", rank)
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", rank)
    missing = tmp_path / "missing"
    assert cli.main(["restore", "-i", str(missing), "-o", str(tmp_path / "out"), "--task", "denoise", "-q"]) == 2
    assert cli.main(["restore", "--no-such-flag"]) == 2
    err = capsys.readouterr().err
    if rank == "0":
        assert err.count(f"--input {missing}: no such file or folder") == 1 and err.count("error:") == 2
    else:
        assert err == ""


# ---------------------------------------------------------------- 16-bit PNG size guard (low)


def test_a_16_bit_png_bomb_is_refused_before_it_is_decompressed(tmp_path: Path, monkeypatch) -> None:
    """The 16-bit colour PNG decoder had no pixel-count guard (a 373 KB file peaked at 2.3 GB)."""
    import zlib

    from PIL import Image

    from nfc_dps import io as nio

    path = tmp_path / "deep.png"
    nio.write_image(path, np.full((8, 8, 3), 0.5, np.float32), bit_depth=16)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 20)  # 8 x 8 = 64 > 2 x 20
    with pytest.raises(nio.ImageReadError, match=r"8x8 pixels is more than twice PIL.Image.MAX_IMAGE_PIXELS \(20\)"):
        nio.read_image(path)
    calls = []
    monkeypatch.setattr(zlib, "decompress", lambda *a, **k: calls.append(1))
    with pytest.raises(nio.ImageReadError):
        nio.read_image(path)
    assert not calls
    monkeypatch.undo()
    assert nio.read_image(path)[0].shape == (8, 8, 3)
