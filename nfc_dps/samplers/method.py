"""A method's entry (:class:`Method`): its sampler, config class, presets and what it can restore.
Each sampler module declares its entries in a module-level ``METHODS`` dict; the registry
(:mod:`nfc_dps.samplers.registry`) collects them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..noise import NOISE_KINDS
from ..operators.nonlinear import is_linear


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
    #: the method's place among the registered ones (lower first): the order of ``METHODS``, hence of
    #: tables, the harness's default columns and ``--method``'s listings; unique across methods
    rank: int
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
    #: the registered methods that take nonlinear operators, named when this one refuses one (the
    #: registry fills it in)
    nonlinear_alternatives: tuple[str, ...] = ()

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
                    f"decomposition); for the nonlinear {operator.name} use {', '.join(self.nonlinear_alternatives)}")
        return self.operator_problem(operator)

    @property
    def steps_field(self) -> str:
        """The field ``--steps`` sets: the config class's ``steps_field``."""
        return self.config_class.steps_field

    @property
    def config_classes(self) -> tuple[type, ...]:
        """``config_class`` and the classes of the presets: the configs ``sample`` takes."""
        return tuple(dict.fromkeys([self.config_class, *(type(p) for p in self.presets.values())]))
