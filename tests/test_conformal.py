"""Conformal calibration (nfc_dps/conformal.py, ``nfc-dps calibrate``, ``restore --calibration``):
the quantile against a brute-force search, coverage on exchangeable synthetic data, the file's
round trip, every refusal, and the command line end to end with a tiny random prior."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from nfc_dps.cli import main
from nfc_dps.conformal import (
    DEFAULT_EPS,
    EDGE_WEIGHTS,
    Calibration,
    CalibrationError,
    edge_strength,
    fit_quantile,
    fit_rule,
    interval,
    load_calibration,
    min_images,
    normalized_scores,
    prior_fingerprint,
)
from nfc_dps.io import read_image, write_image
from nfc_dps.noise import GaussianNoise
from nfc_dps.samplers import get_config

# ---------------------------------------------------------------- the quantile


def brute_force(scores, coverage, rule):
    """The smallest candidate q (every score value, and 0) meeting the rule's condition, evaluated
    literally: mean over images of the fraction of pixels with score > q."""
    n, alpha = len(scores), 1 - coverage
    cands = np.unique(np.concatenate([[0.0], *scores]))
    for q in cands:
        risk = np.mean([np.mean(s > q) for s in scores])
        ok = risk <= alpha + 1e-12 if rule == "pooled" else n / (n + 1) * risk + 1 / (n + 1) <= alpha + 1e-12
        if ok:
            return float(q)
    raise AssertionError("no candidate")


@pytest.mark.parametrize("rule", ["pooled", "risk-control"])
@pytest.mark.parametrize("coverage", [0.5, 0.8, 0.9])
@pytest.mark.parametrize("trial", range(4))
def test_quantile_equals_brute_force(rule, coverage, trial):
    rng = np.random.default_rng(trial)
    n = min_images(coverage) + int(rng.integers(0, 6))
    # images of different sizes, and ties (rounded scores)
    scores = [np.round(rng.exponential(1.0, int(rng.integers(3, 40))), 1 if trial % 2 else 6) for _ in range(n)]
    assert fit_quantile(scores, coverage, rule) == brute_force(scores, coverage, rule)


def test_min_images():
    assert [min_images(c) for c in (0.5, 0.8, 0.9, 0.95, 0.99)] == [1, 4, 9, 19, 99]
    assert min_images(0.85) == 6  # ceil(1 / 0.15) - 1


def test_risk_control_at_its_minimum_covers_every_calibration_pixel():
    rng = np.random.default_rng(0)
    scores = [rng.exponential(1.0, 50) for _ in range(9)]
    assert fit_quantile(scores, 0.9, "risk-control") == max(s.max() for s in scores)
    assert fit_quantile(scores, 0.9, "pooled") < max(s.max() for s in scores)


def test_each_image_weighs_the_same():
    """A large image with small scores does not outvote a small one with large scores."""
    scores = [np.zeros(1000), np.full(10, 5.0)]
    assert fit_quantile(scores, 0.5, "pooled") == 0.0  # half the images fully covered at q = 0
    assert fit_quantile(scores, 0.6, "pooled") == 5.0  # 60 %: the second image must be covered too


def _synthetic(rng, n, size=(3, 16, 16), scale=2.5):
    """Exchangeable images: a per-image std map (smooth, random level) and errors of `scale` times
    that std, correlated within the image by a shared per-image factor."""
    out = []
    for _ in range(n):
        std = rng.uniform(0.01, 0.1) * (1 + 0.5 * rng.random(size))
        level = rng.uniform(0.7, 1.3)  # within-image correlation: the whole image is off by a factor
        err = scale * level * std * rng.standard_normal(size)
        out.append((std, err))
    return out


@pytest.mark.parametrize("coverage", [0.8, 0.9])
def test_coverage_is_near_nominal_on_exchangeable_images(coverage):
    """Fitted on 60 images, the expected coverage of new images is 1 - alpha (pooled) and at least
    that (risk-control, which is guaranteed); averaged over 40 independent calibrations."""
    rng = np.random.default_rng(1)
    got = {"pooled": [], "risk-control": []}
    for _ in range(40):
        cal, test = _synthetic(rng, 60), _synthetic(rng, 30)
        scores = [normalized_scores(np.zeros_like(e), s, e, DEFAULT_EPS) for s, e in cal]
        for rule in got:
            q = fit_quantile(scores, coverage, rule)
            got[rule].append(np.mean([np.mean(normalized_scores(np.zeros_like(e), s, e) <= q) for s, e in test]))
    assert abs(np.mean(got["pooled"]) - coverage) < 0.01
    assert np.mean(got["risk-control"]) >= coverage - 0.005
    assert np.mean(got["risk-control"]) > np.mean(got["pooled"])  # the price of the guarantee


def test_interval_is_mean_plus_minus_q_std_clipped():
    mean = torch.tensor([0.0, 0.5, 1.0])
    std = torch.tensor([0.1, 0.1, 0.0])
    lo, hi = interval(mean, std, 2.0, eps=0.01)
    assert torch.allclose(lo, torch.tensor([0.0, 0.28, 0.98]))
    assert torch.allclose(hi, torch.tensor([0.22, 0.72, 1.0]))
    lo_np, hi_np = interval(mean.numpy(), std.numpy(), 2.0, eps=0.01)
    assert np.allclose(lo_np, lo.numpy()) and np.allclose(hi_np, hi.numpy())


# ---------------------------------------------------------------- errors of the fit


@pytest.mark.parametrize("bad", [0.0, 1.0, 1.5, -0.1, float("nan"), "x", True])
def test_coverage_outside_0_1_is_refused(bad):
    with pytest.raises(CalibrationError, match="coverage"):
        fit_quantile([np.ones(3)] * 20, bad)


def test_too_few_images_says_how_many():
    with pytest.raises(CalibrationError, match="8 calibration image.*at least 9"):
        fit_quantile([np.ones(4)] * 8, 0.9)
    with pytest.raises(CalibrationError, match="at least 19"):
        fit_quantile([np.ones(4)] * 18, 0.95, "risk-control")
    with pytest.raises(CalibrationError, match="rule must be"):
        fit_quantile([np.ones(4)] * 10, 0.9, "bonferroni")


# ---------------------------------------------------------------- the file


def _calibration(**kw) -> Calibration:
    cfg = get_config("nfc", "fast")
    base = dict(q=1.7, coverage=0.9, rule="pooled", eps=DEFAULT_EPS, n_images=12, num_samples=4, method="nfc",
                preset="fast", sampler=json.loads(json.dumps(__import__("dataclasses").asdict(cfg), default=str)),
                prior={"fingerprint": "abc", "path": "/p"},
                task={"task": "sr_bicubic", "factor": 4, "noise_sigma": 0.025})
    base.update(kw)
    return Calibration(**base)


# ---------------------------------------------------------------- the edge term and the fitted rule


def test_edge_strength_is_the_local_gradient_magnitude():
    """Zero on a flat or far from an edge; a unit vertical step gives 1/2 beside it after the 3 x 3
    mean (the Sobel norm / 8 is 1/2 on the two columns next to the step); tensor and array agree,
    per channel, on any leading shape."""
    flat = np.full((2, 3, 9, 9), 0.3)
    assert np.allclose(edge_strength(flat), 0)
    step = np.zeros((9, 12))
    step[:, 6:] = 1.0
    e = edge_strength(step)
    assert e.shape == step.shape and np.allclose(e[:, :3], 0) and np.allclose(e[:, 9:], 0)
    assert np.allclose(e[4, 5], e[4, 6]) and 0.3 < e[4, 6] <= 0.5 + 1e-12
    two = np.stack([step, np.zeros_like(step)])
    t = edge_strength(torch.from_numpy(two).float())
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float32
    assert np.allclose(t.numpy(), edge_strength(two), atol=1e-6) and np.allclose(edge_strength(two)[1], 0)


def _edge_error_images(n, scale_by_edge, seed=0):
    """n images (mean, std, truth) whose errors are Gaussian with std ``0.02 + 0.5 edge`` where
    scale_by_edge, else ``std``; the images differ in how much edge they hold."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        mean = np.zeros((1, 24, 24))
        mean[:, :, 12:] = i / n  # a step of height i/n: from no edge to a strong one
        std = np.full_like(mean, 0.02)
        err_std = std + 0.5 * edge_strength(mean) if scale_by_edge else std
        out.append((mean, std, mean + err_std * rng.standard_normal(mean.shape)))
    return out


def test_fit_rule_chooses_the_edge_weight_that_covers_images_evenly():
    """Errors that grow at edges: a positive edge weight covers the images more evenly than the std
    alone and the fit takes it; errors the std describes: the fit keeps c = 0. With c = 0 alone the
    rule is fit_quantile's."""
    edgy = fit_rule(_edge_error_images(20, True), 0.9)
    assert edgy.edge_weight > 0 and edgy.spread_by_weight[edgy.edge_weight] < edgy.spread_by_weight[0.0]
    assert set(edgy.spread_by_weight) == set(EDGE_WEIGHTS) and len(edgy.covered) == 20
    plain_images = _edge_error_images(20, False)
    assert fit_rule(plain_images, 0.9).edge_weight == 0.0
    only = fit_rule(plain_images, 0.9, edge_weights=(0.0,))
    assert only.q == fit_quantile([normalized_scores(m, s, x) for m, s, x in plain_images], 0.9)
    with pytest.raises(CalibrationError, match="edge_weights"):
        fit_rule(plain_images, 0.9, edge_weights=())


def test_interval_widens_with_the_edge_weight_and_unclipped_on_request():
    mean = np.zeros((1, 8, 8))
    mean[:, :, 4:] = 0.5
    std = np.full_like(mean, 0.01)
    lo0, hi0 = interval(mean, std, 2.0)
    lo1, hi1 = interval(mean, std, 2.0, edge_weight=1.0)
    assert np.all(hi1 - lo1 >= hi0 - lo0 - 1e-12) and (hi1 - lo1).max() > (hi0 - lo0).max()
    lo, hi = interval(mean, std, 100.0, clip=False)
    assert lo.min() < 0 and hi.max() > 1


def test_round_trip(tmp_path):
    cal = _calibration(fit={"images": ["a.png"], "coverage_in_sample": 0.9})
    path = cal.save(tmp_path / "cal.json")
    back = load_calibration(path)
    assert back.to_dict() == cal.to_dict() and back.source == str(path)
    assert load_calibration(back) is back
    assert load_calibration(json.loads(path.read_text())).q == cal.q
    edged = _calibration(edge_weight=2.0)
    assert load_calibration(edged.save(tmp_path / "e.json")).edge_weight == 2.0
    old = {**edged.to_dict(), "version": 1}
    old.pop("edge_weight")
    assert load_calibration(old).edge_weight == 0.0  # a version-1 file: the std alone
    with pytest.raises(CalibrationError, match="edge_weight must be a finite number >= 0"):
        load_calibration({**edged.to_dict(), "edge_weight": -1})


def test_unreadable_files_are_named(tmp_path):
    with pytest.raises(CalibrationError, match="missing.json: cannot read"):
        load_calibration(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(CalibrationError, match="bad.json: not valid JSON"):
        load_calibration(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text('{"kind": "run"}')
    with pytest.raises(CalibrationError, match="other.json: not a calibration file"):
        load_calibration(tmp_path / "other.json")
    d = _calibration().to_dict()
    for key, value, match in (("q", -1, "q must be"), ("coverage", 1.2, "coverage"), ("num_samples", 1, "num_samples"),
                              ("eps", None, "eps must be a finite number > 0, got None"), ("eps", "0.004", "eps must"),
                              ("eps", -0.1, "eps must"), ("rule", "median", "rule must be one of"),
                              ("method", 3, "method must be a string"), ("prior", "x", "prior must be an object"),
                              ("sampler", [1], "sampler must be an object"), ("task", "sr", "task must be an object")):
        (tmp_path / "x.json").write_text(json.dumps({**d, key: value}))
        with pytest.raises(CalibrationError, match=match):
            load_calibration(tmp_path / "x.json")
    (tmp_path / "x.json").write_text(json.dumps({k: v for k, v in d.items() if k != "prior"}))
    with pytest.raises(CalibrationError, match="missing key.*prior"):
        load_calibration(tmp_path / "x.json")


def test_check_refuses_every_other_run():
    cal = _calibration()
    cfg = get_config("nfc", "fast")
    task = {"task": "sr_bicubic", "factor": 4, "noise_sigma": 0.025}
    cal.check("nfc", cfg, 4, "abc", task=task)  # its own run
    cases = [
        (dict(method="daps", config=get_config("daps", "fast")), "method 'nfc'"),
        (dict(config=get_config("nfc", "paper")), "nfc/fast with other sampler settings"),
        (dict(config=get_config("nfc", "fast", num_levels=7)), "num_levels=7"),
        (dict(num_samples=16), "K \\(samples\\) 4"),
        (dict(num_samples=1), "K >= 2"),
        (dict(prior="def"), "fingerprint abc\\), this run's prior has fingerprint def"),
        (dict(task={**task, "noise_sigma": 0.05}), "noise_sigma=0.05"),
        (dict(task={"task": "deblur_gaussian", "noise_sigma": 0.025}), "task 'sr_bicubic'"),
        (dict(task=None, family="blur"), "operator family"),
        (dict(task=None, family="sr", noise=GaussianNoise(0.01)), "noise sigma"),
        (dict(task=None, family="sr", factor=2), "SR factor"),
    ]
    for change, match in cases:
        kw = dict(method="nfc", config=cfg, num_samples=4, prior="abc", task=task)
        kw.update(change)
        with pytest.raises(CalibrationError, match=match):
            cal.check(**kw)
    # a restore of simulated measurements matches on the simulated task
    cal.check("nfc", cfg, 4, "abc", task=[{"task": "inpaint_mask"}, task])
    # a file that records fields the config no longer has was fitted by an earlier nfc_dps
    old = _calibration(sampler={**cal.sampler, "cg_iterations": 20})
    with pytest.raises(CalibrationError, match="no longer has \\(cg_iterations\\).*earlier nfc_dps"):
        old.check("nfc", cfg, 4, "abc", task=task)


def test_prior_fingerprint_follows_the_weights():
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    b.load_state_dict(a.state_dict())
    assert prior_fingerprint(a) == prior_fingerprint(b)
    with torch.no_grad():
        b.weight[0, 0] += 1e-3
    assert prior_fingerprint(a) != prior_fingerprint(b)


# ---------------------------------------------------------------- API and command line


@pytest.fixture(scope="module")
def prior_dirs(tmp_path_factory) -> list[str]:
    """Two tiny, untrained diffusers UNets saved as EDM priors (different weights)."""
    from diffusers import UNet2DModel

    paths = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        unet = UNet2DModel(sample_size=16, in_channels=3, out_channels=3, block_out_channels=(8, 16),
                           norm_num_groups=4, layers_per_block=1,
                           down_block_types=("DownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "UpBlock2D"))
        path = tmp_path_factory.mktemp(f"prior{seed}")
        unet.save_pretrained(path)
        (path / "nfc_dps_prior.json").write_text(json.dumps({"parameterization": "edm"}))
        paths.append(str(path))
    return paths


def _images(folder: Path, n: int, size: int = 16) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    yy, xx = np.mgrid[0:size, 0:size] / (size - 1)
    for i in range(n):
        img = np.stack([xx, yy, 0.5 + 0.3 * np.sin(6 * xx + i)], -1).astype(np.float32)
        write_image(folder / f"im{i}.png", img)
    return folder


def _cli(*argv) -> int:
    return main([str(a) for a in argv] + ["--quiet"])


TASK = ("--task", "deblur_gaussian", "--param", "kernel_size=5", "--param", "kernel_std=1.0")


def test_api_restore_returns_the_calibrated_interval(prior_dirs):
    from nfc_dps import build_operator, restore
    from nfc_dps.priors.default import load_prior

    prior = load_prior(prior_dirs[0])
    op = build_operator("deblur_gaussian", image_size=(16, 16), kernel_size=5, kernel_std=1.0)
    y = torch.rand(1, 3, 16, 16)
    cfg = get_config("nfc", "fast", num_levels=2)
    cal = _calibration(q=1.5, preset="fast", sampler=json.loads(json.dumps(__import__("dataclasses").asdict(cfg),
                                                                            default=str)),
                       prior={"fingerprint": prior_fingerprint(prior)}, num_samples=2,
                       task={"task": "deblur_gaussian", "noise_sigma": 0.025})
    kw = dict(prior=prior, method="nfc", config=cfg, progress=False)
    plain = restore(y, op, num_samples=2, **kw)
    assert plain.lower is None and plain.upper is None
    res = restore(y, op, num_samples=2, calibration=cal, **kw)
    assert torch.equal(res.image, plain.image)
    lo, hi = interval(res.image, res.std, 1.5, DEFAULT_EPS)
    assert torch.equal(res.lower, lo) and torch.equal(res.upper, hi)
    assert (res.lower <= res.image).all() and (res.image <= res.upper).all()
    with pytest.raises(CalibrationError, match="K >= 2"):
        restore(y, op, num_samples=1, calibration=cal, **kw)
    with pytest.raises(CalibrationError, match="K \\(samples\\) 2"):
        restore(y, op, num_samples=3, calibration=cal, **kw)
    with pytest.raises(CalibrationError, match="noise sigma"):
        restore(y, op, num_samples=2, calibration=cal, sigma_y=0.05, **kw)
    with pytest.raises(CalibrationError, match="weights"):
        restore(y, op, num_samples=2, calibration=cal, **{**kw, "prior": load_prior(prior_dirs[1])})
    sr = build_operator("sr_bicubic", image_size=(16, 16))
    with pytest.raises(CalibrationError, match="operator family"):
        restore(torch.rand(1, 3, 4, 4), sr, num_samples=2, calibration=cal, **kw)


def test_cli_calibrate_then_restore_end_to_end(tmp_path, prior_dirs, capsys):
    prior = prior_dirs[0]
    clean = _images(tmp_path / "clean", 9)
    cal_file = tmp_path / "cal" / "nfc_k2.json"
    common = (*TASK, "--preset", "fast", "--steps", 2, "--prior", prior)
    assert _cli("calibrate", "--images", clean, *common, "--samples", 2, "--out", cal_file) == 0
    cal = json.loads(cal_file.read_text())
    assert cal["method"] == "nfc" and cal["preset"] == "fast" and cal["num_samples"] == 2 and cal["n_images"] == 9
    assert cal["task"]["task"] == "deblur_gaussian" and cal["task"]["kernel_size"] == 5
    assert cal["task"]["noise_sigma"] == 0.025 and cal["coverage"] == 0.9 and cal["q"] > 0
    assert cal["prior"]["path"] == str(Path(prior).resolve()) and len(cal["prior"]["fingerprint"]) == 16
    assert 0.9 <= cal["fit"]["coverage_in_sample"] <= 1.0

    # simulate new images, restore them with the calibration: the interval files beside each restoration
    _images(tmp_path / "new", 2)
    assert _cli("simulate", "-i", tmp_path / "new", "-o", tmp_path / "sim", *TASK) == 0
    out = tmp_path / "out"
    restore_args = ("restore", "--config", tmp_path / "sim" / "simulation.json", "-o", out, "--preset", "fast",
                    "--steps", 2, "--prior", prior, "--samples", 2)
    assert _cli(*restore_args, "--calibration", cal_file) == 0
    for stem in ("im0", "im1"):
        lo, info = read_image(out / f"{stem}_lower.png")
        hi, _ = read_image(out / f"{stem}_upper.png")
        x, _ = read_image(out / f"{stem}.png")
        assert info.bit_depth == 16 and lo.shape == hi.shape == x.shape == (12, 12, 3)  # the photo's frame
        assert (lo <= hi).all() and (hi - lo).max() > 0
        assert (lo <= x + 1 / 255).all() and (x <= hi + 1 / 255).all()  # x was written at 8 bits
        manifest = json.loads((out / "manifest.json").read_text())
        assert f"{stem}_lower.png" in manifest["images"][f"{stem}.png"]["outputs"]
    # without a calibration: no interval files
    assert _cli(*restore_args, "-o", tmp_path / "plain") == 0
    assert not list((tmp_path / "plain").glob("*_lower.png"))

    capsys.readouterr()
    # refusals, each exit 2 naming the file and what differs
    cases = [
        (("--samples", 4), "K \\(samples\\) 2"),
        (("--samples", 1), "--samples K >= 2"),
        (("--preset", "paper"), "nfc/fast with other sampler settings"),
        (("--steps", 3), "num_levels=3"),
        (("--method", "daps", "--preset", "fast"), "method 'nfc'"),
        (("--noise-sigma", 0.05), "noise_sigma=0.05"),
        (("--prior", prior_dirs[1]), "weights"),
    ]
    for change, match in cases:
        assert _cli(*restore_args, *change, "--calibration", cal_file, "-o", tmp_path / "refused") == 2, change
        err = capsys.readouterr().err
        assert __import__("re").search(match, err), (change, err)
        if "--samples K" not in match:
            assert str(cal_file) in err
    assert _cli("restore", "-i", tmp_path / "sim" / "measurements", "-o", tmp_path / "sr", "--task", "sr_bicubic",
                "--preset", "fast", "--steps", 2, "--prior", prior, "--samples", 2, "--calibration", cal_file) == 2
    assert "task 'deblur_gaussian'" in capsys.readouterr().err


def test_cli_calibrate_refusals(tmp_path, prior_dirs, capsys):
    clean = _images(tmp_path / "clean", 8)
    base = ("calibrate", "--images", clean, *TASK, "--preset", "fast", "--steps", 2, "--prior", prior_dirs[0],
            "--out", tmp_path / "c.json")
    cases = [
        (("--samples", 2), "holds 8 image\\(s\\); coverage 0.9 needs at least 9"),
        (("--samples", 1), "--samples must be >= 2"),
        (("--samples", 2, "--coverage", 1.0), "--coverage must lie strictly between 0 and 1"),
        (("--samples", 2, "--coverage", 0), "--coverage must lie strictly between 0 and 1"),
        (("--samples", 2, "--preset", "deterministic"), "deterministic"),
    ]
    for extra, match in cases:
        assert _cli(*base, *extra) == 2, extra
        assert __import__("re").search(match, capsys.readouterr().err), extra
    assert not (tmp_path / "c.json").exists()
    # coverage 0.8 needs only 4 images: 8 are enough
    assert _cli(*base, "--samples", 2, "--coverage", 0.8) == 0
    assert json.loads((tmp_path / "c.json").read_text())["coverage"] == 0.8


def test_cli_random_task_applies_to_its_simulated_measurements(tmp_path, prior_dirs, capsys):
    """inpaint_random draws a mask per image: restoring simulate's output (its saved masks) matches a
    calibration of inpaint_random; the same masks passed as --mask are another task."""
    prior = prior_dirs[0]
    task = ("--task", "inpaint_random", "--param", "missing_fraction=0.5")
    cal_file = tmp_path / "cal.json"
    assert _cli("calibrate", "--images", _images(tmp_path / "clean", 4), *task, "--preset", "fast", "--steps", 2,
                "--prior", prior, "--samples", 2, "--coverage", 0.8, "--out", cal_file) == 0
    assert _cli("simulate", "-i", _images(tmp_path / "new", 1), "-o", tmp_path / "sim", *task) == 0
    args = ("--preset", "fast", "--steps", 2, "--prior", prior, "--samples", 2, "--calibration", cal_file)
    assert _cli("restore", "--config", tmp_path / "sim" / "simulation.json", "-o", tmp_path / "out", *args) == 0
    assert (tmp_path / "out" / "im0_lower.png").is_file() and (tmp_path / "out" / "im0_upper.png").is_file()
    capsys.readouterr()
    assert _cli("restore", "-i", tmp_path / "sim" / "measurements", "--mask", tmp_path / "sim" / "masks",
                "--task", "inpaint_random", "-o", tmp_path / "out2", *args) == 2
    assert "task 'inpaint_random'" in capsys.readouterr().err


# ---------------------------------------------------------------- the harness's protocol


def test_photo_tiles_do_not_overlap_and_start_with_the_centre_crop():
    from nfc_dps.bench.calibration import photo_tiles
    from nfc_dps.bench.measurements import _center_crop_zoom
    from nfc_dps.priors.training_data import load_skimage_image

    tiles = photo_tiles(("chelsea", "camera"), 5, 16)
    assert [n for n, _ in tiles][:2] == ["chelsea", "camera"]
    assert np.array_equal(tiles[0][1], _center_crop_zoom(load_skimage_image("chelsea"), 16, 2))
    assert len({n for n, _ in tiles}) == 5 and all(t.shape == (16, 16, 3) for _, t in tiles)
    assert not any(np.array_equal(a, b) for i, (_, a) in enumerate(tiles) for _, b in tiles[i + 1:])
    with pytest.raises(ValueError, match="fewer than"):
        photo_tiles(("chelsea",), 10_000, 16)


@pytest.mark.parametrize("setting", ["gaussian", "mixture-well-mild-lo"])
def test_exact_sampler_stays_at_nominal_after_calibration(setting):
    """On the oracles, q fitted on exact draws for 20 validation measurements gives the 8 test
    measurements 90 % coverage (no over-correction), at K = 4 and K = 16."""
    from nfc_dps.bench.calibration import _oracle_problems, conformal_rows

    (name, _, _, truth, _, _, exact, gen), = _oracle_problems([setting], 0, torch.device("cpu"))
    (_, _, _, v_truth, _, _, v_exact, _), = _oracle_problems([setting], 0, torch.device("cpu"), "validation")
    rows = conformal_rows(name, "exact", 0, [v_exact(16, gen(name, "validation-exact")).double()],
                          [v_truth.double()], [exact(16, gen(name, "exact")).double()], [truth.double()], 0.9,
                          clip=False)
    assert [r["k"] for r in rows] == [4, 16] and all(r["n_validation"] == 20 and r["n_test"] == 8 for r in rows)
    for r in rows:
        assert abs(r["coverage"] - 0.9) < 0.02, r
        assert r["width"] > 0 and r["q"] > 0


def test_conformal_rows_correct_a_too_narrow_sampler():
    """Draws shrunk 2x towards their mean cover far less than 90 % at ±1.645 std; calibrated, 90 %."""
    from nfc_dps.bench.calibration import _oracle_problems, conformal_rows

    (name, _, _, truth, _, _, exact, gen), = _oracle_problems(["gaussian"], 0, torch.device("cpu"))
    (_, _, _, v_truth, _, _, v_exact, _), = _oracle_problems(["gaussian"], 0, torch.device("cpu"), "validation")

    def narrow(x):
        return x.mean(0) + 0.5 * (x - x.mean(0))

    r = conformal_rows(name, "narrow", 0, [narrow(v_exact(16, gen(name, "v")).double())], [v_truth.double()],
                       [narrow(exact(16, gen(name, "t")).double())], [truth.double()], 0.9, clip=False)[-1]
    assert r["raw_coverage"] < 0.7 and abs(r["coverage"] - 0.9) < 0.02


def test_cli_interval_names_may_not_overwrite_another_restoration(tmp_path, prior_dirs, capsys):
    from nfc_dps.conformal import sampler_fields
    from nfc_dps.priors.default import load_prior

    prior = prior_dirs[0]
    folder = _images(tmp_path / "in", 2)
    (folder / "im1.png").rename(folder / "im0_lower.png")
    cfg = get_config("nfc", "fast", num_levels=2)
    cal = _calibration(sampler=sampler_fields(cfg), num_samples=2,
                       prior={"fingerprint": prior_fingerprint(load_prior(prior))},
                       task={"task": "denoise", "noise_sigma": 0.025})
    cal.save(tmp_path / "cal.json")
    assert _cli("restore", "-i", folder, "-o", tmp_path / "out", "--task", "denoise", "--preset", "fast", "--steps", 2,
                "--prior", prior, "--samples", 2, "--calibration", tmp_path / "cal.json") == 2
    assert "would overwrite the restoration of im0_lower" in capsys.readouterr().err


def test_the_prior_fingerprint_takes_scalar_buffers_and_tells_function_priors_apart():
    from nfc_dps.conformal import prior_fingerprint
    from nfc_dps.priors import DenoiserPrior

    class Normed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.BatchNorm2d(3)  # holds a 0-d buffer (num_batches_tracked)

        def forward(self, x, sigma):
            return self.norm(x)

    def smooth(x, sigma):
        return x

    def sharpen(x, sigma):
        return x

    assert len(prior_fingerprint(DenoiserPrior(Normed(), 0.2))) == 16
    prints = {prior_fingerprint(DenoiserPrior(smooth, 0.2)), prior_fingerprint(DenoiserPrior(sharpen, 0.2)),
              prior_fingerprint(DenoiserPrior(smooth, 0.3)), prior_fingerprint(DenoiserPrior(smooth, 0.2, channels=1))}
    assert len(prints) == 4
    assert prior_fingerprint(DenoiserPrior(smooth, 0.2)) == prior_fingerprint(DenoiserPrior(smooth, 0.2))


def test_interval_stats_counts_each_image_of_a_batch_and_its_standard_error():
    """Two images in one measurement, one covered fully and one half: coverage 0.75, and its
    standard error over the two images std([1, 0.5], ddof=1) / sqrt(2) = 0.25; the table shows both."""
    from nfc_dps.bench.calibration import interval_stats
    from nfc_dps.bench.calibration_report import conformal_lines

    chains = torch.full((2, 2, 1, 4, 4), 0.5, dtype=torch.float64)  # (K, B, C, H, W), std 0
    truth = torch.full((2, 1, 4, 4), 0.5, dtype=torch.float64)
    truth[1, :, :2] = 0.9  # image 1: half its pixels outside mean ± q eps
    st = interval_stats([chains], [truth], q=1.0, z=1.645, clip=True)
    assert st["coverage"] == pytest.approx(0.75) and st["coverage_se"] == pytest.approx(0.25)
    row = {"setting": "s", "method": "m", "budget": 0, "k": 2, "raw_coverage": 0.5, "q": 1.0, "edge_weight": 0.0,
           "width": 0.01, "n_validation": 9, "n_test": 2}
    with_se, without = conformal_lines([{**row, **st}, {**row, "coverage": 0.75}])[2:]
    assert "| 75.0 ± 25.0 |" in with_se and "| 75.0 |" in without


# ---------------------------------------------------------------- N5: a user prior's fingerprint is what it computes


def _blend_factory(strength):
    """A factory of one closure: every prior it makes wraps a function of one qualified name."""
    from nfc_dps.priors import DenoiserPrior

    def blend(x, sigma):  # (B, C, H, W) in [0, 1], (B,) std -> the image blended with its 3 x 3 mean
        mean = torch.nn.functional.avg_pool2d(torch.nn.functional.pad(x, (1, 1, 1, 1), mode="replicate"), 3, stride=1)
        return (1 - strength) * x + strength * mean

    return DenoiserPrior(blend, 0.2)


def _scaled(x, sigma, gain=1.0):
    return x * gain


def test_priors_of_one_closure_or_partial_with_other_parameters_have_other_fingerprints():
    import functools

    from nfc_dps.priors import DenoiserPrior

    a, b = _blend_factory(0.3), _blend_factory(0.6)
    assert prior_fingerprint(a) != prior_fingerprint(b)
    assert prior_fingerprint(a) == prior_fingerprint(_blend_factory(0.3)) == prior_fingerprint(a)  # stable
    p, q = (DenoiserPrior(functools.partial(_scaled, gain=g), 0.2) for g in (0.9, 0.95))
    assert prior_fingerprint(p) != prior_fingerprint(q)
    assert prior_fingerprint(p) == prior_fingerprint(DenoiserPrior(functools.partial(_scaled, gain=0.9), 0.2))
    # a calibration fitted with one is refused for the other
    cal = _calibration(prior={"fingerprint": prior_fingerprint(a), "path": "factories:blend"})
    cfg = get_config("nfc", "fast")
    task = {"task": "sr_bicubic", "factor": 4, "noise_sigma": 0.025}
    cal.check("nfc", cfg, 4, prior_fingerprint(_blend_factory(0.3)), task=task)
    with pytest.raises(CalibrationError, match="fitted with the prior factories:blend.*calibrate again with this prior"):
        cal.check("nfc", cfg, 4, prior_fingerprint(b), task=task)


def test_api_restore_refuses_a_calibration_of_another_partial():
    import functools

    import nfc_dps
    from nfc_dps.conformal import sampler_fields
    from nfc_dps.priors import DenoiserPrior

    fitted, other = (DenoiserPrior(functools.partial(_scaled, gain=g), 0.2) for g in (0.9, 0.5))
    cfg = get_config("nfc", "fast")
    cal = _calibration(num_samples=2, sampler=sampler_fields(cfg), prior={"fingerprint": prior_fingerprint(fitted)},
                       task={"task": "denoise", "noise_sigma": 0.025})
    op = nfc_dps.build_operator("denoise", image_size=(16, 16))
    y = torch.full((1, 3, 16, 16), 0.5)
    with pytest.raises(CalibrationError, match="fitted with the prior"):
        nfc_dps.restore(y, op, other, preset="fast", num_samples=2, calibration=cal, progress=False)


def test_the_probe_leaves_the_prior_and_the_random_state_as_they_were():
    from nfc_dps.priors import DenoiserPrior

    class Noisy(torch.nn.Module):  # a user's network: a BatchNorm in training mode and a random draw
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.BatchNorm2d(3)

        def forward(self, x, sigma):
            return self.norm(x) + 1e-3 * torch.randn_like(x)

    prior = DenoiserPrior(Noisy(), 0.2)
    before = {k: v.clone() for k, v in prior.state_dict().items()}
    torch.manual_seed(123)
    state = torch.get_rng_state()
    first = prior_fingerprint(prior)
    assert torch.equal(torch.get_rng_state(), state)
    assert all(torch.equal(before[k], v) for k, v in prior.state_dict().items())
    assert prior_fingerprint(prior) == first


def test_the_embedded_priors_fingerprint_is_its_weights_and_a_failing_prior_is_named():
    from nfc_dps.conformal import weights_determine
    from nfc_dps.priors import DenoiserPrior

    assert weights_determine(torch.nn.Linear(2, 2)) and not weights_determine(_blend_factory(0.3))

    def broken(x, sigma):
        raise RuntimeError("no GPU here")

    with pytest.raises(CalibrationError, match="cannot fingerprint the prior DenoiserPrior.*no GPU here"):
        prior_fingerprint(DenoiserPrior(broken, 0.2))


# ---------------------------------------------------------------- N6: a calibration holds for its task only


def test_a_calibration_file_without_a_task_is_refused(tmp_path):
    d = _calibration().to_dict()
    for name, body, match in (("null.json", {**d, "task": None}, "null.json: key task is null"),
                              ("none.json", {k: v for k, v in d.items() if k != "task"}, "none.json: no key task"),
                              ("nameless.json", {**d, "task": {"noise_sigma": 0.025}}, "nameless.json: key task.task")):
        (tmp_path / name).write_text(json.dumps(body))
        with pytest.raises(CalibrationError, match=match):
            load_calibration(tmp_path / name)
    # one made in memory without a task applies to no run
    cal = _calibration(task=None)
    with pytest.raises(CalibrationError, match="records no task"):
        cal.check("nfc", get_config("nfc", "fast"), 4, "abc", task={"task": "sr_bicubic", "factor": 4,
                                                                     "noise_sigma": 0.025})
    with pytest.raises(CalibrationError, match="records no task"):
        cal.check("nfc", get_config("nfc", "fast"), 4, "abc", family="sr", noise=GaussianNoise(0.025))


# ---------------------------------------------------------------- images unlike the calibration set


def test_an_image_unlike_the_calibration_images_is_named_in_a_warning(prior_dirs):
    from nfc_dps import build_operator, restore
    from nfc_dps.conformal import UnfamiliarImageWarning, mean_spread
    from nfc_dps.priors.default import load_prior

    prior = load_prior(prior_dirs[0])
    op = build_operator("deblur_gaussian", image_size=(16, 16), kernel_size=5, kernel_std=1.0, boundary="circular")
    y = torch.rand(2, 3, 16, 16)
    cfg = get_config("nfc", "fast", num_levels=2)
    kw = dict(prior=prior, method="nfc", config=cfg, progress=False, num_samples=2)
    plain = restore(y, op, **kw)
    spreads = mean_spread(plain.image, plain.std, DEFAULT_EPS)
    assert spreads.shape == (2,) and (spreads > DEFAULT_EPS).all()
    base = dict(q=1.5, preset="fast", num_samples=2, prior={"fingerprint": prior_fingerprint(prior)},
                sampler=json.loads(json.dumps(__import__("dataclasses").asdict(cfg), default=str)),
                task={"task": "deblur_gaussian", "noise_sigma": 0.025})
    seen = [float(spreads.min()) * 0.9, float(spreads.max()) * 1.1]
    for fit in ({}, {"mean_spread_range": seen}):  # no range recorded, or both images inside it
        with __import__("warnings").catch_warnings():
            __import__("warnings").simplefilter("error", UnfamiliarImageWarning)
            restore(y, op, calibration=_calibration(**base, fit=fit), **kw)
    narrow = [float(spreads.max()) * 2, float(spreads.max()) * 3]  # a calibration set of far wider spreads
    with pytest.warns(UnfamiliarImageWarning, match="image 1: its sample spread") as caught:
        res = restore(y, op, calibration=_calibration(**base, fit={"mean_spread_range": narrow}), **kw)
    assert len(caught) == 2 and res.lower is not None  # a warning, not a refusal


def test_cli_calibration_records_its_spread_range_and_restore_notes_an_unlike_image(tmp_path, prior_dirs, capsys):
    prior = prior_dirs[0]
    cal_file = tmp_path / "cal.json"
    common = (*TASK, "--preset", "fast", "--steps", 2, "--prior", prior)
    assert _cli("calibrate", "--images", _images(tmp_path / "clean", 9), *common, "--samples", 2,
                "--out", cal_file) == 0
    cal = json.loads(cal_file.read_text())
    lo, hi = cal["fit"]["mean_spread_range"]
    assert 0 < lo <= hi
    _images(tmp_path / "new", 2)
    assert _cli("simulate", "-i", tmp_path / "new", "-o", tmp_path / "sim", *TASK) == 0
    cal["fit"]["mean_spread_range"] = [hi * 10, hi * 20]
    far = tmp_path / "far.json"
    far.write_text(json.dumps(cal))
    capsys.readouterr()
    assert _cli("restore", "--config", tmp_path / "sim" / "simulation.json", "-o", tmp_path / "out", "--preset",
                "fast", "--steps", 2, "--prior", prior, "--samples", 2, "--calibration", far) == 0
    err = capsys.readouterr().err
    assert "note im0.png: its sample spread" in err and "note im1.png" in err and "UnfamiliarImageWarning" not in err
