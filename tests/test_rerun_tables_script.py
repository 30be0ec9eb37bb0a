"""scripts/rerun_tables.sh: it names every committed result file that a new prior makes stale, and it
refuses a bad table name or a missing prior label before any work starts."""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "rerun_tables.sh"
BENCH = ROOT / "docs" / "bench"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)


def _uses_the_prior(calibration_csv: Path) -> bool:
    """A calibration-protocol run whose settings include the embedded prior (not only the oracles)."""
    with calibration_csv.open() as f:
        return any(row["setting"].startswith("embedded-") for row in csv.DictReader(f))


def prior_dependent_tables() -> set[str]:
    """The committed result files that a new embedded prior makes stale, as the script's table names."""
    names = {p.name.removesuffix("_results.csv") for p in BENCH.glob("*_results.csv")}  # local/paper grids
    for cal in BENCH.glob("**/calibration.csv"):
        if _uses_the_prior(cal):
            names.add(cal.parent.relative_to(BENCH).parts[0])  # conformal_nfc_fast/TASK: one table
    if (BENCH / "profile_paper").is_dir():
        names.add("profile_paper")
    names.add("prior_report")  # docs/prior_report.json
    names.add("demo_grid")  # docs/demo_grid.png, README's picture
    if (BENCH / "restore_throughput.json").is_file():
        names.add("restore_throughput")  # docs/scale.md: its mean PSNR is the prior's
    return names


def test_the_script_reruns_every_table_that_depends_on_the_prior():
    listed = _run("--list")
    assert listed.returncode == 0, listed.stderr
    tables = set(listed.stdout.split())
    assert tables == prior_dependent_tables()
    assert "conformal_oracles" not in tables  # no network: a new prior leaves it as it is


def test_a_bad_name_or_a_missing_label_is_refused_before_any_work(tmp_path):
    bad = _run("local", "nope")
    assert bad.returncode == 2 and "unknown table 'nope'" in bad.stderr
    env = {k: v for k, v in os.environ.items() if k != "PRIOR_LABEL"}
    unlabelled = _run("prior_report", env=env)
    assert unlabelled.returncode == 2 and "PRIOR_LABEL" in unlabelled.stderr
    assert "runs in" not in bad.stdout + unlabelled.stdout  # nothing started
