"""Blur boundaries that do not wrap: the shipped deblurring configs, the valid-boundary operator,
the conjugate-gradient prox of non-circulant blurs, and NFC's Wiener start on them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.signal
import torch

from nfc_dps.config import load_mapping, parse_task
from nfc_dps.metrics import psnr
from nfc_dps.operators import BlurOperator, build_operator
from nfc_dps.operators.base import LinearOperator
from nfc_dps.operators.blur import fast_fft_size
from nfc_dps.operators.kernels import gaussian_kernel, motion_kernel
from nfc_dps.priors.base import Prior
from nfc_dps.samplers.common import initial_estimate, spectrum_for, to_image_units, to_model_units

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.mark.parametrize("name", ["deblur_gaussian.yaml", "deblur_motion.yaml"])
def test_shipped_deblur_configs_do_not_wrap(name):
    """An impulse on the bottom row of the image reaches no measured pixel in the top rows."""
    task = parse_task(load_mapping(CONFIGS / name), name)
    op = build_operator(task.task, image_size=(128, 128), seed=0, **task.params)
    x = torch.zeros(1, 1, 128, 128, dtype=torch.float64)
    x[..., -1, 64] = 1.0
    ax = op.A(x)
    assert float(ax[..., : ax.shape[-2] // 2, :].abs().max()) < 1e-9
    # the operator does measure: an impulse in the middle keeps its mass
    centre = torch.zeros_like(x)
    centre[..., 64, 64] = 1.0
    assert float(op.A(centre).sum()) == pytest.approx(1.0, abs=1e-6)
    # and the measurement restores an image of the shape it was measured from
    assert tuple(op.image_shape(ax.shape)) == tuple(x.shape)


def test_circular_boundary_wraps():
    """The check above can fail: the circular blur sends the bottom row into the top rows."""
    op = BlurOperator(gaussian_kernel(61, 3.0), "circular")
    x = torch.zeros(1, 1, 128, 128, dtype=torch.float64)
    x[..., -1, 64] = 1.0
    assert float(op.A(x)[..., :64, :].abs().max()) > 1e-3


@pytest.mark.parametrize("kshape", [(5, 5), (4, 7), (1, 3)])
def test_valid_blur_is_the_valid_convolution(kshape):
    g = torch.Generator().manual_seed(0)
    k = torch.rand(kshape, generator=g, dtype=torch.float64) + 0.1
    op = BlurOperator(k, "valid")
    x = torch.rand(2, 3, 19, 14, generator=g, dtype=torch.float64)
    y = op.A(x)
    kn = (k / k.sum()).numpy()
    want = np.stack([[scipy.signal.convolve2d(c, kn, mode="valid") for c in im] for im in x.numpy()])
    assert y.shape == want.shape == tuple(op.measurement_shape(x.shape))
    np.testing.assert_allclose(y.numpy(), want, atol=1e-12)
    v = torch.rand(y.shape, generator=g, dtype=torch.float64)
    assert abs(float((y * v).sum() - (x * op.A_adjoint(v)).sum())) < 1e-9
    assert tuple(op.image_shape(y.shape)) == tuple(x.shape)


def test_valid_blur_refuses_an_image_smaller_than_its_kernel():
    with pytest.raises(ValueError, match="the 9x9 blur kernel is larger than the 8x20 image"):
        BlurOperator(gaussian_kernel(9, 1.0), "valid").A(torch.rand(1, 1, 8, 20))


def test_valid_gram_eigenvalues_have_the_operator_rank():
    op = BlurOperator(gaussian_kernel(7, 1.5), "valid")
    gram = op.approximate_gram_eigenvalues(20, 24)
    assert gram.numel() == 20 * 24
    assert int((gram > 0).sum()) == 14 * 18  # one per measurement
    assert float(gram.max()) == pytest.approx(1.0)


@pytest.mark.parametrize("boundary", ["reflect", "valid"])
@pytest.mark.parametrize("kernel", ["gaussian", "motion"])
def test_noncirculant_prox_minimises(boundary, kernel):
    """The preconditioned CG prox reaches the minimiser when asked to, and at its default
    tolerance stays within a small fraction of r of it."""
    k = gaussian_kernel(15, 2.0) if kernel == "gaussian" else motion_kernel(15, 0.5, 3)
    op = BlurOperator(k, boundary)
    g = torch.Generator().manual_seed(1)
    z = torch.rand(1, 3, 40, 36, generator=g, dtype=torch.float64)
    y = op.A(torch.rand(z.shape, generator=g, dtype=torch.float64))
    sigma, r = 0.05, 0.5
    exact = op.prox(y, z, sigma, r, max_iter=1000, tol=1e-12)
    grad = op.A_adjoint(op.A(exact) - y) / sigma**2 + (exact - z) / r**2
    assert float(grad.abs().max()) < 1e-6
    reference = LinearOperator.prox(op, y, z, sigma, r, max_iter=3000, tol=1e-13)  # unpreconditioned
    assert float((exact - reference).abs().max()) < 1e-7
    default = op.prox(y, z, sigma, r)
    assert float((default - exact).pow(2).mean().sqrt()) < 1e-2 * r


def test_fast_fft_size():
    assert [fast_fft_size(n) for n in (1, 7, 15, 17, 316, 320)] == [1, 8, 15, 18, 320, 320]


class _PowerLawPrior(Prior):
    """A prior that declares only its power law (the start estimate needs nothing else)."""

    channels = 3
    power_law = (0.000476, 2.67)


def _flat_plus_edge(n: int) -> torch.Tensor:
    x = torch.full((1, 3, n, n), 0.85, dtype=torch.float32)
    x[..., :, n // 2:] = 0.15
    return x


def _two_sided(n: int, g: int) -> torch.Tensor:
    """|k| of each frequency of a g-point grid, in units of an n-point grid's spacing."""
    return (torch.fft.fftfreq(g, dtype=torch.float64) * n).abs()


def test_spectrum_on_another_grid_interpolates_log_linearly():
    """A spectrum exp(-a|k1| - b|k2|) is log-linear between grid points, so read on any grid it is
    that function of the new grid's frequencies exactly (both signs, across DC and Nyquist; even
    grids, whose Nyquist frequency bounds every frequency of the new grid)."""
    from nfc_dps.samplers.gaussian_step import _spectrum_on_grid

    h, w = 6, 4
    spectrum = torch.exp(-0.7 * _two_sided(h, h)[:, None] - 0.3 * _two_sided(w, w)[None, :]).view(1, 1, h, w)
    torch.testing.assert_close(_spectrum_on_grid(spectrum, h, w), spectrum)
    for gh, gw in ((12, 8), (10, 6), (17, 13)):
        expected = torch.exp(-0.7 * _two_sided(h, gh)[:, None] - 0.3 * _two_sided(w, gw)[None, :])
        torch.testing.assert_close(_spectrum_on_grid(spectrum, gh, gw)[0, 0], expected)


def test_symmetric_prior_precision_is_the_prior_on_the_symmetric_extension():
    """Q v against the dense matrix E^T F^-1 diag(1/S) F E / 4 (F the orthonormal DFT of the
    extension's grid) on a grid whose rows extend without repeating the edge (10: period 18 beats
    20) and whose columns with it (6: period 12 beats 10); a vertical ramp, whose extension has no
    jump, costs less than half as much under Q as under the periodic grid's prior."""
    from nfc_dps.samplers.gaussian_step import _half_sample, symmetric_prior_precision

    assert [_half_sample(n) for n in (10, 6, 256, 316)] == [False, True, True, False]  # 316: 630 = 2.3.3.5.7, 632 = 8.79
    h, w = 10, 6
    spectrum = torch.exp(-0.7 * _two_sided(h, h)[:, None] - 0.3 * _two_sided(w, w)[None, :]).view(1, 1, h, w)
    rows = [*range(h), *range(h - 2, 0, -1)]  # whole-sample: period 2(h - 1)
    cols = [*range(w), *reversed(range(w))]  # half-sample: period 2w
    E = torch.zeros(len(rows) * len(cols), h * w, dtype=torch.float64)
    for i, r in enumerate(rows):
        for j, c in enumerate(cols):
            E[i * len(cols) + j, r * w + c] = 1.0
    Fh, Fw = (torch.fft.fft(torch.eye(n, dtype=torch.complex128), norm="ortho") for n in (len(rows), len(cols)))
    F = torch.kron(Fh, Fw)
    grid = torch.exp(-0.7 * _two_sided(h, len(rows))[:, None] - 0.3 * _two_sided(w, len(cols))[None, :])
    Ec = E.to(torch.complex128)
    dense = (Ec.T @ F.conj().T @ torch.diag(1.0 / grid.flatten().to(torch.complex128)) @ F @ Ec).real / 4
    v = torch.randn(2, 1, h, w, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    q = symmetric_prior_precision(spectrum, h, w)
    torch.testing.assert_close(q(v).flatten(1), v.flatten(1) @ dense.T)
    ramp = torch.linspace(-0.5, 0.5, h, dtype=torch.float64).view(1, 1, h, 1).expand(1, 1, h, w)  # zero mean
    periodic = (torch.fft.fft2(ramp, norm="ortho").abs().square() / spectrum).sum()
    assert float((ramp * q(ramp)).sum()) < 0.5 * float(periodic)


@pytest.mark.parametrize("kernel", ["gaussian", "motion"])
def test_wiener_start_on_a_reflect_blur_is_no_worse_than_the_adjoint(kernel):
    """NFC's default start on a flat-plus-edge image blurred with reflect boundary: the Wiener
    estimate (the spectrum NFC's ``spectrum: auto`` picks, then ``initial_estimate``) is at least
    as close to the image as the adjoint start, less a margin. A prior that joins opposite
    borders, or a spectrum fitted to the early-stopped A^+ y, fails this on the motion blur."""
    truth = _flat_plus_edge(128)
    k = gaussian_kernel(61, 3.0) if kernel == "gaussian" else motion_kernel(61, 0.5, np.random.default_rng(0))
    op = BlurOperator(k, "reflect")
    y = op.A(truth) + 0.025 * torch.randn(truth.shape, generator=torch.Generator().manual_seed(0))
    shape = tuple(truth.shape)
    prob = to_model_units(op, y, 0.025, shape)
    spectrum = spectrum_for("auto", _PowerLawPrior(), op, prob.y, shape, True)
    wiener = to_image_units(initial_estimate(op, prob.y, prob.sigma, shape, "wiener", spectrum)).clamp(0, 1)
    adjoint = to_image_units(initial_estimate(op, prob.y, prob.sigma, shape, "adjoint")).clamp(0, 1)
    assert float(psnr(wiener, truth)) >= float(psnr(adjoint, truth)) + 0.5


def test_the_restore_command_restores_a_valid_blur_to_the_scene_it_measured(tmp_path):
    """boundary: valid through the command line: simulate keeps the whole image as the truth and a
    measurement smaller by the kernel less one; restore writes the whole scene, scored against it."""
    import csv
    import json as _json

    from diffusers import UNet2DModel

    from nfc_dps.cli import main
    from nfc_dps.io import read_image, write_image

    torch.manual_seed(0)
    unet = UNet2DModel(sample_size=16, in_channels=3, out_channels=3, block_out_channels=(8, 16),
                       norm_num_groups=4, layers_per_block=1,
                       down_block_types=("DownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "UpBlock2D"))
    unet.save_pretrained(tmp_path / "prior")
    (tmp_path / "prior" / "nfc_dps_prior.json").write_text(_json.dumps({"parameterization": "edm"}))
    yy, xx = np.mgrid[0:32, 0:32] / 31.0
    (tmp_path / "clean").mkdir()
    write_image(tmp_path / "clean" / "a.png", np.stack([xx, yy, 0.5 + 0.3 * np.sin(6 * xx)], -1).astype(np.float32))
    task = ["--task", "deblur_gaussian", "--param", "kernel_size=5", "--param", "kernel_std=1.0",
            "--param", "boundary=valid"]
    assert main(["simulate", "-i", str(tmp_path / "clean"), "-o", str(tmp_path / "sim"), *task, "-q"]) == 0
    assert read_image(tmp_path / "sim" / "measurements" / "a.png")[0].shape == (28, 28, 3)
    assert main(["restore", "--config", str(tmp_path / "sim" / "simulation.json"), "-o", str(tmp_path / "out"),
                 "--prior", str(tmp_path / "prior"), "--steps", "2", "-q"]) == 0
    assert read_image(tmp_path / "out" / "a.png")[0].shape == (28, 28, 3)  # the photo's frame
    with open(tmp_path / "out" / "results.csv") as f:
        row = next(csv.DictReader(f))
    assert row["status"] == "done" and float(row["psnr"]) > 15 and row["extent"] == "photo", row
    assert main(["restore", "--config", str(tmp_path / "sim" / "simulation.json"), "-o", str(tmp_path / "scene"),
                 "--prior", str(tmp_path / "prior"), "--steps", "2", "--keep-border", "-q"]) == 0
    assert read_image(tmp_path / "scene" / "a.png")[0].shape == (32, 32, 3)  # the scene it measured


def test_a_task_named_on_the_command_line_or_in_the_api_gets_the_configs_boundary(tmp_path, prior_dir):
    """One default per task: the registry's blur tasks, build_operator by name, simulate and restore
    with --task all give the boundary the shipped configs give (valid: a photograph's), so that
    simulate -> restore round-trips with it."""
    import json as _json

    from nfc_dps.cli import main
    from nfc_dps.io import read_image, write_image
    from nfc_dps.operators import TASKS

    for name in ("deblur_gaussian.yaml", "deblur_motion.yaml"):
        task = parse_task(load_mapping(CONFIGS / name), name)
        assert TASKS[task.task].params["boundary"] == task.params["boundary"] == "valid"
    assert all(t.params["boundary"] == "valid" for t in TASKS.values() if "boundary" in t.params)
    assert build_operator("deblur_gaussian", 128).boundary == "valid"
    yy, xx = np.mgrid[0:32, 0:32] / 31.0
    (tmp_path / "clean").mkdir()
    write_image(tmp_path / "clean" / "a.png", np.stack([xx, yy, 0.5 + 0.3 * np.sin(6 * xx)], -1).astype(np.float32))
    task = ["--task", "deblur_motion", "--param", "kernel_size=5"]
    assert main(["simulate", "-i", str(tmp_path / "clean"), "-o", str(tmp_path / "sim"), *task, "-q"]) == 0
    assert read_image(tmp_path / "sim" / "measurements" / "a.png")[0].shape == (28, 28, 3)
    assert _json.loads((tmp_path / "sim" / "simulation.json").read_text())["task"]["boundary"] == "valid"
    assert main(["restore", "-i", str(tmp_path / "sim"), "-o", str(tmp_path / "out"), *task, "--prior", prior_dir,
                 "--steps", "2", "-q"]) == 0
    assert _json.loads((tmp_path / "out" / "resolved_config.json").read_text())["task"]["boundary"] == "valid"
    assert read_image(tmp_path / "out" / "a.png")[0].shape == (28, 28, 3)  # the photo's frame


def test_simulate_refuses_a_valid_blur_kernel_larger_than_the_image_before_writing(tmp_path, capsys):
    """simulate with boundary valid: a kernel larger than the first image (no measurement), or than
    the measurement it leaves (which restore refuses), is one usage error naming the kernel, the
    file and its size before anything is written; a later such image fails by name, the others are
    simulated."""
    from nfc_dps.cli import main
    from nfc_dps.io import write_image

    yy, xx = np.mgrid[0:32, 0:32] / 31.0
    img = np.stack([xx, yy, 0.5 + 0.3 * np.sin(6 * xx)], -1).astype(np.float32)
    task = ["--task", "deblur_gaussian", "--param", "kernel_size=9", "-q"]
    for side, needle in ((8, "larger than the 8x8 image"), (12, "the 12x12 image leaves a measurement restore refuses")):
        inp, out = tmp_path / f"in{side}", tmp_path / f"out{side}"
        inp.mkdir()
        write_image(inp / "a.png", img[:side, :side])
        write_image(inp / "b.png", img)
        assert main(["simulate", "-i", str(inp), "-o", str(out), *task]) == 2
        err = capsys.readouterr().err
        assert "a.png" in err and "9x9 blur kernel" in err and needle in err and "Traceback" not in err
        assert not out.exists()
    inp = tmp_path / "later"
    inp.mkdir()
    write_image(inp / "a.png", img)
    write_image(inp / "b.png", img[:12, :12])
    assert main(["simulate", "-i", str(inp), "-o", str(tmp_path / "sim"), *task]) == 1
    err = capsys.readouterr().err
    assert "FAILED b.png" in err and "9x9 blur kernel" in err and "12x12 image" in err
    assert sorted(p.name for p in (tmp_path / "sim" / "measurements").iterdir()) == ["a.png"]
