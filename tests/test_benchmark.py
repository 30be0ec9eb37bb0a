"""Benchmark harness: a tiny end-to-end local run, resume, reused measurements, the oracle and
profile modes, and a 2-process torchrun run identical to the single-process one."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from nfc_dps.bench.cli import main
from nfc_dps.bench.measurements import load_images, measurement
from nfc_dps.bench.spec import BenchSpec, method_config, method_runs, task_specs
from nfc_dps.bench.tables import COLUMNS, VOLATILE
from nfc_dps.noise import GaussianNoise
from nfc_dps.restore_inputs import stable_seed

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]


def base_args(prior: Path, out: Path, *extra: str) -> list[str]:
    return ["--protocol", "local", "--prior", str(prior), "--out", str(out), "--size", "16", "--zoom", "1",
            "--image-names", "astronaut,camera", "--budgets", "2", "--threads", "1", "--device", "cpu", *extra]


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def stable_part(rows):
    return [{k: v for k, v in r.items() if k not in VOLATILE} for r in rows]


def check_psnr_against_ground_truth(out: Path, rows) -> None:
    """Each row's PSNR is its saved image's against the saved ground truth (8-bit PNG rounding:
    below 0.05 dB here), not against the measurement or another image."""
    from nfc_dps.io import read_image
    from nfc_dps.metrics import psnr

    for r in rows:
        with np.load(out / "measurements" / r["task"] / f"{r['image']}.npz") as z:
            x = torch.from_numpy(z["x"])[None]
        png = out / "images" / r["task"] / r["image"] / f"{r['method'].replace(':', '-')}-{r['estimator']}-{r['budget']}.png"
        restored = torch.from_numpy(np.moveaxis(read_image(png)[0], -1, 0))[None].float()
        assert float(r["psnr"]) == pytest.approx(float(psnr(restored, x)), abs=0.05), (r, png)


def test_local_run_end_to_end_and_resume(tiny_prior, tmp_path, capsys):
    out = tmp_path / "run"
    args = base_args(tiny_prior, out, "--tasks", "deblur_gaussian,inpaint_random", "--methods", "nfc,tv")
    assert main(args) == 0
    rows = read_rows(out / "results.csv")
    assert len(rows) == 2 * 2 * 2  # tasks x methods x images
    assert set(rows[0]) == set(COLUMNS)
    assert {(r["method"], r["budget"], r["nfe"]) for r in rows} == {("nfc", "2", "2"), ("tv", "0", "0")}
    for r in rows:
        assert r["note"] == ""
        assert -1 <= float(r["ssim"]) <= 1 and float(r["mse"]) > 0
        assert r["lpips"] == "" or float(r["lpips"]) >= 0
    check_psnr_against_ground_truth(out, rows)
    summary = (out / "summary.md").read_text()
    assert "PSNR (mean ± std)" in summary and "| nfc @2 |" in summary and "| tv |" in summary
    assert (out / "grid.png").is_file() and not (out / "parts").exists()
    assert (out / "images" / "deblur_gaussian" / "astronaut" / "nfc-sample-2.png").is_file()
    before = (out / "results.csv").read_text()
    capsys.readouterr()
    # rerun: every row is done, nothing is recomputed (timings unchanged), same file
    assert main(args) == 0
    assert "] psnr " not in capsys.readouterr().out
    assert (out / "results.csv").read_text() == before
    # adding a method only adds its rows
    assert main(base_args(tiny_prior, out, "--tasks", "deblur_gaussian,inpaint_random",
                                "--methods", "nfc,tv,wiener")) == 0
    rows2 = read_rows(out / "results.csv")
    assert len(rows2) == 8 + 2  # wiener applies to the blur only
    assert [r for r in rows2 if r["method"] != "wiener"] == rows
    assert "inpaint_random / wiener: skipped" in (out / "summary.md").read_text()
    # another noise level in the same folder is refused, not silently mixed
    assert main(base_args(tiny_prior, out, "--tasks", "deblur_gaussian", "--methods", "tv",
                                "--sigma-y", "0.05")) == 2


def test_a_changed_preset_or_prior_is_refused_in_an_existing_folder(tiny_prior, tmp_path, capsys):
    """The row key (task, image, method, estimator, budget) does not hold the sampler config nor the
    prior: config.json records both, and a rerun after either changed is an error naming it."""
    import shutil

    out = tmp_path / "run"
    args = base_args(tiny_prior, out, "--tasks", "deblur_gaussian", "--methods", "nfc", "--image-names", "camera")
    assert main(args) == 0
    cfg_path = out / "config.json"
    saved = json.loads(cfg_path.read_text())
    nfc_cfg = saved["configs"]["nfc@2"]
    assert nfc_cfg["num_levels"] * nfc_cfg["ode_steps"] == 2 and len(saved["prior_sha256"]) == 16
    assert main(base_args(tiny_prior, out, "--tasks", "deblur_gaussian", "--methods", "tv",
                          "--image-names", "camera")) == 0  # a classical column: nothing to compare
    assert json.loads(cfg_path.read_text())["configs"] == saved["configs"]  # earlier columns are kept
    original = cfg_path.read_text()
    saved["configs"]["nfc@2"]["sigma_min"] = 123.0  # as if the preset had changed since the rows were written
    cfg_path.write_text(json.dumps(saved))
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "nfc@2 config sigma_min: 123.0 ->" in err and "another --out" in err
    cfg_path.write_text(original)
    other = tmp_path / "other_prior"
    shutil.copytree(tiny_prior, other)
    cfg = json.loads((other / "unet" / "config.json").read_text())
    (other / "unet" / "config.json").write_text(json.dumps({**cfg, "note": "retrained"}))
    assert main(base_args(other, out, "--tasks", "deblur_gaussian", "--methods", "nfc", "--image-names", "camera")) == 2
    err = capsys.readouterr().err
    assert "prior (sha256 of its files)" in err and "nfc@2 config" not in err
    assert main(args) == 0  # the folder's own prior and presets still resume
    # a folder of the earlier format (no record) resumes, says it cannot check, and records from now on
    saved = json.loads(cfg_path.read_text())
    cfg_path.write_text(json.dumps({k: v for k, v in saved.items() if k not in ("configs", "prior_sha256")}))
    capsys.readouterr()
    assert main(args) == 0
    assert "predates the record of sampler configs" in capsys.readouterr().out
    assert json.loads(cfg_path.read_text())["configs"] == saved["configs"]


def test_columns_without_rows_are_not_compared(tiny_prior, tmp_path):
    """An interrupted first run leaves a record but no rows: editing the preset then is allowed."""
    out = tmp_path / "run"
    args = base_args(tiny_prior, out, "--tasks", "deblur_gaussian", "--methods", "nfc", "--image-names", "camera")
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"configs": {"nfc@2": {"sigma_min": 123.0}}}))
    assert main(args) == 0
    assert json.loads((out / "config.json").read_text())["configs"]["nfc@2"]["sigma_min"] != 123.0


def test_measurements_generated_once_and_reused(tmp_path):
    spec = BenchSpec(out=tmp_path / "a", size=16, zoom=1, image_names=("chelsea",), save_images=False)
    task = task_specs("local", 16, "circular")["deblur_motion"]
    img = load_images(spec)[0][1]
    op1, x1, y1, meta1 = measurement(spec, task, "chelsea", img)
    npz = tmp_path / "a" / "measurements" / "deblur_motion" / "chelsea.npz"
    assert npz.is_file() and npz.with_suffix(".json").is_file()
    stamp = npz.stat().st_mtime_ns
    op2, x2, y2, meta2 = measurement(spec, task, "chelsea", img)  # loaded, not regenerated
    assert npz.stat().st_mtime_ns == stamp
    assert torch.equal(y1, y2) and torch.equal(x1, x2) and torch.equal(op1.kernel, op2.kernel)
    # an independent folder regenerates the identical measurement from the derived seeds
    _, _, y3, _ = measurement(BenchSpec(out=tmp_path / "b", size=16, zoom=1, save_images=False),
                                    task, "chelsea", img)
    assert torch.equal(y1, y3)
    # a different specification for the same file is an error
    with pytest.raises(ValueError, match="differs"):
        measurement(BenchSpec(out=tmp_path / "a", size=16, zoom=1, noise=GaussianNoise(0.1), save_images=False),
                          task, "chelsea", img)


def test_budget_configs_hit_the_budget_exactly():
    c = method_config("nfc", "fast", 20, {"ode_steps": 5})
    assert (c.num_levels, c.ode_steps, c.nfe) == (4, 5, 20)
    c = method_config("nfc", "fast", 50, {"ode_steps": 2})
    assert (c.num_levels, c.ode_steps, c.nfe) == (25, 2, 50)
    c = method_config("daps", "fast", 2, {"ode_steps": 5})
    assert (c.num_levels, c.ode_steps, c.nfe) == (1, 2, 2)
    assert method_config("nfc", "fast", 7).nfe == 7
    assert method_config("dps", "fast", 50).num_steps == 50
    c = method_config("nfc", "fast", 10, {"inner": "langevin", "band.blend_start": 0.1})
    assert c.inner == "langevin" and c.band.blend_start == 0.1
    with pytest.raises(ValueError, match="unknown nfc config keys"):
        method_config("nfc", "fast", 10, {"nope": 1})
    assert method_config("dpir", "fast", 12).num_steps == 12  # a deterministic peer takes budgets too
    assert stable_seed(0, "a", "b") == stable_seed(0, "a", "b") != stable_seed(0, "b", "a")


def test_samples_add_mean_rows(tiny_prior, tmp_path):
    out = tmp_path / "k"
    assert main(base_args(tiny_prior, out, "--tasks", "deblur_gaussian", "--methods", "nfc",
                                "--samples", "2", "--image-names", "coffee")) == 0
    rows = read_rows(out / "results.csv")
    assert [r["estimator"] for r in rows] == ["sample", "mean2"]
    check_psnr_against_ground_truth(out, rows)
    assert rows[0]["psnr"] != rows[1]["psnr"]  # the mean of 2 chains is not chain 0
    assert "nfc (mean of 2) @2" in (out / "summary.md").read_text()


def test_method_entries_name_their_preset_and_deterministic_rows_come_once(tiny_prior, tmp_path):
    """--methods nfc,nfc:deterministic,dpir: two NFC columns; deterministic ones give one
    'deterministic' row even with --samples 2 (K copies would be identical)."""
    out = tmp_path / "m"
    assert main(base_args(tiny_prior, out, "--tasks", "deblur_gaussian", "--methods", "nfc,nfc:deterministic,dpir",
                                "--samples", "2", "--image-names", "coffee", "--no-images",
                                "--set", "nfc:deterministic.prior_weight=0.3")) == 0
    rows = read_rows(out / "results.csv")
    assert [(r["method"], r["estimator"]) for r in rows] == [
        ("nfc", "sample"), ("nfc", "mean2"), ("nfc:deterministic", "deterministic"), ("dpir", "deterministic")]
    assert [r["nfe"] for r in rows] == ["2", "4", "2", "2"] and not any(r["note"] for r in rows)  # the mean: 2 chains
    sample, mean = rows[0], rows[1]
    assert float(sample["seconds"]) == pytest.approx(float(mean["seconds"]) / 2, abs=1e-3)  # one chain's share
    assert "nfc:deterministic @2" in (out / "summary.md").read_text()
    with pytest.raises(ValueError, match="unknown method"):
        method_runs(BenchSpec(methods=("tv:fast",)))


def test_oracle_table_reports_bounds(tmp_path):
    out = tmp_path / "oracle"
    assert main(["--protocol", "oracle", "--out", str(out), "--size", "16", "--num-images", "3",
                       "--budgets", "4", "--methods", "nfc,daps,ddrm,dpir,wiener", "--threads", "1", "--device", "cpu"]) == 0
    rows = read_rows(out / "results.csv")
    methods = {r["method"] for r in rows}
    assert {"exact-mmse", "exact-sample", "wiener", "nfc-iso", "nfc-spec-y", "nfc-spec-S", "daps-iso", "ddrm",
            "dpir"} <= methods
    assert {r["estimator"] for r in rows if r["method"] == "dpir"} == {"deterministic"}  # judged against the MMSE bound
    assert all(len([r for r in rows if r["method"] == m]) == 3 for m in methods)
    text = (out / "summary.md").read_text()
    assert "posterior mean (MMSE)" in text and "to sample bound" in text
    cfg = json.loads((out / "config.json").read_text())
    # the bounds are expected PSNRs of the exact estimators: their rows land near them (3 images of
    # 16 px: measured 0.6 and 1.1 dB above; a unit slip moves the bounds by 6 dB)
    for method, bound in (("exact-mmse", "bound_mmse_db"), ("exact-sample", "bound_sample_db")):
        mse = np.mean([float(r["mse"]) for r in rows if r["method"] == method])
        assert abs(-10 * np.log10(mse) - cfg[bound]) < 2.0, (method, -10 * np.log10(mse), cfg[bound])
    args = ["--protocol", "oracle", "--out", str(out), "--size", "16", "--num-images", "3", "--budgets", "4",
            "--methods", "nfc,daps,ddrm,dpir,wiener", "--threads", "1", "--device", "cpu"]
    assert main(args + ["--oracle-alpha", "3"]) == 2  # another prior in the same folder is refused
    cfg["configs"]["nfc-fast_psnr-matched@4"]["num_levels"] = 99  # as if the preset had changed
    (out / "config.json").write_text(json.dumps(cfg))
    assert main(args) == 2


def test_the_oracle_runs_every_registered_sampler(monkeypatch):
    """The oracle's method list is the sampler registry's: a new sampler is a row with no edit there."""
    from nfc_dps.bench.oracle import oracle_configs, oracle_methods
    from nfc_dps.samplers import METHODS, Method

    monkeypatch.setitem(METHODS, "newcomer", Method(METHODS["ddnm"].sample, METHODS["ddnm"].config_class,
                                                    METHODS["ddnm"].presets, "Newcomer", rank=99))
    runs = {label: (method, cfg) for label, method, cfg in oracle_configs(7)}
    assert {"newcomer", "dpir", "ddrm", "dps"} <= set(runs) and "newcomer" in oracle_methods()
    from nfc_dps.bench.report import oracle_rows

    assert oracle_rows()["newcomer"] == "Newcomer"  # the oracle table lists it: no hand-kept list
    assert all(cfg.nfe == 7 for label, (method, cfg) in runs.items() if method not in ("nfc", "daps"))


def test_profile_reports_ratio(tiny_prior, tmp_path):
    out = tmp_path / "profile"
    assert main(["--profile", "--prior", str(tiny_prior), "--out", str(out), "--size", "16", "--zoom", "1",
                       "--image-names", "camera", "--budgets", "4", "--methods", "nfc,nfc:deterministic,dpir,tv",
                       "--threads", "1", "--device", "cpu"]) == 0
    res = json.loads((out / "profile.json").read_text())
    assert list(res["methods"]) == ["nfc", "nfc:deterministic", "dpir"]  # every network column, by its label
    assert res["methods"]["nfc:deterministic"]["config"]["prior_weight"] > 0 and res["methods"]["dpir"]["nfe"] == 4
    assert "inner (exact)" in res["methods"]["nfc:deterministic"]["phases_s"]
    r = res["methods"]["nfc"]
    assert r["nfe"] == 4 and r["ratio"] > 0 and "network" in r["phases_s"] and "inner (exact)" in r["phases_s"]
    assert "total / network" in (out / "profile.md").read_text() and r["overhead_ratio"] >= 1.0


def test_profile_phases_come_from_the_samplers_record_function_ranges():
    """The profile's breakdown comes from the samplers' ``record_function("nfc.<phase>")`` ranges:
    every phase has a column, NFC and DAPS together mark all of them, and profiling a run changes
    no bit of its output."""
    from nfc_dps.api import restore
    from nfc_dps.bench.profiling import PHASE_LABELS, profiled_phases
    from nfc_dps.operators import BlurOperator, gaussian_kernel
    from nfc_dps.priors import GaussianSpectralPrior
    from nfc_dps.samplers import get_config, nfc

    assert set(PHASE_LABELS) == {f"nfc.{p}" for p in nfc.PHASES}
    prior = GaussianSpectralPrior((16, 16), channels=1)
    op = BlurOperator(gaussian_kernel(5, 1.0), "circular")
    x = ((prior.sample(1, torch.Generator().manual_seed(0), dtype=torch.float32) + 1) / 2).clamp(0, 1)
    y = op.measure(x, 0.025, torch.Generator().manual_seed(1))
    seen: dict[str, dict[str, float]] = {}
    for method, cfg in (("nfc", get_config("nfc", "fast", num_levels=3, ode_steps=1)),
                        ("daps", get_config("daps", "fast", num_levels=2, ode_steps=1, langevin_steps=3)),
                        ("nfc:deterministic", get_config("nfc", num_levels=2))):
        def run(cfg=cfg, method=method.split(":")[0]):
            return restore(y, op, prior=prior, method=method, config=cfg, sigma_y=0.025, seed=3, progress=False)

        plain = run()
        profiled, phases = profiled_phases(run)
        assert torch.equal(plain.image, profiled.image), method
        assert all(t >= 0 for t in phases.values())
        seen[method] = phases
    labels = {k: PHASE_LABELS[f"nfc.{k}"] for k in nfc.PHASES}
    assert set(seen["nfc"]) == {labels[k] for k in ("spectrum", "renoise", "predictor", "band", "inner_exact", "haar")}
    assert set(seen["daps"]) == {labels[k] for k in ("renoise", "predictor", "band", "inner_langevin")}
    assert set(seen["nfc:deterministic"]) == {labels[k] for k in ("spectrum", "predictor", "inner_exact")}
    assert set(seen["nfc"]) | set(seen["daps"]) == set(PHASE_LABELS.values())


def test_prior_identity_lists_files_and_hashes_their_contents_only_on_request(tmp_path):
    """One description of a prior folder: restore's resume key (sizes and times, no file read) and
    the benchmark's record (a content hash and the newest file's time)."""
    from nfc_dps.bench.runner import prior_record
    from nfc_dps.priors.default import prior_identity

    (tmp_path / "unet").mkdir()
    (tmp_path / "unet" / "config.json").write_text("{}")
    (tmp_path / "w.bin").write_bytes(b"x")
    info = prior_identity(tmp_path)
    assert info["path"] == str(tmp_path) and info["resolved"] == str(tmp_path.resolve())
    assert info["embedded_default"] is False and "sha256" not in info
    assert list(info["files"]) == ["unet/config.json", "w.bin"] and info["files"]["w.bin"][0] == 1
    rec = prior_record(str(tmp_path))
    assert list(rec) == ["path", "embedded_default", "sha256", "modified"] and len(rec["sha256"]) == 16
    (tmp_path / "w.bin").write_bytes(b"y")
    assert prior_record(str(tmp_path))["sha256"] != rec["sha256"]
    assert prior_identity(tmp_path / "missing")["files"] == {} and list(prior_record(str(tmp_path / "missing"))) == [
        "path", "embedded_default"]


@pytest.mark.slow
def test_torchrun_two_processes_equal_single_process(tiny_prior, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    common = ["--tasks", "deblur_gaussian", "--methods", "nfc,ddnm", "--no-images", "--no-plots"]
    single = subprocess.run([sys.executable, "-m", "nfc_dps", "bench", *base_args(tiny_prior, tmp_path / "single", *common)],
                            env=env, capture_output=True, text=True, timeout=120)
    assert single.returncode == 0, single.stderr[-2000:]
    multi = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
                            "-m", "nfc_dps", "bench", *base_args(tiny_prior, tmp_path / "multi", *common)],
                           env=env, capture_output=True, text=True, timeout=120)
    assert multi.returncode == 0, (multi.stdout + multi.stderr)[-3000:]
    assert "[rank 1]" in multi.stdout and "[rank 0]" in multi.stdout  # both ranks did work
    a = read_rows(tmp_path / "single" / "results.csv")
    b = read_rows(tmp_path / "multi" / "results.csv")
    assert len(a) == 2 * 2  # 1 task x 2 methods x 2 images
    assert stable_part(a) == stable_part(b)
    assert not (tmp_path / "multi" / "parts").exists()
    # the measurements are byte-identical too
    for img in ("astronaut", "camera"):
        with np.load(tmp_path / "single" / "measurements" / "deblur_gaussian" / f"{img}.npz") as za, \
                np.load(tmp_path / "multi" / "measurements" / "deblur_gaussian" / f"{img}.npz") as zb:
            assert all(np.array_equal(za[k], zb[k]) for k in za.files)


def test_without_matplotlib_plots_are_skipped_with_a_message(tiny_prior, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    out = tmp_path / "nompl"
    assert main(base_args(tiny_prior, out, "--tasks", "sr_bicubic", "--methods", "bicubic,tv")) == 0
    assert "matplotlib not installed" in capsys.readouterr().out
    assert (out / "results.csv").is_file() and (out / "summary.md").is_file() and (out / "grid.png").is_file()
    assert not (out / "bars.png").exists()


def test_a_classical_only_grid_never_reads_the_prior(tmp_path):
    """Classical methods use no network: --prior is neither loaded nor hashed (a missing folder is
    no error), and summary.md says no prior was used."""
    out = tmp_path / "run"
    args = base_args(tmp_path / "no_such_prior", out, "--tasks", "deblur_gaussian", "--methods", "tv,wiener")
    assert main(args) == 0
    assert len(read_rows(out / "results.csv")) == 2 * 2
    assert "prior_sha256" not in json.loads((out / "config.json").read_text())
    summary = (out / "summary.md").read_text()
    assert "none (classical methods only)" in summary and "network precision" not in summary


def test_a_failed_row_is_retried_by_a_rerun(tiny_prior, tmp_path, monkeypatch):
    """A method that raised leaves a row with its reason in `note`; the next run into the same
    folder computes it again and the merged results.csv holds the new row only."""
    import nfc_dps.bench.grid as baselines  # the harness calls restore_classical through its grid protocol

    out = tmp_path / "run"
    args = base_args(tiny_prior, out, "--tasks", "deblur_gaussian", "--methods", "tv,wiener")
    real = baselines.restore_classical

    def flaky(name, *a, **kw):
        if name == "tv":
            raise RuntimeError("out of memory (simulated)")
        return real(name, *a, **kw)

    monkeypatch.setattr(baselines, "restore_classical", flaky)
    assert main(args) == 0
    rows = read_rows(out / "results.csv")
    failed = [r for r in rows if r["method"] == "tv"]
    assert len(failed) == 2 and all(r["psnr"] == "" and "simulated" in r["note"] for r in failed)
    wiener = [r for r in rows if r["method"] == "wiener"]
    monkeypatch.setattr(baselines, "restore_classical", real)
    assert main(args) == 0
    rows = read_rows(out / "results.csv")
    assert len(rows) == 4 and [r for r in rows if r["method"] == "wiener"] == wiener
    assert all(r["psnr"] and r["note"] == "" for r in rows if r["method"] == "tv")
    assert "FAILED" not in (out / "summary.md").read_text()


@pytest.mark.parametrize("flags, needle", [(["--sigma-y", "12.75"], "divide by 255"), (["--sigma-y", "-0.1"], "--sigma-y"),
                                           (["--samples", "0"], "--samples"), (["--zoom", "0"], "--zoom")])
def test_bad_settings_exit_2_naming_the_flag(tmp_path, capsys, flags, needle):
    assert main(["--protocol", "local", "--out", str(tmp_path / "run"), "--methods", "tv", *flags]) == 2
    assert needle in capsys.readouterr().err and not (tmp_path / "run").exists()


def test_a_folder_refuses_rows_of_other_images_or_precision(tiny_prior, tmp_path, capsys):
    """Rows of another --images folder (same file names) or another network precision are not
    mixed into an existing --out; the tables average over this run's images only."""
    from nfc_dps.io import write_image

    folders = {}
    for tag, level in (("a", 0.2), ("b", 0.8)):
        folders[tag] = tmp_path / tag
        folders[tag].mkdir()
        write_image(folders[tag] / "p.png", np.full((16, 16, 3), level, np.float32))
    out = tmp_path / "out"
    grid = ["--protocol", "local", "--out", str(out), "--size", "16", "--zoom", "1", "--tasks", "deblur_gaussian",
            "--threads", "1", "--no-images", "--no-plots"]
    assert main(grid + ["--images", str(folders["a"]), "--methods", "tv"]) == 0
    assert main(grid + ["--images", str(folders["b"]), "--methods", "tv,wiener"]) == 2
    assert "not this run's image" in capsys.readouterr().err
    net = base_args(tiny_prior, tmp_path / "net", "--tasks", "deblur_gaussian", "--methods", "nfc", "--no-images",
                    "--no-plots", "--image-names", "camera")
    assert main(net + ["--precision", "float32"]) == 0
    assert main(net + ["--precision", "bfloat16"]) == 2
    assert "network precision: float32 -> bfloat16" in capsys.readouterr().err
    wider = base_args(tiny_prior, tmp_path / "net", "--tasks", "deblur_gaussian", "--methods", "tv", "--no-images",
                      "--no-plots", "--image-names", "astronaut")
    assert main(wider + ["--precision", "float32"]) == 0
    summary = (tmp_path / "net" / "summary.md").read_text()
    assert "not in this run (camera)" in summary and "| nfc" not in summary  # its only row is camera's


def test_bad_flags_are_one_line_errors(tiny_prior, tmp_path, capsys):
    cases = [
        (["--threads", "-1"], "--threads must be >= 1"),
        (["--num-images", "0"], "--num-images must be >= 1"),
        (["--size", "0"], "--size must be >= 1"),
        (["--tasks", "foo"], "--tasks foo: unknown"),
        (["--methods", "tv", "--set", "tv.lam=5"], "a classical method has no sampler settings"),
        (["--methods", "nfc", "--set", "nfcc.inner=langevin"], "not a diffusion column"),
        (["--methods", "nfc", "--set", "nfc.num_levels=abc"], "num_levels"),
        (["--methods", "nfc:deterministic", "--set", "nfc.prior_weight=0.3"], "not a diffusion column"),
    ]
    for extra, message in cases:
        args = base_args(tiny_prior, tmp_path / "x", "--no-images", "--no-plots")
        args = [a for i, a in enumerate(args) if not (args[i - 1] == "--threads" and extra[0] == "--threads")
                and not (a == "--threads" and extra[0] == "--threads")]
        assert main(args + extra) == 2, extra
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, (extra, err)
    oracle = ["--protocol", "oracle", "--out", str(tmp_path / "o"), "--size", "16", "--num-images", "1", "--threads", "1"]
    for extra, message in ((["--set", "nfc.inner=langevin"], "--set: the oracle protocol"),
                           (["--samples", "2"], "--samples: the oracle protocol"),
                           (["--methods", "foo"], "--methods foo: the oracle protocol runs")):
        assert main(oracle + extra) == 2
        assert message in capsys.readouterr().err


def test_mixture_and_grid_do_not_share_a_folder(tmp_path, capsys):
    out = tmp_path / "shared"
    assert main(["--protocol", "local", "--out", str(out), "--size", "16", "--zoom", "1", "--tasks", "deblur_gaussian",
                 "--methods", "tv", "--image-names", "camera", "--threads", "1", "--no-images", "--no-plots"]) == 0
    before = (out / "results.csv").read_text()
    assert main(["--protocol", "mixture", "--out", str(out), "--threads", "1"]) == 2
    assert "holds results of another protocol" in capsys.readouterr().err
    assert (out / "results.csv").read_text() == before


def test_the_oracle_retries_a_failed_row(tmp_path, monkeypatch):
    """A row that failed (an out-of-memory, say) is run again by the next invocation, as the grid's are."""
    from nfc_dps.samplers import METHODS

    args = ["--protocol", "oracle", "--out", str(tmp_path / "o"), "--size", "16", "--num-images", "1",
            "--budgets", "4", "--methods", "ddnm", "--threads", "1"]

    def failing(*a, **k):
        raise RuntimeError("simulated out-of-memory")

    import dataclasses

    monkeypatch.setitem(METHODS, "ddnm", dataclasses.replace(METHODS["ddnm"], sample=failing))
    assert main(args) == 0
    assert "simulated out-of-memory" in [r for r in read_rows(tmp_path / "o" / "results.csv") if r["method"] == "ddnm"][0]["note"]
    monkeypatch.undo()
    assert main(args) == 0
    row = [r for r in read_rows(tmp_path / "o" / "results.csv") if r["method"] == "ddnm"]
    assert len(row) == 1 and not row[0]["note"] and row[0]["psnr"]


def test_the_committed_rows_are_seeded_as_the_harness_seeds_them_now():
    """Every row of a committed result file carries the sampler seed the harness derives today from
    (--seed, task, image): rerunning its command reproduces its measurements."""
    from nfc_dps.bench.spec import seed_name
    from nfc_dps.restore_inputs import stable_seed

    rows = read_rows(Path(__file__).resolve().parents[1] / "docs" / "bench" / "local256_det_results.csv")
    seeded = [r for r in rows if r["seed"]]
    assert {r["task"] for r in seeded} >= {"sr_bicubic", "deblur_gaussian"}
    for r in seeded:
        assert int(r["seed"]) == stable_seed(0, "sampler", seed_name(r["task"]), r["image"]), r


def test_paper_protocol_takes_photographs_by_name_or_a_folder(tmp_path):
    """The paper protocol's images: --images, or scikit-image photographs by name (the held-out ones
    are its test images); neither is an error that names both flags."""
    spec = BenchSpec(protocol="paper", out=tmp_path, size=32, zoom=1, image_names=("camera", "coffee"))
    imgs = load_images(spec)
    assert [n for n, _ in imgs] == ["camera", "coffee"] and all(a.shape == (32, 32, 3) for _, a in imgs)
    with pytest.raises(ValueError, match="--images DIR.*--image-names"):
        load_images(BenchSpec(protocol="paper", out=tmp_path, size=32))


def test_a_set_changes_the_column_it_names_only():
    """--set nfc.KEY is the bare nfc column's (at --preset), --set nfc:deterministic.KEY that preset's
    column: a key of one sampler's config never reaches another preset's (another config class)."""
    from nfc_dps.bench.spec import BenchSpec, method_runs

    spec = BenchSpec(methods=("nfc", "nfc:deterministic"), budgets=(25,),
                     overrides={"nfc": {"inner_temperature": 0.0}, "nfc:deterministic": {"prior_weight": 0.4}})
    bare, det = method_runs(spec)
    assert bare.config.inner_temperature == 0.0 and det.config.prior_weight == 0.4
    assert not hasattr(det.config, "inner_temperature")
    plain = {r.preset: r.config for r in method_runs(BenchSpec(methods=("nfc", "nfc:deterministic"), budgets=(25,)))}
    assert plain[None].inner_temperature != 0.0 and plain["deterministic"].prior_weight != 0.4


def test_every_protocol_states_its_blur_boundary():
    """The harness's blur tasks take the protocol's stated boundary (local: circular, paper: reflect;
    the nonlinear tier and the tuned baselines: circular), never the task registry's default, so its
    committed result files stay reproducible by their commands."""
    from nfc_dps.bench.nonlinear import SETTINGS
    from nfc_dps.operators import TASKS

    for protocol, boundary in (("local", "circular"), ("paper", "reflect")):
        blurs = [s for s in task_specs(protocol, 64, boundary).values() if "boundary" in TASKS[s.name].params]
        assert {s.name for s in blurs} >= {"deblur_gaussian", "deblur_motion", "deblur_camera"}
        assert all(s.params["boundary"] == boundary for s in blurs)
    for s in SETTINGS.values():
        if "boundary" in TASKS[s.task].params:
            assert s.params(64)["boundary"] == s.params(256)["boundary"] == "circular"


def test_noise_models_on_the_grid(tiny_prior, tmp_path, capsys):
    """--noise poisson:30 (parsed by nfc_dps.noise.parse_noise): the measurements are Poisson counts
    / 30 and config.json, summary.md and each measurement's record name the model; a method that
    cannot take it is refused before any work when named, left out of the default methods, saying
    why; --noise gaussian:S is --sigma-y S; the other protocols refuse it."""
    out = tmp_path / "run"
    poisson = ("--tasks", "deblur_gaussian", "--noise", "poisson:30")
    assert main(base_args(tiny_prior, out, *poisson, "--methods", "nfc,ddrm,tv")) == 2
    err = capsys.readouterr().err
    assert "--noise poisson:30: ddrm takes gaussian noise, not poisson:30" in err
    assert "tv is a classical baseline for Gaussian noise" in err and not out.exists()
    assert main(base_args(tiny_prior, out, *poisson, "--methods", "nfc")) == 0
    rows = read_rows(out / "results.csv")
    assert len(rows) == 2 and all(r["psnr"] and not r["note"] for r in rows)
    record = json.loads((out / "config.json").read_text())
    assert record["fingerprint"]["noise"] == record["spec"]["noise"] == "poisson:30"
    assert "**noise**: poisson:30" in (out / "summary.md").read_text()
    for image in ("astronaut", "camera"):
        meta = json.loads((out / "measurements" / "deblur_gaussian" / f"{image}.json").read_text())
        assert meta["noise"] == "poisson:30"
        with np.load(out / "measurements" / "deblur_gaussian" / f"{image}.npz") as z:
            counts = z["y"].astype(np.float64) * 30
        assert (counts >= 0).all() and np.abs(counts - np.round(counts)).max() < 1e-3
    # Gaussian noise is another configuration of the folder
    assert main(base_args(tiny_prior, out, "--tasks", "deblur_gaussian", "--methods", "nfc")) == 2
    assert "noise" in capsys.readouterr().err
    # the default methods: those that take the noise model, the others named
    from nfc_dps.bench.cli import build_parser, spec_from_args

    spec = spec_from_args(build_parser().parse_args(["--noise", "poisson-gaussian:30,0.01"]))
    assert str(spec.noise) == "poisson-gaussian:30,0.01" and "ddrm" not in spec.methods and "tv" not in spec.methods
    assert {"nfc", "daps", "dps", "dpir"} <= set(spec.methods)
    assert "left out ddrm" in capsys.readouterr().out
    gaussian = spec_from_args(build_parser().parse_args(["--noise", "gaussian:0.05"]))
    assert gaussian.noise == GaussianNoise(0.05)
    assert gaussian.fingerprint() == spec_from_args(build_parser().parse_args(["--noise-sigma", "0.05"])).fingerprint()
    for flags, needle in ((["--noise", "poisson:30", "--sigma-y", "0.05"], "pass one of --noise and --sigma-y"),
                          (["--noise", "poison:30"], "unknown kind 'poison'"),
                          (["--noise", "poisson:-1"], "peak"),
                          (["--protocol", "oracle", "--noise", "poisson:30"], "the oracle protocol measures under its own"),
                          (["--protocol", "jpeg", "--sigma-y", "0.01"], "the jpeg protocol measures under its own"),
                          (["--protocol", "blind", "--noise", "gaussian:0.01"], "leave --noise out")):
        assert main(["--out", str(tmp_path / "refused"), *flags]) == 2
        assert needle in capsys.readouterr().err and not (tmp_path / "refused").exists()
