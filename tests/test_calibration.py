"""Calibration protocol: the exact posterior samplers' std maps are calibrated, and the runner works."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from nfc_dps.bench.calibration import _oracle_problems, calibration_rows, coverage_curve
from nfc_dps.bench.cli import main
from nfc_dps.bench.runner import prior_record
from nfc_dps.conformal import EDGE_WEIGHTS, fit_rule
from nfc_dps.metrics import expected_coverage

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("setting", ["gaussian", "mixture-well-mild-lo"])
@pytest.mark.parametrize("k", [16, 64])
def test_exact_posterior_draws_are_calibrated(setting, k):
    """K exact posterior draws cover the truth at +-1 / +-2 stds as often as the Student-t value
    says (65/93 % at K = 16, 68/95 % at K = 64), within sampling error (measured |diff| <= 0.008)."""
    (name, prior, op, truth, y, sigma_y, exact, gen), = _oracle_problems([setting], 0, torch.device("cpu"))
    xs = exact(k, gen(name, "exact", k)).double()
    got = coverage_curve(xs, truth.double(), (1.0, 2.0))
    for c, v in zip((1.0, 2.0), got):
        assert abs(float(v) - expected_coverage(k, c)) < 0.015, (setting, k, c, float(v))
    got4 = coverage_curve(xs, truth.double(), (1.0, 2.0), group=4)
    for c, v in zip((1.0, 2.0), got4):
        assert abs(float(v) - expected_coverage(4, c)) < 0.015, (setting, 4, c, float(v))


def test_a_too_narrow_sampler_is_seen_as_undercovering():
    """Draws shrunk towards their mean by 2x cover far fewer pixels than an exact sampler would."""
    (name, prior, op, truth, y, sigma_y, exact, gen), = _oracle_problems(["gaussian"], 0, torch.device("cpu"))
    xs = exact(16, gen(name, "exact")).double()
    narrow = xs.mean(0) + 0.5 * (xs - xs.mean(0))
    rows = calibration_rows("gaussian", "narrow", 0, narrow, truth.double())
    at = {(r["k"], r["width"]): r["observed"] for r in rows}
    assert at[(16, 1.0)] < expected_coverage(16, 1.0) - 0.15
    assert at[(16, 2.0)] < expected_coverage(16, 2.0) - 0.1
    assert all(0 <= r["observed"] <= 1 for r in rows)


def test_coverage_curve_checks_the_group():
    xs = torch.zeros(6, 1, 1, 2, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match="divide K = 6"):
        coverage_curve(xs, torch.zeros(1, 1, 2, 2, dtype=torch.float64), group=4)


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_calibration_protocol_end_to_end_and_resumed(tmp_path):
    """`nfc-dps bench --protocol calibration` writes both tables and the summary; a rerun into the
    folder recomputes only the rows it lacks, and they equal the first run's."""
    args = ["--protocol", "calibration", "--out", str(tmp_path), "--tasks", "gaussian", "--budgets", "2",
            "--samples", "4", "--methods", "nfc,ddnm", "--threads", "1", "--device", "cpu"]
    assert main(args) == 0
    table = read_csv(tmp_path / "calibration.csv")
    assert {r["method"] for r in table} == {"exact", "nfc", "ddnm"}
    assert set(table[0]) == {"setting", "method", "budget", "k", "width", "observed", "expected"}
    assert {r["method"] for r in read_csv(tmp_path / "conformal.csv")} == {"exact", "nfc", "ddnm"}
    summary = (tmp_path / "summary.md").read_text()
    assert "| exact | 0 |" in summary and "| nfc | 2 |" in summary and "56/83" in summary
    assert "- prior: none (the oracles need no network)" in summary
    first = {name: (tmp_path / name).read_text() for name in ("calibration.csv", "conformal.csv")}
    for name, text in first.items():  # drop nfc's rows: the rerun computes that case again
        (tmp_path / name).write_text("".join(line for line in text.splitlines(keepends=True) if ",nfc," not in line))
    assert main(args) == 0
    assert {name: (tmp_path / name).read_text() for name in first} == first
    assert main([*args, "--samples", "8"]) == 2  # another K in the same folder is refused


@pytest.mark.slow  # loads the validation photographs and samples 11 tiles
def test_embedded_draws_are_saved_and_refit_to_the_tables_rule(tmp_path, tiny_prior):
    """An embedded setting keeps every tile's chains (OUT/chains/*.npz): refitting the rule on the
    saved validation draws gives back conformal.csv's q and edge weight, and the saved truths are
    the tiles the coverage was measured on."""
    out = tmp_path / "cal"
    assert main(["--protocol", "calibration", "--out", str(out), "--tasks", "embedded-sr_bicubic", "--methods", "nfc",
                 "--prior", str(tiny_prior), "--size", "16", "--samples", "4", "--embedded-budget", "2",
                 "--validation-images", "9", "--num-images", "2", "--threads", "1", "--device", "cpu"]) == 0
    # the summary names the weights it measured by their contents' hash, as the bench summary does
    assert f"'sha256': '{prior_record(str(tiny_prior))['sha256']}'" in (out / "summary.md").read_text()
    saved = np.load(out / "chains" / "embedded-sr_bicubic_nfc@2.npz")
    assert saved["validation_chains"].shape == (9, 4, 1, 3, 16, 16) and saved["validation_truth"].shape == (9, 1, 3, 16, 16)
    assert saved["test_chains"].shape == (2, 4, 1, 3, 16, 16)
    assert list(saved["test_names"]) == ["astronaut", "coffee"] and len(set(saved["validation_names"])) == 9
    row = next(r for r in read_csv(out / "conformal.csv") if r["k"] == "4")
    images = [(np.clip(xs.mean(0), 0, 1)[0], xs.std(0, ddof=1)[0], x[0])
              for xs, x in zip(saved["validation_chains"].astype(np.float64), saved["validation_truth"])]
    fit = fit_rule(images, 0.9)
    assert float(row["edge_weight"]) == fit.edge_weight
    assert float(row["q"]) == pytest.approx(fit.q, rel=1e-3)
    assert 0 <= saved["test_truth"].min() and saved["test_truth"].max() <= 1
    # scripts/refit_intervals.py measures the refitted rule on the saved test draws as the run did
    spec = importlib.util.spec_from_file_location("refit_intervals", ROOT / "scripts" / "refit_intervals.py")
    refit = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(refit)
    again = {r["k"]: r for r in refit.refit(out / "chains" / "embedded-sr_bicubic_nfc@2.npz", 0.9, "pooled",
                                            list(EDGE_WEIGHTS))}
    assert again[4]["coverage"] == pytest.approx(float(row["coverage"]), abs=2e-3)
    assert 0 < again[4]["validation_coverage"] <= 1
    assert refit.main([str(out)]) == 0
    draws = out / "chains" / "embedded-sr_bicubic_nfc@2.npz"  # risk control's in-sample target is stricter
    pooled, wider = (refit.refit(draws, 0.9, rule, [0.0]) for rule in ("pooled", "risk-control"))
    assert wider[0]["q"] > pooled[0]["q"] and wider[0]["validation_coverage"] > pooled[0]["validation_coverage"]


def test_calibration_refusals_name_the_flag(tmp_path, capsys):
    base = ["--protocol", "calibration", "--out", str(tmp_path / "c"), "--threads", "1", "--device", "cpu"]
    for extra, message in ((["--tasks", "embedded-nosuchtask"], "unknown calibration setting"),
                           (["--samples", "6"], "--samples must be a multiple of 4"),
                           (["--set", "nfc.inner=exact"], "--set: the calibration protocol"),
                           (["--coverage", "1.5"], "--coverage must be in (0, 1)")):
        assert main(base + extra) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "c").exists()  # a refused run writes nothing
