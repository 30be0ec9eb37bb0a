"""Blur kernels: Gaussian, random motion, loading from files."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.ndimage as ndi
import torch
from PIL import Image

from nfc_dps.operators import gaussian_kernel, load_kernel, motion_kernel


def test_gaussian_kernel_matches_dps_construction():
    k = gaussian_kernel(61, 3.0)
    assert k.shape == (61, 61) and k.dtype == torch.float32
    delta = np.zeros((61, 61))
    delta[30, 30] = 1
    ref = ndi.gaussian_filter(delta, 3.0)
    assert np.allclose(k.numpy(), ref / ref.sum(), atol=1e-7)
    assert abs(float(k.sum()) - 1) < 1e-6
    assert torch.allclose(k, k.flip(0)) and torch.allclose(k, k.T)
    assert int(k.argmax()) == 30 * 61 + 30
    # support: 4 std truncation -> 25 x 25 non-zero
    assert int((k[30] > 0).sum()) == 25


def test_gaussian_kernel_small_and_delta():
    k = gaussian_kernel(5, 10.0)  # much wider than the kernel: still sums to 1
    assert abs(float(k.sum()) - 1) < 1e-6
    d = gaussian_kernel(3, 0.0)
    assert float(d[1, 1]) == 1.0 and float(d.sum()) == 1.0


@pytest.mark.parametrize("size,std,match", [(0, 1.0, "size.*0"), (5, -1.0, r"std.*-1\.0"), (5, float("nan"), "std.*nan"),
                                            (2.5, 1.0, r"size.*2\.5")])
def test_gaussian_kernel_errors(size, std, match):
    with pytest.raises(ValueError, match=match):
        gaussian_kernel(size, std)


@pytest.mark.parametrize("intensity", [0.0, 0.2, 0.5, 1.0])
def test_motion_kernel_properties(intensity):
    k = motion_kernel(31, intensity, generator=7)
    assert k.shape == (31, 31) and k.dtype == torch.float32
    assert abs(float(k.sum()) - 1) < 1e-5
    assert float(k.min()) >= 0
    # centre of mass near the centre pixel (exact for the path's points; the raster clips)
    ii, jj = torch.meshgrid(torch.arange(31.0), torch.arange(31.0), indexing="ij")
    assert abs(float((k * ii).sum()) - 15) < 4 and abs(float((k * jj).sum()) - 15) < 4


def test_motion_kernel_seeding():
    a = motion_kernel(61, 0.5, generator=3)
    assert torch.equal(a, motion_kernel(61, 0.5, generator=3))
    assert torch.equal(a, motion_kernel(61, 0.5, generator=np.random.default_rng(3)))
    assert not torch.equal(a, motion_kernel(61, 0.5, generator=4))
    rng = np.random.default_rng(0)
    assert not torch.equal(motion_kernel(61, 0.5, rng), motion_kernel(61, 0.5, rng))  # a stream


def test_motion_kernel_leaves_global_rng_alone():
    np.random.seed(0)
    state = np.random.get_state()[1].copy()
    torch_state = torch.random.get_rng_state()
    motion_kernel(31, 0.5, generator=1)
    assert np.array_equal(state, np.random.get_state()[1])
    assert torch.equal(torch_state, torch.random.get_rng_state())


def test_motion_kernel_is_a_thin_path_not_a_blob():
    """Camera-shake kernels are sparse: most of the mass on a small fraction of the pixels."""
    for seed in range(5):
        k = motion_kernel(61, 0.5, generator=seed).flatten().sort(descending=True).values
        n90 = int((k.cumsum(0) < 0.9).sum()) + 1
        assert n90 < 0.15 * 61 * 61, seed


def test_motion_kernel_intensity_grows_extent():
    def extent(intensity):
        sizes = []
        for seed in range(12):
            k = motion_kernel(61, intensity, generator=seed)
            sizes.append(int((k > 1e-3 * float(k.max())).sum()))
        return float(np.mean(sizes))

    assert extent(0.9) > extent(0.1)


@pytest.mark.parametrize("kwargs,match", [({"intensity": 1.5}, r"intensity.*1\.5"), ({"size": 0}, "size.*0"),
                                          ({"generator": "seed"}, "generator"), ({"generator": -1}, "-1")])
def test_motion_kernel_errors(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        motion_kernel(**{"size": 15, **kwargs})


def test_load_kernel(tmp_path):
    k = np.zeros((7, 9))
    k[3, 2:7] = [1, 2, 3, 2, 1]
    np.save(tmp_path / "k.npy", k)
    out = load_kernel(tmp_path / "k.npy")
    assert out.shape == (7, 9) and out.dtype == torch.float32
    assert np.allclose(out.numpy(), k / k.sum())
    Image.fromarray((k / k.max() * 255).astype(np.uint8)).save(tmp_path / "k.png")
    png = load_kernel(str(tmp_path / "k.png"))
    assert np.allclose(png.numpy(), out.numpy(), atol=2e-3)
    Image.fromarray(np.stack([(k / k.max() * 255).astype(np.uint8)] * 3, -1)).save(tmp_path / "rgb.png")
    assert np.allclose(load_kernel(tmp_path / "rgb.png").numpy(), png.numpy(), atol=1e-3)
    np.save(tmp_path / "k4.npy", k[None, None])  # singleton dimensions are squeezed
    assert torch.equal(load_kernel(tmp_path / "k4.npy"), out)
    np.save(tmp_path / "line.npy", np.ones((1, 5)))  # a 1 x n kernel stays 2-D
    assert load_kernel(tmp_path / "line.npy").shape == (1, 5)


def test_load_kernel_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.npy"):
        load_kernel(tmp_path / "missing.npy")
    np.save(tmp_path / "zero.npy", np.zeros((3, 3)))
    with pytest.raises(ValueError, match=r"zero.npy.*positive.*0\.0"):
        load_kernel(tmp_path / "zero.npy")
    np.save(tmp_path / "cube.npy", np.ones((2, 3, 3)))
    with pytest.raises(ValueError, match=r"cube.npy.*2-D.*\(2, 3, 3\)"):
        load_kernel(tmp_path / "cube.npy")
    np.save(tmp_path / "nan.npy", np.array([[1.0, np.nan]]))
    with pytest.raises(ValueError, match="nan.npy.*NaN"):
        load_kernel(tmp_path / "nan.npy")
    (tmp_path / "junk.png").write_bytes(b"\x00\x01junk")
    with pytest.raises(ValueError, match="junk.png"):
        load_kernel(tmp_path / "junk.png")
    Image.fromarray(np.zeros((4, 4), np.uint8)).save(tmp_path / "black.png")
    with pytest.raises(ValueError, match="black.png.*positive"):
        load_kernel(tmp_path / "black.png")
    (tmp_path / "text.npy").write_text("0 1 0\n1 4 1\n0 1 0\n")
    with pytest.raises(ValueError, match="text.npy.*not a NumPy .npy file") as err:
        load_kernel(tmp_path / "text.npy")
    assert "pickled" not in str(err.value)
