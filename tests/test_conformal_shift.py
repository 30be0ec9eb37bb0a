"""nfc_dps.conformal_shift: weighted conformal under covariate shift, ESS floor, scaled scores."""

import numpy as np
import pytest

from nfc_dps.conformal import CalibrationError, fit_quantile
from nfc_dps.conformal_shift import (
    effective_sample_size,
    fit_logistic,
    fit_scale_exponent,
    shift_weights,
    tempered_weights,
    weighted_quantile,
)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_equal_weights_without_test_weight_is_the_pooled_quantile(seed):
    rng = np.random.default_rng(seed)
    scores = [np.abs(rng.standard_normal(rng.integers(5, 40))) for _ in range(20)]
    for cov in (0.8, 0.9, 0.95):
        assert weighted_quantile(scores, np.full(20, 3.0), cov) == fit_quantile(scores, cov, "pooled")


def test_test_weight_beyond_alpha_gives_no_finite_quantile():
    scores = [np.arange(10.0)] * 10
    assert weighted_quantile(scores, np.ones(10), 0.9, test_weight=2.0) == float("inf")
    assert np.isfinite(weighted_quantile(scores, np.ones(10), 0.9, test_weight=1.0))


def test_weighted_quantile_refuses_bad_weights_and_too_few_images():
    scores = [np.ones(3)] * 10
    with pytest.raises(CalibrationError):
        weighted_quantile(scores, -np.ones(10), 0.9)
    with pytest.raises(CalibrationError):
        weighted_quantile(scores[:5], np.ones(5), 0.9)


def test_effective_sample_size_exact_values():
    assert effective_sample_size(np.ones(7)) == pytest.approx(7.0)
    assert effective_sample_size(np.r_[1.0, np.zeros(6)]) == pytest.approx(1.0)
    assert effective_sample_size(np.array([1.0, 1.0, 2.0])) == pytest.approx(16 / 6)


def test_ess_floor_tempers_collapsed_weights_and_keeps_healthy_ones():
    collapsed = np.r_[1e6, np.ones(19)]
    w = tempered_weights(collapsed, np.array([5.0]), ess_floor=9)
    assert w.tempering < 1 and w.ess >= 9
    assert w.target[0] == pytest.approx(5.0 ** w.tempering)
    healthy = tempered_weights(np.linspace(0.5, 1.5, 20), np.ones(2), ess_floor=9)
    assert healthy.tempering == 1.0
    fallback = tempered_weights(np.r_[1e300, np.zeros(19)], np.ones(3), ess_floor=9, halvings=0)
    assert fallback.tempering == 0.0 and np.all(fallback.calibration == 1) and fallback.ess == 20


def test_logistic_regression_finds_the_direction_of_shift():
    rng = np.random.default_rng(0)
    x = np.r_[rng.normal(0, 1, 200), rng.normal(1, 1, 200)][:, None]
    coef, intercept, centre, scale = fit_logistic(x, np.r_[np.zeros(200), np.ones(200)], l2=0.0)
    # the true log-odds is x - 1/2: slope 1 per unit of x
    assert coef[0] / scale[0] == pytest.approx(1.0, abs=0.25)


def _images(rng, shift, n, pixels=200):
    """n images: a feature x ~ N(shift, 1) each, pixel scores |N(0, exp(0.8 x))|."""
    x = rng.normal(shift, 1.0, n)
    return x, [np.abs(rng.standard_normal(pixels)) * np.exp(0.8 * xi) for xi in x]


def test_weights_restore_nominal_coverage_under_covariate_shift():
    rng = np.random.default_rng(0)
    cal_x, cal = _images(rng, 0.0, 400)
    tgt_x, tgt = _images(rng, 1.0, 400)
    w = shift_weights(cal_x[:, None], tgt_x[:, None], ess_floor=9)
    weighted = [np.mean(s <= weighted_quantile(cal, w.calibration, 0.9, wt)) for s, wt in zip(tgt, w.target)]
    q = fit_quantile(cal, 0.9, "pooled")
    pooled = [np.mean(s <= q) for s in tgt]
    assert np.mean(pooled) < 0.85
    # the guarantee is >= 90 % (the target image's own weight sits at +infinity): a little above
    assert 0.89 <= np.mean(weighted) <= 0.94


def test_scale_exponent_recovers_a_power_law_difficulty():
    rng = np.random.default_rng(0)
    d = np.exp(rng.normal(0, 1, 30))
    base = np.abs(rng.standard_normal(500))
    assert fit_scale_exponent([base * di ** 1.5 for di in d], d, 0.9) == pytest.approx(1.5)
    assert fit_scale_exponent([base] * 5, np.ones(5), 0.9) == 0.0
