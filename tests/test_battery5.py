"""The fifth reliability battery (issue 51). Each test repeats a repro of the issue; each failed on
the code before its fix."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
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


# -- P1: auto on a toned black-and-white photo or a gray scan with a coloured stamp


def _camera(size: int = 256) -> np.ndarray:
    from skimage import data, transform

    return transform.resize(data.camera().astype(np.float64) / 255, (size, size), anti_aliasing=True)


TONE = np.array([1.0, 0.85, 0.65])  # sepia: one gray image, scaled per channel


def test_auto_reads_a_sepia_photo_with_independent_noise_per_channel() -> None:
    from nfc_dps.noise_level import estimate_sigma

    gray = _camera()
    noise = 0.05 * np.random.default_rng(0).standard_normal((3, *gray.shape))
    y = TONE[:, None, None] * gray + noise
    assert estimate_sigma(torch_tensor(y)) == pytest.approx(0.05, rel=0.15)


def test_auto_reads_a_toned_photo_whose_channels_share_one_noise_draw() -> None:
    """The grain of the gray photo, toned afterwards: each channel's noise is the gray's, scaled;
    the channels' differences cancel it. Today's code read the floor (0.001)."""
    from nfc_dps.noise_level import estimate_sigma

    gray = _camera() + 0.05 * np.random.default_rng(1).standard_normal((256, 256))
    y = TONE[:, None, None] * gray
    rms = 0.05 * float(np.sqrt(np.mean(TONE**2)))  # the channels' noise levels, combined
    assert estimate_sigma(torch_tensor(y)) == pytest.approx(rms, rel=0.15)
    png = np.round(np.clip(y, 0, 1) * 255) / 255  # as an 8-bit file holds it
    assert estimate_sigma(torch_tensor(png)) == pytest.approx(rms, rel=0.15)


def test_auto_reads_a_gray_scan_with_a_small_coloured_stamp() -> None:
    from nfc_dps.noise_level import estimate_sigma

    gray = _camera() + 0.05 * np.random.default_rng(2).standard_normal((256, 256))
    y = np.stack([gray] * 3)
    y[0, 20:60, 180:230] += 0.3  # a red stamp: the channels are no longer equal
    y[1:, 20:60, 180:230] -= 0.2
    assert estimate_sigma(torch_tensor(y)) == pytest.approx(0.05, rel=0.15)


def torch_tensor(a: np.ndarray):
    import torch

    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))


# -- P3: a nonlinear map in raw sensor counts


def test_a_nonlinear_map_in_raw_counts_is_refused_in_words(tiny_prior) -> None:
    import torch

    import nfc_dps
    from nfc_dps.operators import FunctionOperator

    op = FunctionOperator(lambda v: 1e5 * v**2, (3, 16, 16), (3, 16, 16), linear=False)
    y = op.A(torch.full((1, 3, 16, 16), 0.7))[0]
    with pytest.raises(ValueError, match=r"reaches 4\.9e\+04.*rescale it to about \[0, 1\]"):
        nfc_dps.restore(y, op, prior=str(tiny_prior), sigma_y=0.01, progress=False)


# -- P9: file names as spreadsheet formulas in results.csv


def test_a_file_name_that_is_a_formula_is_quoted_in_results_csv(tmp_path, prior_dir) -> None:
    from test_cli import rows

    inp, out = tmp_path / "in", tmp_path / "out"
    inp.mkdir()
    names = ["=HYPERLINK(1).png", "+1.png", "-2.png", "@SUM(A1).png", "plain.png"]
    for i, name in enumerate(names):
        write_image(inp / name, smooth(phase=i))
    assert run("restore", "-i", inp, "-o", out, "--task", "denoise", prior=prior_dir) == 0
    written = {r["name"]: r for r in rows(out)}
    assert set(written) == {"'" + n for n in names[:4]} | {"plain.png"}
    assert written["'=HYPERLINK(1).png"]["output"] == "'=HYPERLINK(1).png"  # the output's name too
    assert (out / "=HYPERLINK(1).png").is_file()  # the files keep their names


# -- P10: a calibration file's fit


@pytest.mark.parametrize("fit, key", [
    ("x", "key fit must be an object"), ([1, 2], "key fit must be an object"), (None, "key fit must be an object"),
    ({"mean_spread_range": "wide"}, "fit.mean_spread_range"), ({"mean_spread_range": [1.0]}, "fit.mean_spread_range"),
    ({"mean_spread_range": [0.2, 0.1]}, "fit.mean_spread_range"),
    ({"mean_spread_range": [float("nan"), 0.1]}, "fit.mean_spread_range"),
    ({"mean_spread_range": ["a", "b"]}, "fit.mean_spread_range"),
])
def test_a_calibration_whose_fit_is_malformed_is_refused_at_load_naming_the_key(tmp_path, prior_dir, fit, key) -> None:
    import json

    from test_folder_safety import _calibration_file

    from nfc_dps.conformal import CalibrationError, load_calibration

    path = _calibration_file(tmp_path, prior_dir)
    d = json.loads(path.read_text())
    d["fit"] = fit
    path.write_text(json.dumps(d))
    with pytest.raises(CalibrationError, match=key) as e:
        load_calibration(path)
    assert str(path) in str(e.value)
    d["fit"] = {"mean_spread_range": [0.01, 0.02], "images": ["a.png"]}
    path.write_text(json.dumps(d))
    assert load_calibration(path).fit["mean_spread_range"] == [0.01, 0.02]


# -- P7: an all-black inpainting mask


def test_an_all_black_mask_is_refused_naming_the_file(tmp_path, prior_dir, capsys) -> None:
    a, out = _one_input(tmp_path)
    mask = tmp_path / "mask.png"
    write_image(mask, np.zeros((32, 32), np.float32))
    assert run("restore", "-i", a, "-o", out, "--task", "inpaint_mask", "--mask", mask, prior=prior_dir) == 2
    err = capsys.readouterr().err
    assert str(mask) in err and "observes no pixel" in err and "Traceback" not in err
    assert not out.exists()
    masks = tmp_path / "masks"  # a folder of masks: that image fails, naming its mask
    masks.mkdir()
    write_image(masks / "a.png", np.zeros((32, 32), np.float32))
    assert run("restore", "-i", a, "-o", out, "--task", "inpaint_mask", "--mask", masks, prior=prior_dir) == 1
    assert "observes no pixel" in capsys.readouterr().err


# -- P6: the API checks a calibration's precision as the CLI does


def test_the_api_refuses_a_calibration_fitted_in_another_precision(tmp_path, prior_dir) -> None:
    import json

    import torch
    from test_folder_safety import _calibration_file

    from nfc_dps import build_operator, restore
    from nfc_dps.conformal import CalibrationError
    from nfc_dps.priors.default import load_prior
    from nfc_dps.samplers import get_config

    path = _calibration_file(tmp_path, prior_dir)  # nfc/fast, K = 2, denoise at 0.025
    d = json.loads(path.read_text())
    prior = load_prior(prior_dir)
    other = {"float32": "bfloat16", "bfloat16": "float32"}[prior.precision]
    d["prior"]["precision"] = other
    path.write_text(json.dumps(d))
    with pytest.raises(CalibrationError, match=f"in {other}, this run's prior runs in {prior.precision}"):
        restore(torch.rand(1, 3, 16, 16), build_operator("denoise"), prior=prior, method="nfc",
                config=get_config("nfc", "fast", num_levels=2), num_samples=2, sigma_y=0.025, calibration=path,
                progress=False)


# -- P13: non-physical Poisson peaks


@pytest.mark.parametrize("peak", [1e-320, 1e-6, 1e30, 1e12])
def test_a_poisson_peak_no_sensor_counts_is_refused(tmp_path, capsys, peak) -> None:
    from nfc_dps.noise import PoissonGaussianNoise, PoissonNoise

    for make in (lambda: PoissonNoise(peak), lambda: PoissonGaussianNoise(peak, 0.01)):
        with pytest.raises(ValueError, match="is no photon count"):
            make()
    a, _ = _one_input(tmp_path)
    assert run("simulate", "-i", a.parent, "-o", tmp_path / "sim", "--task", "denoise", "--noise",
               f"poisson:{peak:g}") == 2
    err = capsys.readouterr().err
    assert "is no photon count" in err and "Traceback" not in err


def test_the_largest_peak_still_counts_photons() -> None:
    import torch

    from nfc_dps.noise import MAX_PEAK, PoissonNoise

    y = PoissonNoise(MAX_PEAK).sample(torch.full((1, 1, 8, 8), 1.0), torch.Generator().manual_seed(0))
    assert (y > 0.99).all() and (y < 1.01).all()


# -- P8: a denoiser-only prior at the top of its range for a noisier measurement


def test_a_denoiser_only_prior_below_the_noise_is_a_warning_naming_both_levels() -> None:
    import torch

    import nfc_dps
    from nfc_dps.priors.denoiser import DenoiserPrior
    from nfc_dps.samplers.common import PriorRangeWarning

    prior = DenoiserPrior(lambda x, sigma: x, sigma_max=50 / 255)
    op = nfc_dps.build_operator("denoise", 8)
    y = torch.full((1, 3, 8, 8), 0.5)
    with pytest.warns(PriorRangeWarning, match=r"noise level 0\.25 .*prior's range \(top 0\.1961\)"):
        nfc_dps.restore(y, op, prior=prior, sigma_y=0.25, progress=False)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", PriorRangeWarning)
        nfc_dps.restore(y, op, prior=prior, sigma_y=0.1, progress=False)  # within its range: no warning


# -- P5: a user prior's fingerprint probes the whole range the samplers call


def _above(level):
    """A diffusion model's denoiser of [0, 1] units that smooths more above ``level`` only."""
    def fn(x, sigma):
        mean = torch.nn.functional.avg_pool2d(torch.nn.functional.pad(x, (1, 1, 1, 1), mode="replicate"), 3, stride=1)
        strong = (sigma > level).to(x.dtype).view(-1, 1, 1, 1)
        return (1 - 0.5 * strong) * x + 0.5 * strong * mean

    return fn


def test_priors_that_differ_only_at_high_noise_have_other_fingerprints() -> None:
    from nfc_dps.conformal import prior_fingerprint
    from nfc_dps.priors import DenoiserPrior

    # model units 2 * [0, 1] units: the first differs above sigma 2 (model), the second above 20
    a = DenoiserPrior(_above(1.0), 40.0, denoiser_only=False)
    b = DenoiserPrior(_above(10.0), 40.0, denoiser_only=False)
    assert prior_fingerprint(a) != prior_fingerprint(b)
    assert prior_fingerprint(a) == prior_fingerprint(DenoiserPrior(_above(1.0), 40.0, denoiser_only=False))


def test_a_denoisers_probe_is_three_levels_as_before() -> None:
    """A denoiser's range (here 0.4 in model units) holds three of the probe's levels: its probe,
    and so its fingerprint, are those of the earlier three-level probe."""
    from nfc_dps.fingerprint import _probe_digest
    from nfc_dps.priors import DenoiserPrior

    seen = []

    def fn(x, sigma):
        seen.append(sigma.tolist())
        return x

    _probe_digest(DenoiserPrior(fn, 0.2))
    assert seen and all(s == pytest.approx([0.025, 0.1, 0.2]) for s in seen)  # twice: the determinism check


# -- P11: a user prior with unseeded randomness is named as not deterministic, not "other weights"


def _jittery(x, sigma):  # numpy's generator: torch's seed does not fix it
    return x + torch.from_numpy(np.random.default_rng().normal(0, 0.01, x.shape)).to(x.dtype)


def test_a_prior_with_unseeded_randomness_is_named_not_deterministic() -> None:
    from nfc_dps.conformal import CalibrationError, prior_fingerprint
    from nfc_dps.priors import DenoiserPrior

    with pytest.raises(CalibrationError, match="prior DenoiserPrior is not deterministic.*numpy.random"):
        prior_fingerprint(DenoiserPrior(_jittery, 0.2))


def test_the_api_names_a_non_deterministic_prior_before_restoring() -> None:
    import nfc_dps
    from nfc_dps.config import get_config
    from nfc_dps.conformal import Calibration, CalibrationError, sampler_fields
    from nfc_dps.priors import DenoiserPrior

    cal = Calibration(q=1.5, coverage=0.9, rule="pooled", eps=1e-3, n_images=9, num_samples=2, method="nfc",
                      preset="fast", sampler=sampler_fields(get_config("nfc", "fast")),
                      prior={"fingerprint": "0123456789abcdef"}, task={"task": "denoise", "noise_sigma": 0.025})
    op = nfc_dps.build_operator("denoise", image_size=(16, 16))
    with pytest.raises(CalibrationError, match="not deterministic") as e:
        nfc_dps.restore(torch.full((1, 3, 16, 16), 0.5), op, DenoiserPrior(_jittery, 0.2), preset="fast",
                        num_samples=2, calibration=cal, progress=False)
    assert "other weights" not in str(e.value)


# -- P12: a Poisson simulation restored without --noise is told --noise poisson:PEAK


def test_a_poisson_simulation_restored_without_noise_names_the_flag(tmp_path, prior_dir, capsys) -> None:
    a, out = _one_input(tmp_path)
    sim = tmp_path / "sim"
    assert run("simulate", "-i", a.parent, "-o", sim, "--task", "denoise", "--noise", "poisson:10") == 0
    assert run("restore", "-i", sim / "measurements", "-o", out, "--task", "denoise", "--preset", "fast",
               prior=prior_dir) != 0
    err = capsys.readouterr().err
    assert "--noise poisson:PEAK" in err and "simulation.json" in err
    assert "divide 8-bit data by 255" not in err and "sigma_y=" not in err


def test_the_api_names_the_poisson_noise_model_for_counts_above_one() -> None:
    import nfc_dps

    op = nfc_dps.build_operator("denoise", image_size=(16, 16))
    with pytest.raises(ValueError, match=r"noise=PoissonNoise\(peak\)"):
        nfc_dps.restore(torch.full((1, 3, 16, 16), 1.8), op, progress=False)
    with pytest.raises(ValueError, match="divide 8-bit data by 255") as e:  # negative values: no Poisson advice
        nfc_dps.restore(torch.full((1, 3, 16, 16), -1.0), op, progress=False)
    assert "Poisson" not in str(e.value)


# -- P14: NaN from the user's own denoiser or operator is named, not blamed on the step size; a
# nonlinear A of zero gradient is refused


def _smooth3(x, sigma):
    return torch.nn.functional.avg_pool2d(torch.nn.functional.pad(x, (1, 1, 1, 1), mode="replicate"), 3, stride=1)


def _nan_above(x, sigma):  # a user's denoiser that breaks at high noise levels
    out = _smooth3(x, sigma)
    return torch.where((sigma > 0.1).view(-1, 1, 1, 1), torch.full_like(out, float("nan")), out)


@pytest.mark.parametrize("method", ["nfc", "dps", "diffpir"])
def test_nan_from_the_users_denoiser_names_the_prior(method) -> None:
    import nfc_dps
    from nfc_dps.priors import DenoiserPrior

    op = nfc_dps.build_operator("sr_bicubic", image_size=(16, 16))
    with pytest.raises(FloatingPointError, match=r"the prior's denoiser \(DenoiserPrior\) returned NaN/Inf") as e:
        nfc_dps.restore(torch.full((1, 3, 4, 4), 0.5), op, DenoiserPrior(_nan_above, 40.0, denoiser_only=False),
                        method=method, preset="fast", progress=False)
    assert "step size" in str(e.value) and "smaller step size" not in str(e.value)


def test_a_nonlinear_map_not_finite_beyond_0_1_is_refused_up_front() -> None:
    from nfc_dps.operators import FunctionOperator

    with pytest.raises(ValueError, match=r"A gives NaN/Inf on images in \[-0.5, 1.5\].*clamp its input"):
        FunctionOperator(torch.sqrt, (3, 16, 16), (3, 16, 16), linear=False, name="root")
    FunctionOperator(lambda x: torch.sqrt(x.clamp(0, 1)), (3, 16, 16), (3, 16, 16), linear=False)  # clamped: kept


def test_nan_from_the_users_operator_beyond_0_1_names_the_operator() -> None:
    import nfc_dps
    from nfc_dps.operators import NonlinearFunctionOperator
    from nfc_dps.priors import DenoiserPrior

    op = NonlinearFunctionOperator(torch.sqrt, (3, 16, 16), (3, 16, 16), name="root")  # past the up-front check
    with pytest.raises(FloatingPointError, match=r"the operator root .*A gives NaN/Inf on images in \[-0.5, 1.5\]"):
        nfc_dps.restore(torch.full((1, 3, 16, 16), 0.5), op, DenoiserPrior(_smooth3, 40.0, denoiser_only=False),
                        method="dps", preset="fast", progress=False)


@pytest.mark.parametrize("A", [lambda x: torch.round(4 * x) / 4, lambda x: x.detach() ** 2,
                               lambda x: torch.zeros_like(x) + 0.3])
def test_a_nonlinear_map_of_zero_gradient_is_refused(A) -> None:
    from nfc_dps.operators import FunctionOperator

    with pytest.raises(ValueError, match="A's gradient is zero.*would ignore the measurement"):
        FunctionOperator(A, (3, 8, 8), (3, 8, 8), linear=False)
    FunctionOperator(lambda x: torch.clamp(2 * x, 0, 1), (3, 8, 8), (3, 8, 8), linear=False)  # zero in part: kept


# -- P15: a bad --param under --noise is the --param's; a spec error names the spec once


@pytest.mark.parametrize("flags, message", [
    (["--noise", "poisson:10", "--param", "sigma=abc"], "error: --param: unknown key 'sigma'"),
    (["--noise", "poisson:abc"], "error: --noise 'poisson:abc': peak must be numbers"),
    (["--noise", "gaussian:12"], "error: --noise 'gaussian:12': sigma must be in [0, 1]"),
])
def test_noise_and_param_errors_name_their_own_flag_once(tmp_path, capsys, flags, message) -> None:
    a, _ = _one_input(tmp_path)
    assert run("simulate", "-i", a.parent, "-o", tmp_path / "sim", "--task", "deblur_gaussian", *flags) == 2
    err = capsys.readouterr().err
    assert message in err and "key 'noise' noise" not in err and err.count("poisson:abc") <= 1


def test_a_config_files_noise_spec_is_named_once(tmp_path) -> None:
    from nfc_dps.config import ConfigError, parse_task

    with pytest.raises(ConfigError, match=r"^c.yaml: key 'noise' 'poisson:abc': peak must be numbers$"):
        parse_task({"task": "denoise", "noise": "poisson:abc"}, "c.yaml")


# -- P17: phase retrieval with a method of a linear data step is refused before the prior loads


@pytest.mark.parametrize("method", ["diffpir", "ddnm", "ddrm"])
def test_phase_retrieval_with_a_linear_method_is_refused_up_front(tmp_path, capsys, method) -> None:
    a, out = _one_input(tmp_path)
    sim = tmp_path / "sim"
    assert run("simulate", "-i", a.parent, "-o", sim, "--task", "phase_retrieval") == 0
    capsys.readouterr()
    # a prior that does not exist: the refusal comes before it would load
    assert run("restore", "-i", sim / "measurements", "-o", out, "--task", "phase_retrieval", "--method", method,
               prior=str(tmp_path / "no_prior")) == 2
    err = capsys.readouterr().err
    assert f"--method {method}" in err and "needs a linear operator" in err and "cannot load" not in err
    assert not out.exists()


# -- P18: --restarts has an upper bound, as --samples


def test_restarts_beyond_the_bound_are_refused_stating_the_cost(tmp_path, capsys) -> None:
    a, out = _one_input(tmp_path)
    assert run("restore", "-i", a, "-o", out, "--task", "denoise", "--preset", "fast", "--restarts", "1000000000",
               prior=str(tmp_path / "no_prior")) == 2
    err = capsys.readouterr().err
    assert "--restarts 1000000000" in err and "at most 10,000 restarts" in err and "cannot load" not in err
    assert not out.exists()


# -- P21: --steps 0 --export on a new work folder would export random weights; P22: an unwritable
# --export is found before training


def _train_images(tmp_path: Path) -> Path:
    d = tmp_path / "images"
    d.mkdir()
    for i in range(3):
        write_image(d / f"im{i}.png", smooth(48, phase=i))
    return d


def _train_cfg(workdir: Path, images: Path, **kw):
    from nfc_dps.training import TrainConfig

    base = dict(workdir=workdir, images=images, widths=(8, 16), crop=16, batch=4, log_every=2, progress=False,
                eval_crop=32)
    return TrainConfig(**{**base, **kw})


def test_steps_0_on_a_new_work_folder_is_refused(tmp_path) -> None:
    from nfc_dps.training import TrainingError, train_prior

    images = _train_images(tmp_path)
    with pytest.raises(TrainingError, match="--steps 0 .*holds no saved state: it would export untrained, random"):
        train_prior(_train_cfg(tmp_path / "w", images, steps=0, export=tmp_path / "p"), log=lambda m: None)
    assert not (tmp_path / "p").exists() and not (tmp_path / "w").exists()


@pytest.mark.parametrize("where", ["a_file", "under_a_file"])
def test_an_unwritable_export_is_refused_before_training(tmp_path, where) -> None:
    from nfc_dps.training import TrainingError, train_prior

    images = _train_images(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    export = tmp_path / "notes.txt" if where == "a_file" else tmp_path / "notes.txt" / "prior"
    lines: list[str] = []
    with pytest.raises(TrainingError, match=f"--export {export}.*(is a file|a file, not a folder)"):
        train_prior(_train_cfg(tmp_path / "w", images, steps=3, save_every=100, export=export), log=lines.append)
    assert not (tmp_path / "w").exists() and not lines  # no step trained, no work folder left
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_an_export_in_a_read_only_folder_is_refused_before_training(tmp_path, monkeypatch) -> None:
    import tempfile as tf

    from nfc_dps.training import TrainingError, train_prior

    images = _train_images(tmp_path)
    locked = tmp_path / "locked"
    locked.mkdir()
    real = tf.mkstemp

    def mkstemp(*a, dir=None, **kw):  # a read-only folder, also for root (who may write anywhere)
        if dir is not None and Path(dir) == locked:
            raise PermissionError(13, "Permission denied")
        return real(*a, dir=dir, **kw)

    monkeypatch.setattr(tf, "mkstemp", mkstemp)
    with pytest.raises(TrainingError, match=f"--export {locked / 'p'}: cannot write in {locked} "
                                            r"\(Permission denied\)"):
        train_prior(_train_cfg(tmp_path / "w", images, steps=3, export=locked / "p"), log=lambda m: None)


# -- P23: Measurement and sample_chains check their inputs


def test_measurement_refuses_what_no_sampler_can_restore() -> None:
    import nfc_dps
    from nfc_dps.noise import PoissonNoise
    from nfc_dps.samplers.chains import Measurement

    sr = nfc_dps.build_operator("sr_bicubic", image_size=(16, 16))
    mask = nfc_dps.build_operator("inpaint_random", image_size=(16, 16))
    y = torch.rand(1, 3, 4, 4)
    cases = [
        (lambda: Measurement(mask, torch.rand(1, 3, 8, 8), 0.01), ValueError, "cannot measure images of shape"),
        (lambda: Measurement(sr, y, 0.01, (1, 3, 16.5, 16)), ValueError, "image_shape must be four integers"),
        (lambda: Measurement(sr, y, 0.01, (1, 3, 32, 32)), ValueError, r"y has shape \(1, 3, 4, 4\), but"),
        (lambda: Measurement(sr, y.numpy(), 0.01), TypeError, "y must be a torch.Tensor"),
        (lambda: Measurement(sr, torch.full((1, 3, 4, 4), float("nan")), 0.01), ValueError, "NaN"),
        (lambda: Measurement(sr, y, 5.0), ValueError, "divide by 255"),
        (lambda: Measurement(sr, y - 0.5, PoissonNoise(10)), ValueError, "cannot be negative"),
    ]
    for make, kind, message in cases:
        with pytest.raises(kind, match=message):
            make()


@pytest.mark.parametrize("kw, message", [(dict(max_batch=0), "max_batch must be an int >= 1 or None, got 0"),
                                         (dict(num_samples=0), "num_samples must be an int >= 1, got 0"),
                                         (dict(max_batch=2.5), "max_batch must be an int")])
def test_sample_chains_refuses_a_batch_of_no_chain(kw, message) -> None:
    import nfc_dps
    from nfc_dps.config import get_config
    from nfc_dps.priors import DenoiserPrior
    from nfc_dps.samplers.chains import Measurement, sample_chains

    m = Measurement(nfc_dps.build_operator("denoise", image_size=(8, 8)), torch.rand(1, 3, 8, 8), 0.05)
    with pytest.raises(ValueError, match=message):
        sample_chains("nfc", DenoiserPrior(_smooth3, 0.2), m, get_config("nfc"), seeds=[0], **kw)


# -- P24: a refused pickle is named in nfc-dps' words, not torch's "weights_only=False will likely succeed"


class _Payload:
    pass


def test_a_pickle_refusal_names_the_object_not_torchs_advice(tmp_path) -> None:
    from nfc_dps.priors.adm_convert import load_adm_state_dict
    from nfc_dps.training import TrainingError
    from nfc_dps.training.state import read_state

    path = tmp_path / "state.pt"
    torch.save({"model": {}, "ema": {}, "opt": {}, "step": 1, "evil": _Payload()}, path)
    with pytest.raises(TrainingError) as e:
        read_state(path)
    with pytest.raises(ValueError) as f:
        load_adm_state_dict(path)
    for message in (str(e.value), str(f.value)):
        assert "it pickles the Python object test_battery5._Payload" in message
        assert "weights_only" not in message and "can still be loaded" not in message and "\x1b" not in message


# -- P24: a calibration of a precision no --precision gives is not told to pass it


def test_a_float64_calibration_is_not_told_to_pass_precision_float64(tmp_path, prior_dir) -> None:
    import json

    from test_folder_safety import _calibration_file

    from nfc_dps.conformal import CalibrationError, load_calibration
    from nfc_dps.priors.default import load_prior
    from nfc_dps.samplers import get_config

    path = _calibration_file(tmp_path, prior_dir)
    d = json.loads(path.read_text())
    d["prior"]["precision"] = "float64"
    path.write_text(json.dumps(d))
    prior = load_prior(prior_dir)
    cal = load_calibration(path)
    with pytest.raises(CalibrationError, match="fitted with the prior in float64") as e:
        cal.check_run("nfc", get_config("nfc", "fast", num_levels=2), 2, prior, task=cal.task)
    assert "--precision float64" not in str(e.value) and "no --precision runs a prior in float64" in str(e.value)
    d["prior"]["precision"] = other = {"float32": "bfloat16", "bfloat16": "float32"}[prior.precision]
    path.write_text(json.dumps(d))
    with pytest.raises(CalibrationError, match=f"pass --precision {other}"):
        load_calibration(path).check_run("nfc", get_config("nfc", "fast", num_levels=2), 2, prior, task=cal.task)


# -- P16: simulation.json's units say how a float-TIFF simulation is stored


@pytest.mark.parametrize("flags, says", [(["--task", "denoise", "--noise", "poisson:10"], "Poisson counts / peak"),
                                         (["--task", "phase_retrieval"], "phase_retrieval operator's values")])
def test_a_float_tiff_simulation_states_its_units(tmp_path, flags, says) -> None:
    import json

    a, _ = _one_input(tmp_path)
    assert run("simulate", "-i", a.parent, "-o", tmp_path / "sim", *flags) == 0
    sim = json.loads((tmp_path / "sim" / "simulation.json").read_text())
    assert sim["images"][0]["measurement"].endswith(".tif")
    assert "float32 TIFF" in sim["units"] and says in sim["units"]
    assert "clipped to [0, 1]" not in sim["units"] and "PNG" not in sim["units"]


# -- P24: train-prior stopped by SIGTERM exits 143 as the other commands; a torchrun rank other
# than 0 does not print "interrupted" again


@pytest.mark.parametrize("signal_name, code, said", [("SIGTERM", 143, "terminated (SIGTERM)"),
                                                     ("SIGINT", 130, "interrupted")])
def test_train_prior_stopped_by_a_signal_exits_as_the_other_commands(tmp_path, monkeypatch, capsys, signal_name,
                                                                     code, said) -> None:
    from nfc_dps.cli import main, train_prior

    def stopped(*a, **kw):  # the training loop re-raises the signal's name once the state is saved
        raise KeyboardInterrupt(signal_name)

    monkeypatch.setattr(train_prior, "train_prior", stopped)
    argv = ["train-prior", "--workdir", str(tmp_path / "w"), "--steps", "5", "--quiet"]
    assert main(argv) == code
    assert f"nfc-dps train-prior: {said};" in capsys.readouterr().err
    monkeypatch.setenv("RANK", "1")  # another rank of a torchrun group: the same exit, no second line
    assert main(argv) == code
    assert "train-prior" not in capsys.readouterr().err


# -- P20: two train-prior runs exporting to one folder: the second is refused before training;
# train_info.json records the work folder that wrote it


def test_a_second_run_exporting_to_the_same_folder_is_refused(tmp_path) -> None:
    import json

    from nfc_dps.locking import file_lock
    from nfc_dps.training import TrainingError, train_prior

    images = _train_images(tmp_path)
    export = tmp_path / "priors" / "p"
    export.parent.mkdir()
    with file_lock(export):  # the first run, exporting there now
        with pytest.raises(TrainingError, match=f"--export {export}: another nfc-dps run .* is writing to {export}"):
            train_prior(_train_cfg(tmp_path / "w2", images, steps=2, export=export), log=lambda m: None)
    assert not export.exists() and not (tmp_path / "w2").exists()
    train_prior(_train_cfg(tmp_path / "w1", images, steps=2, export=export, seed=7), log=lambda m: None)
    info = json.loads((export / "train_info.json").read_text())
    assert info["workdir"] == str((tmp_path / "w1").resolve()) and info["seed"] == 7


# -- P19: a run killed between its state's save and its held-out row: the resumed run writes the row


def test_a_held_out_row_lost_after_the_state_save_is_written_on_resume(tmp_path) -> None:
    import csv

    from nfc_dps.training import train_prior

    images = tmp_path / "images"
    images.mkdir()
    for i in range(12):  # enough for a held-out image at --holdout 0.3
        write_image(images / f"im{i}.png", smooth(48, phase=i))
    cfg = _train_cfg(tmp_path / "w", images, steps=2, export=tmp_path / "p", holdout=0.3)
    train_prior(cfg, log=lambda m: None)
    path = tmp_path / "w" / "heldout.csv"
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    assert rows[-1][0] == "2"
    path.write_text("".join(",".join(r) + "\n" for r in rows[:-1]))  # killed before the row of step 2
    train_prior(cfg, log=lambda m: None)  # resumed: nothing to train
    with open(path, newline="") as f:
        assert [r[0] for r in csv.reader(f)][1:] == [r[0] for r in rows[1:]]
