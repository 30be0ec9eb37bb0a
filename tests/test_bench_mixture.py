"""The Gaussian-mixture protocol of the harness: a tiny end-to-end run, the sampler list follows
the registry, the metrics' floors, and clear errors."""

from __future__ import annotations

import csv
import json
import math

import torch

from nfc_dps.bench import mixture
from nfc_dps.bench.cli import main
from nfc_dps.operators import BlurOperator, gaussian_kernel
from nfc_dps.priors import GaussianMixturePrior
from nfc_dps.samplers import METHODS, Method, NFCConfig


def read_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_mixture_protocol_end_to_end(tmp_path):
    out = tmp_path / "mix"
    assert main(["--protocol", "mixture", "--out", str(out), "--size", "16", "--num-images", "1",
                       "--samples", "4", "--budgets", "4", "--tasks", "well-mild-lo,poor-strong-hi",
                       "--threads", "1", "--device", "cpu"]) == 0
    rows = read_rows(out / "results.csv")
    labels = {r["method"] for r in rows}
    expected = {"exact-mmse", "exact-sample", "nfc-band-off", "nfc-haar-off", "nfc-modules-off"} | set(METHODS)
    assert expected <= labels
    assert {r["setting"] for r in rows} == {"well-mild-lo", "poor-strong-hi"}
    for r in rows:
        assert not r["note"], r
        if r["method"] != "exact-mmse":
            assert 0.0 <= float(r["tv"]) <= 1.0 and float(r["sw"]) > 0 and r["cov1_k4"] and r["cov2_all"]
        if not r["method"].startswith("exact"):
            assert int(r["nfe"]) == 4
    drift = read_rows(out / "drift.csv")
    assert {r["method"] for r in drift} == labels - {"exact-mmse", "exact-sample"}
    assert all(float(r["drift"]) >= 0 and float(r["sigma"]) > 0 for r in drift)
    text = (out / "summary.md").read_text()
    assert "## Module effects" in text and "vs nfc-haar-off" in text and "## Mean over settings" in text
    cfg = json.loads((out / "config.json").read_text())
    # the bounds of every setting are recorded (their values come from the mixture posterior's
    # exact MMSE, tested against dense Bayes in test_mixture_prior.py)
    assert set(cfg["bounds_db"]) == {"well-mild-lo", "poor-strong-hi"}
    assert all(set(b) >= {"mmse", "sample", "mean4"} and all(map(math.isfinite, b.values()))
               for b in cfg["bounds_db"].values())


def test_a_mixture_rerun_computes_only_the_missing_rows(tmp_path):
    """The runner resumes the mixture protocol: rows deleted from results.csv are computed again and
    equal the first run's (the seconds aside); the others are kept as they were."""
    out = tmp_path / "mix"
    args = ["--protocol", "mixture", "--out", str(out), "--size", "16", "--num-images", "1", "--samples", "4",
            "--budgets", "3", "--tasks", "well-mild-lo", "--methods", "nfc,ddnm", "--threads", "1", "--device", "cpu"]
    assert main(args) == 0
    first = read_rows(out / "results.csv")
    kept = [r for r in first if r["method"] != "ddnm"]
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(first[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(kept)
    assert main(args) == 0
    again = read_rows(out / "results.csv")
    assert [r["method"] for r in again] == [r["method"] for r in first]
    assert [{**r, "seconds": ""} for r in again] == [{**r, "seconds": ""} for r in first]
    assert [r["seconds"] for r in again if r["method"] != "ddnm"] == [r["seconds"] for r in kept]


def test_mixture_runs_follow_the_registry(monkeypatch):
    monkeypatch.setitem(METHODS, "newcomer", Method(METHODS["ddnm"].sample, METHODS["ddnm"].config_class,
                                                    METHODS["ddnm"].presets, "Newcomer", rank=99))
    labels = [label for label, _, _ in mixture.mixture_runs(10)]
    assert "newcomer" in labels and labels.count("nfc") == 1
    runs = {label: cfg for label, _, cfg in mixture.mixture_runs(10)}
    assert not runs["nfc-band-off"].band.active and runs["nfc-band-off"].detail.active
    assert runs["nfc-haar-off"].band.active and runs["nfc-haar-off"].detail.levels == 0
    assert not runs["nfc-modules-off"].band.active and not runs["nfc-modules-off"].detail.active
    assert all(cfg.nfe == 10 for cfg in runs.values())
    assert [label for label, _, _ in mixture.mixture_runs(10, ("nfc",))] == [
        "nfc", "nfc-band-off", "nfc-haar-off", "nfc-modules-off"]
    assert isinstance(runs["daps"], NFCConfig) and "daps-band-off" not in runs
    over = {label: cfg for label, _, cfg in mixture.mixture_runs(10, ("nfc",), {"nfc": {"final_step": "sample"}})}
    assert all(cfg.final_step == "sample" for cfg in over.values()) and runs["nfc"].final_step == "mean"


def test_exact_draws_sit_at_the_metric_floor_and_a_wrong_sampler_does_not():
    prior = GaussianMixturePrior.structured(16, 1, "well", torch.Generator().manual_seed(0))
    op = BlurOperator(gaussian_kernel(13, 1.5), "circular")
    g = torch.Generator().manual_seed(1)
    truth = prior.sample_prior(6, g)
    y = op.A(truth) + 0.1 * torch.randn(truth.shape, generator=g, dtype=torch.float64)
    post = prior.posterior(op, y, 0.1)
    dirs = torch.randn(64, 256, generator=g, dtype=torch.float64)
    dirs = dirs / dirs.norm(dim=1, keepdim=True)
    ref = post.sample(64, g)
    good = mixture.sample_metrics(post.sample(16, g), truth, post, ref, dirs)
    # draws from the prior ignore y: worse in every metric
    bad = mixture.sample_metrics(prior.sample_prior(16 * 6, g).view(16, 6, 1, 16, 16), truth, post, ref, dirs)
    assert bad["tv"] > good["tv"] + 0.2 and bad["sw"] > 1.5 * good["sw"] and bad["psnr_sample"] < good["psnr_sample"] - 3
    assert abs(good["cov2_all"] - 0.94) < 0.05


def test_unknown_setting_is_a_clear_error(tmp_path, capsys):
    assert main(["--protocol", "mixture", "--out", str(tmp_path), "--tasks", "medium", "--device", "cpu"]) == 2
    assert "unknown mixture setting" in capsys.readouterr().err
