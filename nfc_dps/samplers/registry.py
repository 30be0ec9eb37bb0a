"""The method registry: each sampler's :class:`Method` entry (its sampler, config class, presets and
what it can restore) in :data:`METHODS`, and the one path from a method's name and a preset with
overrides to its config (:func:`get_config`)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable

from ..noise import NOISE_KINDS
from ..operators.nonlinear import is_linear
from ..overrides import ConfigError, apply_overrides
from . import ddnm, ddrm, diffpir, dpir, dps
from .ddnm import DDNMConfig, sample_ddnm
from .ddrm import DDRMConfig, sample_ddrm
from .diffpir import DiffPIRConfig, sample_diffpir
from .dpir import DPIRConfig, sample_dpir
from .dps import DPSConfig, sample_dps
from .nfc import NFCConfig, nonlinear_problem, sample_daps, sample_nfc
from .nfc_continuation import ContinuationConfig, sample_nfc_continuation
from .presets import DAPS_PRESETS, NFC_PRESETS


@dataclass(frozen=True)
class Method:
    """A sampler, its config class, its named presets and the one used when none is named;
    ``fixed_fields``: fields of the config class the method sets itself (overriding one is an error).
    A preset may be of another config class (NFC's deterministic continuation): ``sample`` takes each."""

    sample: Callable[..., Any]
    config_class: type
    presets: dict[str, Any]
    #: the name tables and logs show ("DDNM+")
    display_name: str
    default_preset: str = "fast"
    fixed_fields: frozenset[str] = frozenset()
    #: the noise models (``nfc_dps.noise``'s ``kind``) it takes: Gaussian, and the others through
    #: their Gaussian approximation (a weighted operator: ``Measurement.gaussian``)
    noise_kinds: frozenset[str] = frozenset(NOISE_KINDS)
    #: it restores nonlinear operators too (by likelihood gradients or Gauss-Newton steps); a method
    #: that does not refuses them naming those that do
    takes_nonlinear: bool = True
    #: why the method cannot restore a (linear) operator (None: it can); checked before a run starts
    operator_problem: Callable[[Any], str | None] = lambda operator: None

    #: why the method with a config cannot restore a nonlinear operator (None: it can)
    nonlinear_config_problem: Callable[[Any], str | None] = lambda config: None

    def noise_problem(self, noise: Any) -> str | None:
        """Why the method cannot take the noise model ``noise`` (None: it can)."""
        if noise.kind in self.noise_kinds:
            return None
        return f"takes {' or '.join(sorted(self.noise_kinds))} noise, not {noise}"

    def problem(self, name: str, operator: Any, noise: Any, config: Any) -> str | None:
        """Why method ``name`` cannot restore this operator, noise model and config (None: it can):
        every check made before a run starts."""
        why = self.operator_problem_of(operator)
        if why is None and noise is not None and self.noise_problem(noise):
            why = f"{name} {self.noise_problem(noise)}"
        if why is None and config is not None and not is_linear(operator):
            config_why = self.nonlinear_config_problem(config)
            if config_why:
                why = (f"{config_why}; with the nonlinear {operator.name} use NFC's default (deterministic) preset, "
                       f"or DAPS")
        return why

    def operator_problem_of(self, operator: Any) -> str | None:
        """Why the method cannot restore ``operator`` (None: it can)."""
        if not self.takes_nonlinear and not is_linear(operator):
            return (f"{self.display_name} needs a linear operator (its data step uses the pseudo-inverse or a "
                    f"decomposition); for the nonlinear {operator.name} use {', '.join(nonlinear_methods())}")
        return self.operator_problem(operator)

    @property
    def steps_field(self) -> str:
        """The field ``--steps`` sets: the config class's ``steps_field``."""
        return self.config_class.steps_field

    @property
    def config_classes(self) -> tuple[type, ...]:
        """``config_class`` and the classes of the presets: the configs ``sample`` takes."""
        return tuple(dict.fromkeys([self.config_class, *(type(p) for p in self.presets.values())]))


def sample_nfc_method(prior, measurement, config, generators=None, callback=None):
    """Method ``nfc``: the deterministic continuation for a :class:`ContinuationConfig`, else the
    posterior sampler :func:`sample_nfc`."""
    sample = sample_nfc_continuation if isinstance(config, ContinuationConfig) else sample_nfc
    return sample(prior, measurement, config, generators, callback)


METHODS: dict[str, Method] = {
    "nfc": Method(sample_nfc_method, NFCConfig, NFC_PRESETS, "NFC", default_preset="deterministic",
                  nonlinear_config_problem=lambda c: nonlinear_problem(c) if isinstance(c, NFCConfig) else None),
    # DAPS is NFC's skeleton with the band and the Haar commitment off (sample_daps turns them off)
    "daps": Method(sample_daps, NFCConfig, DAPS_PRESETS, "DAPS", fixed_fields=frozenset({"band", "detail"})),
    "dps": Method(sample_dps, DPSConfig, dps.PRESETS, "DPS"),
    "diffpir": Method(sample_diffpir, DiffPIRConfig, diffpir.PRESETS, "DiffPIR", takes_nonlinear=False),
    "ddnm": Method(sample_ddnm, DDNMConfig, ddnm.PRESETS, "DDNM+", takes_nonlinear=False),
    "ddrm": Method(sample_ddrm, DDRMConfig, ddrm.PRESETS, "DDRM", takes_nonlinear=False,
                   operator_problem=ddrm.operator_problem,
                   noise_kinds=frozenset({"gaussian"})),  # its SVD does not survive per-pixel weights
    "dpir": Method(sample_dpir, DPIRConfig, dpir.PRESETS, "DPIR"),
}


def nonlinear_methods() -> tuple[str, ...]:
    """The methods that take a nonlinear operator."""
    return tuple(name for name, m in METHODS.items() if m.takes_nonlinear)


def get_method(name: str) -> Method:
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; choose one of {sorted(METHODS)}")
    return METHODS[name]


def get_config(method: str, preset: str | None = None, **overrides: Any) -> Any:
    """The named preset of ``method`` (None: its default preset) with field overrides
    (:func:`override_config`). This is the one override path: the CLI, config files, ``restore``
    and the harness all end here."""
    m = get_method(method)
    preset = m.default_preset if preset is None else preset
    if preset not in m.presets:
        raise ValueError(f"unknown preset {preset!r} for {method}; choose one of {sorted(m.presets)}")
    return override_config(method, m.presets[preset], **overrides)


def with_preset_hint(method: str, config_class: type, error: ConfigError) -> ConfigError:
    """``error`` for an override of a ``config_class`` config, with a hint when its key is a field
    of another preset of ``method`` (NFC's posterior presets against its deterministic continuation)."""
    key = (error.key or "").split(".")[0]
    others = [name for name, p in get_method(method).presets.items()
              if type(p) is not config_class and key in {f.name for f in fields(p)}]
    if not others:
        return error
    return ConfigError(f"{error} ({key!r} is a field of preset {', '.join(others)}: set that preset, e.g. "
                       f"preset: {'fast' if 'fast' in others else others[0]})", error.key)


def override_config(method: str, config: Any, **overrides: Any) -> Any:
    """``config`` (an instance of ``method``'s config class) with field overrides, each value
    coerced to its field's type (:func:`nfc_dps.overrides.apply_overrides`: ``band={"cutoff_start":
    0.5}`` or ``**{"band.cutoff_start": 0.5}`` changes that one field of the band and keeps the rest).

    An unknown field, a value of the wrong type (:class:`~nfc_dps.overrides.ConfigError`) and a
    change to a field the method sets itself (DAPS's ``band`` and ``detail``; restating their value
    is allowed) are errors.
    """
    m = get_method(method)
    if not isinstance(config, m.config_classes):
        names = " or ".join(c.__name__ for c in m.config_classes)
        raise TypeError(f"a {method} config must be a {names}, got {type(config).__name__}")
    try:
        new = apply_overrides(config, overrides, owner=method)
    except ConfigError as e:
        raise with_preset_hint(method, type(config), e) from None
    changed = sorted(f for f in m.fixed_fields if getattr(new, f) != getattr(config, f))
    if changed:
        raise ConfigError(f"{method} sets {changed} itself (DAPS is NFC with the band and the Haar commitment off); "
                          f"to change them use method 'nfc'", changed[0])
    return new
