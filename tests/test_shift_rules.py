"""nfc_dps.bench.shift_rules: the offline refit over pairs of sources."""

import numpy as np
import pytest

from nfc_dps.bench.shift_rules import SHIFT_RULES, SourceData, pair_results, read_shift_csv, shift_rows, write_shift_csv
from nfc_dps.conformal import fit_rule, interval


def _source(seed, n=12, noise=0.05):
    rng = np.random.default_rng(seed)
    truth = rng.random((n, 1, 8, 8))
    mean = np.clip(truth + noise * rng.standard_normal(truth.shape), 0, 1)
    std = np.full(truth.shape, noise)
    return SourceData(mean, std, truth, rng.standard_normal((n, 5)), np.array([f"t{i}" for i in range(n)]))


def test_pooled_pair_is_the_calibrate_fit_applied_to_the_target():
    cal, target = _source(0), _source(1, noise=0.1)
    fit = fit_rule(list(zip(cal.mean, cal.std, cal.truth)), 0.9, "pooled")
    lo, hi = interval(target.mean, target.std, fit.q, edge_weight=fit.edge_weight)
    expect = ((target.truth >= lo) & (target.truth <= hi)).reshape(12, -1).mean(1)
    np.testing.assert_allclose(pair_results(cal, target, "pooled").covered, expect)


def test_rows_cover_every_ordered_pair_and_rule_and_read_back(tmp_path):
    rows = shift_rows({"sr_bicubic": {"heldout": _source(0), "leaves": _source(1)}}, rules=SHIFT_RULES)
    assert len(rows) == 4 * len(SHIFT_RULES)
    assert all((r["split"] == "test") == ("heldout" in (r["calibration"], r["target"])) for r in rows)
    write_shift_csv(tmp_path / "shift.csv", rows)
    back = read_shift_csv(tmp_path / "shift.csv")
    assert [r["rule"] for r in back] == [r["rule"] for r in rows]
    assert back[0]["coverage"] == pytest.approx(rows[0]["coverage"], abs=1e-4)
