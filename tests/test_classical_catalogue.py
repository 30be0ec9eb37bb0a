"""The catalogue of classical methods (nfc_dps.baselines.CLASSICAL): what each entry restores, the
lists read from it, and a new entry restored and listed with no other edit."""

from __future__ import annotations

import pytest
import torch

from nfc_dps import build_operator
from nfc_dps.baselines import (
    CLASSICAL,
    ClassicalMethod,
    NotApplicable,
    applicable,
    classical_methods,
    restore_classical,
    richardson_lucy,
)
from nfc_dps.bench.noise_level import task_params
from nfc_dps.bench.nonlinear import SETTINGS
from nfc_dps.bench.oracle import oracle_methods
from nfc_dps.bench.report_tables import METHOD_NAMES, row_label
from nfc_dps.bench.spec import DEFAULT_METHODS, BenchSpec, estimators, method_runs, noise_problem
from nfc_dps.noise import GaussianNoise, PoissonNoise


def _op(task: str, **params):
    return build_operator(task, 32, seed=0, **params)


@pytest.mark.parametrize("task, params, gaussian, poisson", [
    ("deblur_gaussian", {"kernel_size": 9, "boundary": "circular"}, ("wiener", "tv"), ("richardson_lucy",)),
    ("sr_bicubic", {}, ("wiener", "tv", "bicubic"), ()),
    ("inpaint_box", {"box_size": 12, "margin": 4}, ("tv", "biharmonic"), ()),
    ("denoise", {}, ("wiener", "tv"), ("anscombe_tv",)),
    ("jpeg", {}, ("qcs_tv",), ()),
    ("hdr", {}, ("hdr_inverse_inpaint",), ()),
    ("exposure", {}, ("hdr_inverse_inpaint",), ()),
    ("phase_retrieval", {}, ("hio_er",), ()),
    ("deblur_camera", {"kernel_size": 9}, ("camera_tv",), ()),
])
def test_each_operator_is_served_by_the_methods_that_declare_it(task, params, gaussian, poisson):
    op = _op(task, **params)
    assert classical_methods(op, "gaussian") == gaussian
    assert classical_methods(op, "poisson") == poisson


def test_the_lists_elsewhere_are_read_from_the_catalogue():
    assert [m for m in DEFAULT_METHODS if m in CLASSICAL] == ["wiener", "tv", "bicubic", "biharmonic"]
    assert [m for m in oracle_methods() if m in CLASSICAL] == ["wiener", "tv"]
    assert all(METHOD_NAMES[name] == m.label for name, m in CLASSICAL.items())


def test_every_nonlinear_setting_names_a_classical_method_that_restores_it():
    for setting in SETTINGS.values():
        op = build_operator(setting.task, 64, seed=0, **setting.params(64))
        method = CLASSICAL[setting.classical]
        assert applicable(setting.classical, op) is None and method.noise_problem(setting.noise) is None, setting.name


def test_restore_classical_takes_a_noise_model_and_refuses_another_kind():
    blur = _op("deblur_gaussian", kernel_size=9, boundary="circular")
    x = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    y = blur.measure(x, noise=PoissonNoise(20), generator=[torch.Generator().manual_seed(1)])
    assert torch.equal(restore_classical("richardson_lucy", blur, y, PoissonNoise(20)), richardson_lucy(blur, y, 20.0))
    with pytest.raises(NotApplicable, match="Poisson noise"):
        restore_classical("richardson_lucy", blur, y, 0.01)
    with pytest.raises(NotApplicable, match="Gaussian noise"):
        restore_classical("tv", blur, y, PoissonNoise(20))
    assert torch.equal(restore_classical("tv", blur, y, 0.01), restore_classical("tv", blur, y, GaussianNoise(0.01)))


def test_a_new_entry_is_restored_and_listed_with_no_other_edit(monkeypatch):
    """One entry in the catalogue: applicability, restoration, the oracle's rows, the grid's columns
    and the tables' labels follow."""
    newcomer = ClassicalMethod(lambda op, y, noise: y + 2.0, "Newcomer",
                               operator_problem=lambda op: None if op.family == "blur" else "blur only")
    monkeypatch.setitem(CLASSICAL, "newcomer", newcomer)
    blur = _op("deblur_gaussian", kernel_size=9, boundary="circular")
    y = torch.zeros(1, 1, 32, 32)
    assert applicable("newcomer", blur) is None and applicable("newcomer", _op("denoise")) == "blur only"
    assert torch.equal(restore_classical("newcomer", blur, y, 0.01), torch.ones_like(y))  # clipped to [0, 1]
    assert "newcomer" in classical_methods(blur) and "newcomer" in oracle_methods()
    runs = method_runs(BenchSpec(methods=("tv", "newcomer")))
    assert [(r.method, r.budget) for r in runs] == [("tv", None), ("newcomer", None)]
    assert estimators(runs[1], samples=4) == ["deterministic"]
    assert "Gaussian noise" in noise_problem("newcomer", PoissonNoise(10))
    assert row_label("newcomer", "deterministic", "fast") == "newcomer"  # a classical row: no preset


def test_the_noise_level_tier_scales_what_the_task_declares():
    assert task_params("inpaint_box", 64) == {"box_size": 32, "margin": 4}
    assert task_params("inpaint_box", 256) == {} and task_params("denoise", 64) == {}
