"""Task ``jpeg`` end to end: the operator and the measurement read from each file, the file's noise,
the final projection, simulate's real JPEG files, the classical baseline and the benchmark tier."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import nfc_dps
from nfc_dps.baselines import CLASSICAL, NotApplicable, applicable, restore_classical
from nfc_dps.bench.spec import DEFAULT_METHODS
from nfc_dps.cli import main
from nfc_dps.io import write_image
from nfc_dps.io.jpeg import write_jpeg
from nfc_dps.operators import TASKS, build_operator
from nfc_dps.operators.jpeg import jpeg_measurement


def _photo(h: int, w: int, seed: int) -> np.ndarray:
    """A smooth colour image in [0.15, 0.85] with some edges (nothing clips after compression)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w] / max(h, w)
    base = np.stack([0.5 + 0.25 * np.sin(6 * xx + c + 3 * yy) for c in range(3)], -1)
    base[h // 3: 2 * h // 3, w // 4: w // 2] += 0.1
    return np.clip(base + 0.02 * rng.standard_normal((h, w, 3)), 0.15, 0.85).astype(np.float32)


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _outside(m, x: torch.Tensor) -> float:
    """The largest distance of x's coefficients from the cells of m's stored integers, in steps."""
    bounds = m.operator.cells(m.integers, x.double())
    return max(float((((c - hi).clamp_min(0) + (lo - c).clamp_min(0)) / (hi - lo)).max())
               for (lo, hi), c in zip(bounds, m.operator.coefficients(x.double())))


def test_the_task_is_registered_with_the_file_as_its_operator():
    task = TASKS["jpeg"]
    assert task.reads_measurement is not None and task.writes_measurement[0] == ".jpg"
    op = build_operator("jpeg", (24, 40), quality=30)
    assert op.measurement_noise().sigma == pytest.approx(op.sigma_y)
    with pytest.raises(ValueError, match="quality must be an int in 1..100"):
        build_operator("jpeg", (24, 40), quality=0)


def test_restore_uses_the_files_noise_projects_onto_its_cells_and_refuses_another_noise(tmp_path, prior_dir,
                                                                                       monkeypatch):
    path = tmp_path / "a.jpg"
    write_jpeg(path, _photo(32, 32, 0), 15)
    m = jpeg_measurement(path)
    out = nfc_dps.restore(m.y, m.operator, prior=prior_dir, num_levels=2, progress=False)
    assert out.noise_sigma == pytest.approx(m.sigma_y)
    inner = out.image[..., 8:-8, 8:-8]
    assert 0 < float(inner.min()) and float(inner.max()) < 1  # nothing clipped where it matters
    assert _outside(m, out.image) < 0.05  # projected (up to the float32 output's rounding)
    with monkeypatch.context() as patch:  # the same restoration without the projection is outside: the check tells
        patch.setattr(type(m.operator), "consistent", lambda self, x, y: x)
        assert _outside(m, nfc_dps.restore(m.y, m.operator, prior=prior_dir, num_levels=2, progress=False).image) > 0.05
    # the file's own level is accepted as stated, any other (or auto) refused in words
    assert torch.equal(nfc_dps.restore(m.y, m.operator, prior=prior_dir, num_levels=2, progress=False,
                                       sigma_y=m.sigma_y).image, out.image)
    for stated in ({"sigma_y": 0.05}, {"sigma_y": "auto"}, {"noise": "poisson:30"}):
        with pytest.raises(ValueError, match="noise is its own"):
            nfc_dps.restore(m.y, m.operator, prior=prior_dir, num_levels=2, progress=False, **stated)


def test_the_projection_moves_an_unprojected_restoration(tmp_path):
    path = tmp_path / "a.jpg"
    write_jpeg(path, _photo(24, 24, 1), 10)
    m = jpeg_measurement(path)
    x = m.decoded.double() + 0.05 * torch.randn(m.decoded.shape, generator=torch.Generator().manual_seed(0),
                                                dtype=torch.float64)
    assert not torch.allclose(m.operator.consistent(x, m.y), x)
    again = m.operator.consistent(m.operator.consistent(x, m.y), m.y)
    assert torch.allclose(again, m.operator.consistent(x, m.y), atol=1e-6)


def test_the_classical_baseline_applies_to_jpeg_only():
    op = build_operator("jpeg", (16, 16), quality=20)
    blur = build_operator("deblur_gaussian", (16, 16), kernel_size=5, kernel_std=1.0)
    assert "qcs_tv" in CLASSICAL and "qcs_tv" not in DEFAULT_METHODS
    assert applicable("qcs_tv", op) is None and "JPEG" in applicable("qcs_tv", blur)
    for other in ("wiener", "tv", "bicubic", "biharmonic"):
        assert "qcs_tv" in applicable(other, op)
    with pytest.raises(NotApplicable, match="qcs_tv"):
        restore_classical("tv", op, torch.zeros(1, 3, 16, 16), op.sigma_y)


def _two_jpegs(folder: Path) -> None:
    folder.mkdir()
    write_jpeg(folder / "a.jpg", _photo(32, 32, 2), 10)
    write_jpeg(folder / "b.jpg", _photo(32, 48, 3), 40)


def test_the_cli_restores_a_folder_of_jpegs_of_different_quality(tmp_path, prior_dir, monkeypatch):
    inp, out = tmp_path / "in", tmp_path / "out"
    _two_jpegs(inp)
    write_jpeg(inp / "c.jpg", _photo(32, 32, 4), 40)  # a's size, another quality: not batched with a
    calls = []
    real = nfc_dps.api.restore

    def counting(y, operator, **kwargs):
        calls.append((y.shape[0], operator.describe()["tables"][0][0][0]))
        return real(y, operator, **kwargs)

    monkeypatch.setattr(nfc_dps.api, "restore", counting)
    assert main(["restore", "--input", str(inp), "--output", str(out), "--task", "jpeg", "--prior", prior_dir,
                 "--set", "num_levels=2", "--batch-size", "2", "--quiet"]) == 0
    rows = {r["name"]: r for r in _rows(out / "results.csv")}
    assert set(rows) == {"a.jpg", "b.jpg", "c.jpg"} and all(r["status"] == "done" for r in rows.values())
    assert all(len(c) == 2 and c[0] == 1 for c in calls) and len(calls) == 3  # three operators, three calls
    for name, size in (("a", "32x32"), ("b", "32x48")):
        assert (out / f"{name}.png").is_file() and rows[f"{name}.jpg"]["size"] == size
    sigma = {n: float(r["noise_sigma"]) for n, r in rows.items()}
    assert sigma["a.jpg"] == pytest.approx(jpeg_measurement(inp / "a.jpg").sigma_y, abs=1e-5)
    assert sigma["a.jpg"] > sigma["b.jpg"]  # each file's own noise: quality 10 quantises coarser
    assert json.loads((out / "resolved_config.json").read_text())["task"]["noise_sigma"] is None


def test_the_cli_refuses_a_png_and_a_stated_noise_before_any_work(tmp_path, prior_dir, capsys):
    inp = tmp_path / "in"
    inp.mkdir()
    write_image(inp / "a.png", _photo(16, 16, 5), 8)
    out = tmp_path / "out"
    assert main(["restore", "--input", str(inp), "--output", str(out), "--task", "jpeg", "--prior", prior_dir]) == 2
    err = capsys.readouterr().err
    assert "a.png" in err and "not a JPEG" in err and not out.exists()
    jpegs = tmp_path / "jpegs"
    _two_jpegs(jpegs)
    for flags in (["--noise-sigma", "0.05"], ["--noise-sigma", "auto"], ["--noise", "poisson:30"]):
        assert main(["restore", "--input", str(jpegs), "--output", str(out), "--task", "jpeg", "--prior", prior_dir,
                     *flags]) == 2
        err = capsys.readouterr().err
        assert flags[0] in err and "reads its noise from each file" in err and not out.exists()


def test_simulate_writes_jpeg_files_that_restore(tmp_path, prior_dir):
    clean, sim, out = tmp_path / "clean", tmp_path / "sim", tmp_path / "out"
    clean.mkdir()
    write_image(clean / "a.png", _photo(32, 32, 6), 8)
    assert main(["simulate", "--input", str(clean), "--output", str(sim), "--task", "jpeg", "--param", "quality=25",
                 "--quiet"]) == 0
    record = json.loads((sim / "simulation.json").read_text())
    assert record["images"][0]["measurement"] == "measurements/a.jpg"
    assert record["task"]["task"] == "jpeg" and record["task"]["noise_sigma"] is None
    m = jpeg_measurement(sim / "measurements" / "a.jpg")  # a real JPEG, at the quality asked
    assert np.array_equal(m.operator.tables[0].numpy(), build_operator("jpeg", (32, 32), quality=25).tables[0].numpy())
    assert main(["simulate", "--input", str(clean), "--output", str(tmp_path / "s2"), "--task", "jpeg",
                 "--noise-sigma", "0.01"]) == 2
    assert main(["restore", "--config", str(sim / "simulation.json"), "--output", str(out), "--prior", prior_dir,
                 "--set", "num_levels=2", "--quiet"]) == 0
    row = _rows(out / "results.csv")[0]
    assert row["status"] == "done" and row["psnr"] and (out / "a.png").is_file()


def test_the_jpeg_tier_writes_its_rows_and_its_table(tmp_path, prior_dir):
    from nfc_dps.bench.cli import main as bench
    from nfc_dps.bench.jpeg import jpeg_doc_table
    from nfc_dps.bench.tables import load_results

    out = tmp_path / "jpeg"
    argv = ["--protocol", "jpeg", "--size", "32", "--tasks", "q10", "--methods", "decoded,qcs_tv,nfc",
            "--image-names", "camera", "--prior", prior_dir, "--threads", "1", "--out", str(out), "--no-plots"]
    assert bench(argv) == 0
    rows = load_results(out / "results.csv")
    assert [r["method"] for r in rows] == ["decoded", "qcs_tv", "nfc"]
    assert all(r["psnr"] and not r["note"] for r in rows) and (out / "files" / "camera_q10.jpg").is_file()
    assert {p.name for p in out.iterdir()} >= {"results.csv", "summary.md", "config.json"}
    table = jpeg_doc_table(out, "bench/")
    assert "| 10 | QCS + TV (classical) |" in table and "| 10 | NFC default + projection |" in table
    before = (out / "results.csv").read_text()
    assert bench(argv) == 0 and (out / "results.csv").read_text() == before  # resumes: nothing to redo
    assert bench([*argv[:4], "--tasks", "q15", "--out", str(tmp_path / "other")]) == 2  # not a quality


def test_calibrate_refuses_the_task_in_words(tmp_path, prior_dir, capsys):
    clean = tmp_path / "clean"
    clean.mkdir()
    write_image(clean / "a.png", _photo(16, 16, 7), 8)
    assert main(["calibrate", "--images", str(clean), "--task", "jpeg", "--prior", prior_dir, "--preset", "fast",
                 "--samples", "2", "--out", str(tmp_path / "cal.json")]) == 2
    assert "each measurement is a file" in capsys.readouterr().err
