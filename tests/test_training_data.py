"""The procedural training images of train-prior: the textured leaves generator and its wiring.

Properties, not pictures: determinism per seed, range and shapes, textures inside leaves, a
natural-image-like power spectrum, the --synthetic option reaching the crop pool, and a work
folder refusing another generator.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from nfc_dps import io as nio
from nfc_dps.priors.training_data import dead_leaves
from nfc_dps.training import TrainConfig, TrainingError, train_prior
from nfc_dps.training import loop as train_loop
from nfc_dps.training.data import CropSampler, DeadLeaves
from nfc_dps.training.leaves import SYNTHETIC, LeavesParams, synthetic_image, textured_leaves
from nfc_dps.training.state import fingerprint, legacy_fingerprint

#: the textures alone: no blur, noise or tone change
SHARP = LeavesParams(dof=0.0, optics=0.0, noise=0.0, tone=False)


def test_same_seed_same_image_other_seed_other_image() -> None:
    a = textured_leaves(64, np.random.default_rng(7))
    b = textured_leaves(64, np.random.default_rng(7))
    c = textured_leaves(64, np.random.default_rng(8))
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)
    leaves = DeadLeaves(3, 3, size=48, kind="textured")
    assert np.array_equal(leaves.image(5), leaves.image(5))
    assert not np.array_equal(leaves.image(5), leaves.image(6))


@pytest.mark.parametrize("size", [48, 64, 100])
def test_range_shape_dtype(size: int) -> None:
    for seed in range(4):
        img, label = textured_leaves(size, np.random.default_rng(seed), return_labels=True)
        assert img.shape == (size, size, 3) and img.dtype == np.float32
        assert np.isfinite(img).all() and img.min() >= 0.0 and img.max() <= 1.0
        assert img.std() > 0.01  # not a blank image
        assert label.shape == (size, size) and label.min() >= 0


@pytest.mark.parametrize("kind", SYNTHETIC)
@pytest.mark.parametrize("channels", [1, 3])
def test_dead_leaves_schedule_gives_both_kinds_gray_and_rgb(kind: str, channels: int) -> None:
    img = DeadLeaves(0, channels, size=48, kind=kind).image(0)
    assert img.shape == (48, 48, channels) and img.dtype == np.float32
    assert 0.0 <= img.min() and img.max() <= 1.0


def test_flat_kind_is_the_previous_dead_leaves() -> None:
    # existing work folders rebuild the same images: generation g of seed s is unchanged
    img = DeadLeaves(4, 3, size=64).image(9)
    assert np.array_equal(img, dead_leaves(64, np.random.default_rng([4, 1, 9])))
    assert np.array_equal(synthetic_image("dead_leaves", 32, np.random.default_rng(1)),
                          dead_leaves(32, np.random.default_rng(1)))
    with pytest.raises(ValueError, match="textured"):
        synthetic_image("vibrant", 32, np.random.default_rng(1))
    with pytest.raises(TrainingError, match="--synthetic"):
        DeadLeaves(0, 3, kind="vibrant")


def _interior_detail(img: np.ndarray, label: np.ndarray) -> float:
    """Mean squared Laplacian of the luma at pixels whose 3 x 3 neighbourhood is one leaf (no edges)."""
    g = img.mean(axis=2).astype(np.float64)
    lap = 4 * g[1:-1, 1:-1] - g[:-2, 1:-1] - g[2:, 1:-1] - g[1:-1, :-2] - g[1:-1, 2:]
    c = label[1:-1, 1:-1]
    same = np.ones_like(c, bool)
    for dy in (-1, 0, 1):
        for dx in (-1, 0, 1):
            same &= label[1 + dy : label.shape[0] - 1 + dy, 1 + dx : label.shape[1] - 1 + dx] == c
    return float((lap[same] ** 2).mean())


def test_leaves_carry_texture() -> None:
    flat_params = LeavesParams(textured=0.0, dof=0.0, optics=0.0, noise=0.0, tone=False)
    textured = [_interior_detail(*textured_leaves(128, np.random.default_rng(s), SHARP, return_labels=True))
                for s in range(4)]
    flat = [_interior_detail(*textured_leaves(128, np.random.default_rng(s), flat_params, return_labels=True))
            for s in range(4)]
    # flat leaves hold a linear shading only (no curvature but where clipped at 0 or 1)
    assert np.mean(textured) > 20 * np.mean(flat)
    assert np.mean(textured) > 1e-4


def _radial_power_slope(images: list[np.ndarray], lo: float = 0.02, hi: float = 0.25) -> float:
    """Slope of log power against log frequency (cycles per pixel), radial average of the mean
    Hann-windowed power spectrum of the images' luma."""
    n = images[0].shape[0]
    window = np.outer(np.hanning(n), np.hanning(n))
    power = np.mean([np.abs(np.fft.fft2((im.mean(2) - im.mean()) * window)) ** 2 for im in images], axis=0)
    f = np.fft.fftfreq(n)
    r = np.sqrt(f[:, None] ** 2 + f[None, :] ** 2).ravel()
    edges = np.geomspace(lo, hi, 13)
    which = np.digitize(r, edges)
    rb = [r[which == k].mean() for k in range(1, len(edges))]
    pb = [power.ravel()[which == k].mean() for k in range(1, len(edges))]
    return float(np.polyfit(np.log(rb), np.log(pb), 1)[0])


def test_power_spectrum_falls_like_natural_images() -> None:
    images = [textured_leaves(256, np.random.default_rng(100 + s)) for s in range(6)]
    slope = _radial_power_slope(images)
    assert -3.0 < slope < -1.5, slope
    # the textures alone, without the blurs, stay in the same band
    assert -3.0 < _radial_power_slope([textured_leaves(256, np.random.default_rng(s), SHARP) for s in range(3)]) < -1.5


def test_colours_vary_and_images_are_not_all_gray() -> None:
    imgs = [textured_leaves(64, np.random.default_rng(s)) for s in range(12)]
    chroma = [float(np.abs(im - im.mean(axis=2, keepdims=True)).mean()) for im in imgs]
    means = [float(im.mean()) for im in imgs]
    assert max(chroma) > 0.02 and np.std(means) > 0.03


def test_crop_sampler_holds_the_textured_images() -> None:
    leaves = DeadLeaves(2, 3, count=2, size=32, refresh_every=1, kind="textured")
    photo = np.full((40, 40, 3), 0.5, np.float32)
    sampler = CropSampler([photo], 16, "cpu", leaves, leaves_fraction=0.9)
    sampler.sync_leaves(3)
    for j, g in enumerate(leaves.generations(3)):
        off = int(sampler.offsets[1 + j])
        want = torch.from_numpy(leaves.image(g).transpose(2, 0, 1).reshape(-1))
        assert torch.equal(sampler.flat[off : off + want.numel()], want)
    batch = sampler.batch(64, torch.Generator().manual_seed(0))
    assert batch.shape == (64, 3, 16, 16) and (batch.std(dim=(1, 2, 3)) > 0).any()


def test_fingerprint_records_only_a_new_generator() -> None:
    args = ("unet", (48, 96, 192), 1, 3, 48, "builtin", 0.25, (1.0, 0.75, 0.5), None)
    assert fingerprint(*args) == fingerprint(*args, "dead_leaves") == legacy_fingerprint({})
    assert fingerprint(*args, "textured")["data"]["synthetic"] == "textured"


@pytest.fixture()
def tiny_folder(tmp_path: Path) -> Path:
    d = tmp_path / "images"
    d.mkdir()
    rng = np.random.default_rng(0)
    for i in range(2):
        nio.write_image(d / f"im{i}.png", rng.uniform(0, 1, (24, 24, 3)).astype(np.float32))
    return d


def test_train_prior_option_reaches_the_sampler_and_resume_refuses_another(tiny_folder: Path, tmp_path: Path,
                                                                             monkeypatch) -> None:
    kinds: list[str] = []

    class Recording(DeadLeaves):
        def __init__(self, seed: int, channels: int, kind: str = "dead_leaves") -> None:
            kinds.append(kind)
            super().__init__(seed, channels, count=2, size=24, refresh_every=1, kind=kind)

    monkeypatch.setattr(train_loop, "DeadLeaves", Recording)
    base = dict(images=tiny_folder, widths=(4, 8), crop=8, batch=2, holdout=0.0, dead_leaves=0.5, progress=False,
                save_every=100)
    wd = tmp_path / "w"
    quiet = lambda msg: None  # noqa: E731
    train_prior(TrainConfig(workdir=wd, steps=1, synthetic="textured", **base), log=quiet)
    assert kinds == ["textured"]
    saved = torch.load(wd / "state.pt", weights_only=True)["config"]
    assert saved["data"]["synthetic"] == "textured"
    with pytest.raises(TrainingError, match="--synthetic textured"):
        train_prior(TrainConfig(workdir=wd, steps=2, synthetic="dead_leaves", **base), log=quiet)
    res = train_prior(TrainConfig(workdir=wd, steps=2, **base), log=quiet)  # left out: the folder's own
    assert res.step == 2 and kinds[-1] == "textured"
    with pytest.raises(TrainingError, match="--synthetic"):
        train_prior(TrainConfig(workdir=wd, steps=3, synthetic="bogus", **base), log=quiet)
