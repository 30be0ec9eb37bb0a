import pytest
import torch

from nfc_dps.schedules import BandSchedule, DetailSchedule, cosine_decay, karras_sigmas


def test_karras_grid_endpoints_and_order():
    s = karras_sigmas(200, 0.1, 100.0)
    assert s.shape == (201,)
    assert s[0] == pytest.approx(100.0) and s[-2] == pytest.approx(0.1) and s[-1] == 0
    assert (s[1:] < s[:-1]).all()
    assert karras_sigmas(1, 0.1, 5.0).tolist() == [5.0, 0.0]
    with pytest.raises(ValueError):
        karras_sigmas(0, 0.1, 1.0)
    with pytest.raises(ValueError):
        karras_sigmas(5, 2.0, 1.0)


def test_band_schedule_paper_values():
    b = BandSchedule()
    n = 200
    assert b.linear_cutoff(0, n) == pytest.approx(0.4)
    assert b.blend(0, n) == pytest.approx(0.35)
    assert b.linear_cutoff(n - 1, n) == 1.0 and b.blend(n - 1, n) == 0.0  # full band at the end
    cut = [b.linear_cutoff(k, n) for k in range(n)]
    lam = [b.blend(k, n) for k in range(n)]
    assert all(x <= y for x, y in zip(cut, cut[1:]))
    assert all(x >= y for x, y in zip(lam, lam[1:]))
    assert cosine_decay(0.5, 0.35) == pytest.approx(0.175)


def test_spectral_cutoff_widens_as_sigma_falls():
    from nfc_dps.frequency import power_law_spectrum
    from nfc_dps.samplers.gaussian_step import spectral_crossing

    b = BandSchedule(cutoff="spectral", cutoff_start=0.05)
    spec = power_law_spectrum(torch.tensor([1e-3, 1e-2]), torch.tensor([2.0, 2.0]), (1, 1, 64, 64))
    cuts = [b.spectral_cutoff(spectral_crossing(spec, s**2), 0, 10) for s in (10.0, 1.0, 0.1, 0.01)]
    for lo, hi in zip(cuts, cuts[1:]):
        assert (hi >= lo).all()
    assert (cuts[-1] > cuts[0]).all()
    # S = a r^-2 meets sigma^2 at r = sqrt(a) / sigma (up to the grid's resolution)
    assert spectral_crossing(spec, 0.1**2)[0].item() == pytest.approx(0.316, abs=0.03)
    assert torch.equal(b.spectral_cutoff(cuts[0], 9, 10), torch.ones(2))
    with pytest.raises(ValueError, match="cutoff"):
        BandSchedule(cutoff="cubic")


def test_detail_schedule_reaches_one_at_last_level():
    d = DetailSchedule(levels=1, detail_weight=0.2, unlock_start=0.05)
    n = 50
    w = [d.weights(k, n) for k in range(n)]
    assert w[-1] == (1.0, 1.0)
    assert w[0][1] == pytest.approx(0.2 + 0.8 * 0.05)
    highs = [x[1] for x in w]
    assert all(a <= b + 1e-12 for a, b in zip(highs, highs[1:]))
    assert not DetailSchedule(levels=0).active
    with pytest.raises(ValueError, match="detail_weight"):
        DetailSchedule(detail_weight=1.5)
