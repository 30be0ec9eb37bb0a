"""The method registry: :data:`METHODS`, every :class:`Method` entry that a module of this package
declares in its own module-level ``METHODS`` dict (found by :func:`sampler_modules`, collected by
:func:`collect_methods` in ``rank`` order), and the one path from a method's name and a preset with
overrides to its config (:func:`get_config`)."""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import fields, replace
from types import ModuleType
from typing import Any, Iterable

from ..overrides import ConfigError, apply_overrides
from .method import Method


def sampler_modules() -> list[ModuleType]:
    """The modules of ``nfc_dps.samplers`` (this one aside), imported."""
    package = __name__.rpartition(".")[0]
    names = sorted(info.name for info in pkgutil.iter_modules(importlib.import_module(package).__path__))
    return [importlib.import_module(f"{package}.{name}") for name in names if f"{package}.{name}" != __name__]


def collect_methods(modules: Iterable[ModuleType]) -> dict[str, Method]:
    """The :class:`Method` entries of the modules' module-level ``METHODS`` dicts, ordered by
    ``rank``, each told which of them take nonlinear operators. A name or a rank declared twice is a
    ValueError naming both modules."""
    found: dict[str, tuple[Method, str]] = {}
    for module in modules:
        declared = getattr(module, "METHODS", None)
        if not isinstance(declared, dict):
            continue
        for name, method in declared.items():
            if not isinstance(method, Method):
                raise TypeError(f"{module.__name__}.METHODS[{name!r}] is a {type(method).__name__}, not a Method")
            if name in found:
                raise ValueError(f"method {name!r} is declared by both {found[name][1]} and {module.__name__}")
            tie = next((other for other, (m, _) in found.items() if m.rank == method.rank), None)
            if tie is not None:
                raise ValueError(f"methods {tie!r} ({found[tie][1]}) and {name!r} ({module.__name__}) share rank "
                                 f"{method.rank}; give each its own")
            found[name] = (method, module.__name__)
    ordered = sorted(found.items(), key=lambda item: item[1][0].rank)
    alternatives = tuple(name for name, (m, _) in ordered if m.takes_nonlinear)
    return {name: replace(m, nonlinear_alternatives=alternatives) for name, (m, _) in ordered}


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


#: every registered method by name, in ``rank`` order
METHODS: dict[str, Method] = collect_methods(sampler_modules())
