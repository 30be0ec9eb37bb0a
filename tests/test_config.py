"""nfc_dps.config: YAML -> validated configs; every shipped config resolves; errors name file and key."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from nfc_dps.config import (
    ConfigBundle,
    ConfigError,
    SamplerSpec,
    load_config,
    load_mapping,
    parse_scalar,
    parse_task,
)
from nfc_dps.operators import TASKS
from nfc_dps.run_record import resolved_config
from nfc_dps.samplers import METHODS, get_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
YAMLS = sorted(CONFIGS.glob("*.yaml"))


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_configs_folder_is_complete():
    names = {p.name for p in YAMLS}
    for required in ["sr_bicubic.yaml", "sr_average.yaml", "inpaint_box.yaml", "inpaint_random.yaml",
                     "deblur_gaussian.yaml", "deblur_motion.yaml", "nfc_fast.yaml", "nfc_paper.yaml",
                     "daps_fast.yaml", "daps_paper.yaml"]:
        assert required in names


@pytest.mark.parametrize("path", YAMLS, ids=[p.name for p in YAMLS])
def test_every_shipped_config_resolves(path):
    bundle = load_config([path])
    assert bundle.sources == [str(path)]
    if bundle.task is not None:
        t = bundle.task
        assert t.task in TASKS and t.noise_sigma == pytest.approx(0.025)
        text = path.read_text()
        assert "0.025" in text and "[-1, 1]" in text and "[0, 1]" in text  # units said in the file
        size = (256, 256)
        op = t.build(size, seed=0)
        assert tuple(op.image_shape(op.measurement_shape((1, 3, *size)))) == (1, 3, *size)
    else:
        cfg = bundle.sampler.resolve().config
        assert bundle.sampler.method in METHODS
        assert isinstance(cfg, METHODS[bundle.sampler.method].config_classes)
        assert cfg == METHODS[bundle.sampler.method].presets[bundle.sampler.preset]


def test_task_config_defaults_and_path_resolution(tmp_path):
    (tmp_path / "sub").mkdir()
    p = _write(tmp_path / "sub", "t.yaml", "task: inpaint_mask\nmask_path: masks/m.png\nnoise_sigma: 1e-2\n")
    t = load_config([p]).task
    assert t.task == "inpaint_mask" and t.noise_sigma == 0.01
    assert t.params["mask_path"] == str((tmp_path / "sub" / "masks" / "m.png").resolve())
    t = parse_task({"task": "deblur_gaussian", "kernel_size": 5.0}, "x")
    assert t.params == {"kernel_size": 5} and t.as_dict()["kernel_std"] == 3.0 and t.noise_sigma == 0.025


@pytest.mark.parametrize("text, needles", [
    ("task: deblur_gaussian\nkernel_sise: 5\n", ["kernel_sise", "kernel_size", "kernel_std", "boundary"]),
    ("task: deblurr\n", ["deblurr", "deblur_gaussian", "sr_bicubic"]),
    ("task: deblur_gaussian\nkernel_size: big\n", ["kernel_size", "integer", "big"]),
    ("task: deblur_gaussian\nnoise_sigma: -0.1\n", ["noise_sigma", "in [0, 1]", "-0.1"]),
    ("task: denoise\nnoise_sigma: 12.75\n", ["noise_sigma", "12.75", "divide by 255"]),
    ("task: deblur_gaussian\nkernel_std: -1\n", ["deblur_gaussian", "kernel_std=-1", "std must be"]),
    ("task: deblur_motion\nboundary: reflct\n", ["boundary='reflct'", "circular", "reflect"]),
    ("task: inpaint_random\nmissing_fraction: 1.5\n", ["missing_fraction=1.5", "[0, 1]"]),
    ("task: sr_bicubic\nfactor: 1\n", ["factor=1", ">= 2"]),
    ("task: inpaint_box\nbox_size: [8, 0]\n", ["box_size=(8, 0)", "positive"]),
    ("task: inpaint_box\nmargin: [4, -1]\n", ["margin=(4, -1)", ">= 0"]),
    ("task: deblur_gaussian\nkernel_size: [5, 5]\n", ["kernel_size", "expected an integer, got [5, 5]"]),
    ("task: {task: denoise}\nseed: [1, 2]\n", ["seed", "expected an integer, got [1, 2]"]),
    ("method: nfc\nnum_levels: [2, 3]\n", ["num_levels", "expected an integer, got [2, 3]"]),
    ("task: denoise\nnoise_sigma: 0.1\nnoise_sigma: 0.2\n", ["duplicate key", "noise_sigma"]),
    ("method: nfc\nnum_level: 3\n", ["num_level", "num_levels", "prior_weight"]),
    ("method: nfc\npreset: fast\nband: {cutof_start: 0.3}\n", ["cutof_start", "band", "cutoff_start"]),
    ("method: nfc\npreset: fast\nband: 3\n", ["band", "mapping"]),
    ("method: nfc\nband: {blend_start: 0.3}\n", ["band", "prior_weight"]),  # not a field of the default preset
    ("method: nfcc\n", ["nfcc", "nfc", "daps"]),
    ("method: nfc\npreset: slow\n", ["slow", "fast", "paper"]),
    ("method: nfc\npreset: fast\ninner: magic\n", ["inner", "magic"]),
    ("method: nfc\nnum_levels: 2.5\n", ["num_levels", "integer"]),
    ("task: denoise\nmethod: nfc\n", ["sampler", "method"]),
    ("foo: 1\n", ["cannot tell", "foo", "task", "method"]),
    ("", ["empty"]),
    ("- 1\n- 2\n", ["mapping"]),
    ("task: [unclosed\n", ["invalid YAML"]),
    ("task: {task: denoise}\nbogus: 1\n", ["bogus", "sampler", "seed"]),
])
def test_errors_name_file_and_key(tmp_path, text, needles):
    p = _write(tmp_path, "bad.yaml", text)
    with pytest.raises(ConfigError) as e:
        load_config([p]).sampler.resolve().config
    msg = str(e.value)
    assert "bad.yaml" in msg
    for n in needles:
        assert n in msg, (n, msg)


def test_missing_file():
    with pytest.raises(ConfigError, match="not found"):
        load_mapping("/nonexistent/x.yaml")


def test_nested_override_merges_onto_preset(tmp_path):
    p = _write(tmp_path, "s.yaml", "method: nfc\npreset: fast\nnum_levels: 3\nband: {cutoff_start: 0.5}\n")
    cfg = load_config([p]).sampler.resolve().config
    preset = METHODS["nfc"].presets["fast"]
    assert cfg.num_levels == 3 and cfg.band.cutoff_start == 0.5
    assert cfg.band.blend_start == preset.band.blend_start and cfg.inner == preset.inner
    assert cfg.detail == preset.detail


def test_number_or_auto_field_takes_both(tmp_path):
    """The continuation's sigma_max is a number or "auto": either replaces either, and anything else
    names the key; the posterior sampler's is a number."""
    auto = _write(tmp_path, "a.yaml", "method: nfc\npreset: deterministic\nsigma_max: auto\n")
    assert load_config([auto]).sampler.resolve().config.sigma_max == "auto"
    fast = _write(tmp_path, "f.yaml", "method: nfc\npreset: fast\nsigma_max: auto\n")
    with pytest.raises(ConfigError, match="sigma_max.*expected a number, got 'auto'"):
        load_config([fast]).sampler.resolve().config
    number = _write(tmp_path, "n.yaml", "method: nfc\npreset: deterministic\nsigma_max: 0.3\n")
    assert load_config([number]).sampler.resolve().config.sigma_max == 0.3
    for bad, shown in (("[1, 2]", r"\[1, 2\]"), ("high", "'high'")):
        path = _write(tmp_path, "b.yaml", f"method: nfc\nsigma_max: {bad}\n")
        with pytest.raises(ValueError, match=f"sigma_max.*{shown}"):
            load_config([path]).sampler.resolve().config


def test_later_files_and_flags_win(tmp_path):
    a = _write(tmp_path, "a.yaml", "method: nfc\npreset: fast\nnum_levels: 3\nband: {cutoff_start: 0.5}\n")
    b = _write(tmp_path, "b.yaml", "preset: paper\nband: {blend_start: 0.2}\n")
    t1 = _write(tmp_path, "t1.yaml", "task: deblur_gaussian\nkernel_size: 9\n")
    t2 = _write(tmp_path, "t2.yaml", "task: deblur_gaussian\nkernel_size: 7\n")
    bundle = load_config([a, t1, b, t2])
    assert bundle.task.params["kernel_size"] == 7
    spec = bundle.sampler
    spec.set("num_levels", 4, "--steps")
    cfg = spec.resolve().config
    assert spec.preset == "paper" and cfg.num_levels == 4 and cfg.inner == "langevin"
    assert cfg.band.cutoff_start == 0.5 and cfg.band.blend_start == 0.2
    spec.set("band.cutoff_start", "x", "--set")
    with pytest.raises(ConfigError, match="--set.*band.cutoff_start"):
        spec.resolve().config


def test_switching_method_drops_other_method_overrides(tmp_path):
    a = _write(tmp_path, "a.yaml", "method: nfc\npreset: fast\nband: {cutoff_start: 0.5}\n")
    b = _write(tmp_path, "b.yaml", "method: daps\nnum_levels: 3\n")
    spec = load_config([a, b]).sampler
    assert spec.method == "daps" and spec.resolve().config.num_levels == 3 and "band" not in spec.overrides


def test_resolved_config_round_trip(tmp_path):
    task = parse_task({"task": "deblur_gaussian", "kernel_size": 9, "noise_sigma": 0.01}, "t")
    spec = SamplerSpec("nfc", "fast")
    spec.set("num_levels", 3, "x")
    spec.set("band.cutoff_start", 0.45, "x")
    rec = resolved_config(task, spec.resolve(), seed=7, num_samples=2, prior="p", command="restore")
    assert rec["seed"] == 7 and "relative to the input folder" in rec["per_image_seed"] and rec["num_samples"] == 2
    for pkg in ("torch", "diffusers", "numpy", "nfc_dps"):
        assert rec["versions"][pkg]
    assert "0.025" in rec["units"]
    p = tmp_path / "resolved_config.json"
    p.write_text(json.dumps(rec))
    back = load_config([p])
    assert back.task.as_dict() == task.as_dict() and back.seed == 7 and back.num_samples == 2
    assert back.sampler.resolve().config == spec.resolve().config


def test_sampler_overrides_for_every_method():
    """--steps sets the field each method declares (``Method.steps_field``), on every preset."""
    for name, m in METHODS.items():
        field = m.steps_field
        for preset in m.presets:
            spec = SamplerSpec(name, preset)
            spec.set(field, 2, "--steps")
            cfg = spec.resolve().config
            assert getattr(cfg, field) == 2
    assert METHODS["nfc"].steps_field == "num_levels" and METHODS["dps"].steps_field == "num_steps"


def test_parse_scalar():
    assert parse_scalar("3") == 3 and parse_scalar("1e-3") == 0.001 and parse_scalar("0.5") == 0.5
    assert parse_scalar("langevin") == "langevin" and parse_scalar("true") is True


def test_bundle_default():
    b = ConfigBundle()
    assert b.task is None and b.sampler.method == "nfc" and b.sampler.preset is None
    assert b.sampler.resolved_preset == METHODS["nfc"].default_preset == "deterministic"
    assert dataclasses.asdict(b.sampler.resolve().config) == dataclasses.asdict(METHODS["nfc"].presets["deterministic"])
    other = SamplerSpec("dps")  # no preset named: the method's own default
    assert other.resolved_preset == "fast" and other.resolve().as_dict()["preset"] == "fast"


def test_one_yaml_per_sampler_preset():
    names = {p.name for p in YAMLS}
    missing = [f"{m}_{p}.yaml" for m, meth in METHODS.items() for p in meth.presets if f"{m}_{p}.yaml" not in names]
    assert not missing, f"add configs/{missing[0]} (and the others: {missing})"


def test_nested_override_merges_and_daps_refuses_its_fixed_modules_on_every_path():
    """A nested override changes one field of the preset's value; DAPS (NFC with the band and the
    Haar commitment off) refuses band/detail overrides, whether they come through
    get_config/restore, a config file/--set, or the harness, instead of ignoring them."""
    import torch

    from nfc_dps import restore
    from nfc_dps.bench.spec import method_config
    from nfc_dps.operators import Denoising
    from nfc_dps.priors.gaussian import GaussianSpectralPrior
    from nfc_dps.samplers import get_config

    base = get_config("nfc", "fast")
    cfg = get_config("nfc", "fast", band={"cutoff_start": 0.5})
    assert cfg.band.cutoff_start == 0.5 and cfg.band.blend_start == base.band.blend_start
    prior = GaussianSpectralPrior((8, 8), channels=1)
    y = torch.full((1, 1, 8, 8), 0.5)
    for key, value in (("band", {"blend_start": 0.3}), ("detail", {"levels": 2})):
        with pytest.raises(ValueError, match=f"daps sets \\['{key}'\\] itself"):
            get_config("daps", "fast", **{key: value})
        with pytest.raises(ValueError, match="use method 'nfc'"):
            restore(y, Denoising(), prior=prior, method="daps", num_levels=1, langevin_steps=1, progress=False,
                    **{key: value})
        spec = SamplerSpec("daps")
        spec.set(f"{key}.{next(iter(value))}", next(iter(value.values())), "--set")
        with pytest.raises(ValueError, match=f"^--set: daps sets \\['{key}'\\] itself"):
            spec.resolve().config
        with pytest.raises(ValueError, match="itself"):
            method_config("daps", "fast", None, {f"{key}.{next(iter(value))}": next(iter(value.values()))})
    with pytest.raises(ValueError, match=r"unknown nfc config keys \['band.cutof_start'\]; allowed: band.cutoff,"):
        get_config("nfc", "fast", band={"cutof_start": 0.5})


def test_restore_applies_overrides_to_a_given_config_and_checks_its_class():
    """``restore(config=cfg, **overrides)`` replaces fields of ``cfg`` (the same merge as a preset);
    a config of another method's class is a TypeError naming both."""
    import torch

    from nfc_dps import restore
    from nfc_dps.operators import Denoising
    from nfc_dps.priors.gaussian import GaussianSpectralPrior
    from nfc_dps.samplers import get_config

    prior = GaussianSpectralPrior((8, 8), channels=1)
    y = torch.full((1, 1, 8, 8), 0.5)
    res = restore(y, Denoising(), prior=prior, config=get_config("nfc", "fast"), num_levels=2, ode_steps=1,
                  band={"cutoff_start": 0.5}, progress=False)
    assert res.config.num_levels == 2 and res.config.band.cutoff_start == 0.5 and res.nfe == 2
    with pytest.raises(TypeError, match="dps config must be a DPSConfig, got NFCConfig"):
        restore(y, Denoising(), prior=prior, method="dps", config=get_config("nfc", "fast"), progress=False)


def test_every_config_knows_its_nfe_steps_and_randomness():
    """with_nfe / steps / is_deterministic are declared by every registered config (no sniffing)."""
    from nfc_dps.samplers import METHODS, get_config

    for name, m in METHODS.items():
        for preset in m.presets:
            cfg = get_config(name, preset)
            for budget in (1, 2, 20, 36):
                c = cfg.with_nfe(budget)
                assert c.nfe == budget, (name, preset, budget)
                assert 1 <= c.steps <= budget
                assert type(c) is type(cfg) and c.is_deterministic == cfg.is_deterministic
            with pytest.raises(ValueError, match="int >= 1"):
                cfg.with_nfe(0)
    assert get_config("nfc", "fast").with_nfe(20).steps == 10  # 10 levels x 2 predictor steps
    assert get_config("daps", "fast").with_nfe(20).steps == 4  # 4 levels x 5
    assert get_config("dpir").is_deterministic and not get_config("dps").is_deterministic


def test_method_flag_starts_from_the_new_methods_default(tmp_path):
    """--method switching away from a config file's method keeps nothing of it, its preset
    included (a preset the new method lacks would otherwise be an error), as between files."""
    import argparse

    from nfc_dps.cli.tasks import resolve_sampler

    p = _write(tmp_path, "c.yaml", "method: nfc\npreset: fast_psnr\nnum_levels: 7\n")
    flags = dict(preset=None, set=None, steps=None)
    sampler = resolve_sampler(argparse.Namespace(method="dps", **flags), load_config([p]))
    assert sampler.method == "dps" and sampler.preset == "fast" and sampler.config == get_config("dps")
    sampler = resolve_sampler(argparse.Namespace(method="nfc", **flags), load_config([p]))  # same method: kept
    assert sampler.preset == "fast_psnr" and sampler.config.num_levels == 7


def test_resolved_config_of_every_method_and_preset_reads_back(tmp_path):
    """resolved_config.json records every field (DAPS's fixed band/detail included); --config of
    that file rebuilds the same sampler config for every registered method and preset."""
    import json

    from nfc_dps.config import SamplerSpec

    for method, meth in METHODS.items():
        for preset in meth.presets:
            p = tmp_path / f"{method}_{preset}.json"
            p.write_text(json.dumps(resolved_config(None, SamplerSpec(method, preset).resolve(), 0), default=str))
            assert load_config([p]).sampler.resolve().config == get_config(method, preset), (method, preset)


def test_box_size_and_margin_take_height_width_pairs(tmp_path):
    t = load_config([_write(tmp_path, "b.yaml", "task: inpaint_box\nbox_size: [40, 24]\nmargin: [4, 8]\n")]).task
    assert t.params == {"box_size": (40, 24), "margin": (4, 8)}


def test_overrides_are_coerced_from_the_field_types_on_every_path():
    """get_config (so restore, the harness and config files) coerces each override from its
    field's annotation: an int field takes "3" and 3.0, a float field an int, a dotted key sets
    one field of a group; a value that does not fit is a ConfigError naming the key and the value."""
    from nfc_dps.overrides import ConfigError as OverrideError

    cfg = get_config("nfc", "fast", num_levels="3", ode_steps=2.0, inner_temperature=1, **{"band.cutoff_start": 1})
    assert (cfg.num_levels, cfg.ode_steps, cfg.inner_temperature, cfg.band.cutoff_start) == (3, 2, 1.0, 1.0)
    assert type(cfg.num_levels) is int and type(cfg.inner_temperature) is float and type(cfg.band.cutoff_start) is float
    assert type(get_config("nfc", "deterministic", prior_weight=1).prior_weight) is float
    assert get_config("dps", num_steps="5").num_steps == 5
    for overrides, needles in (({"num_levels": 2.5}, ["'num_levels'", "an integer", "2.5"]),
                               ({"self_ensemble": 1}, ["'self_ensemble'", "true or false", "1"]),
                               ({"inner_temperature": float("inf")}, ["'inner_temperature'", "a finite number", "inf"]),
                               ({"sigma_max": [1, 2]}, ["'sigma_max'", "a number", "[1, 2]"]),
                               ({"band": 3}, ["'band'", "mapping of cutoff", "3"]),
                               ({"band.cutoff_start": "x"}, ["'band.cutoff_start'", "a number", "'x'"]),
                               ({"num_levels.x": 1}, ["['num_levels.x']", "allowed: num_levels,"])):
        with pytest.raises(OverrideError) as e:
            get_config("nfc", "fast", **overrides)
        assert e.value.key == next(iter(overrides)) and all(n in str(e.value) for n in needles), str(e.value)
    with pytest.raises(OverrideError, match="'sigma_max'.*a number or a string"):
        get_config("nfc", "deterministic", sigma_max=[1, 2])
    assert OverrideError is ConfigError


def test_restating_every_field_of_every_preset_changes_nothing():
    """Every field's annotation takes the preset's own value back (a resolved_config.json reloads),
    DAPS's fixed band and detail included."""
    from nfc_dps.overrides import flatten

    for name, m in METHODS.items():
        for preset, cfg in m.presets.items():
            assert get_config(name, preset, **flatten(dataclasses.asdict(cfg))) == cfg, (name, preset)
