"""Config files: YAML (or JSON) -> validated plain dicts -> the objects they describe.

Two kinds of file, each mapping one to one onto existing constructor arguments:

* a **task** config, ``{task: <name>, <operator params>, noise_sigma: <float>}``: the operator
  params are those of ``nfc_dps.operators.build_operator`` for that task (``TASKS[task].params``, with
  their defaults); ``noise_sigma`` is the measurement noise std in **[0, 1] pixel units** (the
  "0.05" of DPS/DAPS/NFC, stated for images in [-1, 1], is 0.025 here). Relative ``*_path``
  params are resolved against the config file's folder.
* a **sampler** config, ``{method: nfc, preset: fast, <field overrides>}``: any field of the
  method's config dataclass (``METHODS[method].config_class``); fields that hold a dataclass
  (NFC's ``band:`` / ``detail:``) take a nested mapping of their own fields, merged onto the
  preset's value.

A **run** config holds both as sections, ``{task: {...}, sampler: {...}, seed: 0,
num_samples: 1}``; that is what ``resolved_config.json`` (written next to every output) and
``simulation.json`` (written by ``nfc-dps simulate``, kind ``nfc_dps.simulation``) contain, so
either can be passed back with ``--config`` to reproduce a run.

Every unknown key or name is a :class:`ConfigError` naming the file, the key and the allowed
keys. Scalars are checked against the type of the default they replace (``1e-3`` is read as a
float, a duplicated key is an error). Later files override earlier ones; command-line flags
override files (the caller applies them with :meth:`SamplerSpec.set` and friends).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml
from .operators import TASKS, check_task_params, noise_sigma_problem, build_operator
from .samplers import METHODS, get_config

__all__ = [
    "ConfigError", "TaskConfig", "SamplerSpec", "ConfigBundle", "DEFAULT_NOISE_SIGMA", "KIND_RUN", "PER_IMAGE_SEED",
    "KIND_SIMULATION", "INCOMPLETE", "load_mapping", "load_config", "parse_task", "parse_sampler", "task_defaults",
    "sampler_fields", "steps_field", "parse_scalar",
]

DEFAULT_NOISE_SIGMA = 0.025
DEFAULT_METHOD = "nfc"
#: None: the method's own default preset (``Method.default_preset``: NFC's "deterministic", else "fast")
DEFAULT_PRESET: str | None = None
KIND_RUN = "nfc_dps.run"
KIND_SIMULATION = "nfc_dps.simulation"
#: key of a simulation.json whose folder a simulate run was rewriting when it stopped
INCOMPLETE = "incomplete"
#: how ``nfc-dps restore`` derives each image's seed from the run's base seed
PER_IMAGE_SEED = ("nfc_dps.api.stable_seed(seed, name): a hash of the base seed and the image's path relative "
                  "to the input folder ('/'-separated), never its position in the folder")
UNITS_NOTE = ("images and noise_sigma in [0, 1] pixel units; DPS/DAPS/NFC's sigma_y = 0.05 "
              "(for images in [-1, 1]) is noise_sigma = 0.025 here")

#: keys of a run config (and of the records we write) that configure the run
_RUN_KEYS = ("kind", "task", "sampler", "seed", "num_samples")
#: keys we write into resolved_config.json / simulation.json for people to read; ignored on load
_INFO_KEYS = ("versions", "per_image_seed", "prior", "units", "created", "command", "device", "note",
              "images", "measurements", "ground_truth", "kernels", "masks", "simulated_task", "alpha",
              "bit_depth", "outputs", "noise_seed", "operator_seed", "inputs", "threads", "simulation_seed",
              "precision", "max_batch", "batch_size")


class ConfigError(ValueError):
    """A config file or flag that does not validate; the message names the file and the key."""


# --------------------------------------------------------------------------------------------
# reading files


class _Loader(yaml.SafeLoader):
    """yaml.SafeLoader that reads 1e-3 as a float (YAML 1.1 wants 1.0e-3) and rejects duplicate keys."""

    def construct_mapping(self, node, deep=False):  # noqa: D401 - PyYAML hook
        seen: set = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode):
                if key_node.value in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key_node.value!r}", key_node.start_mark)
                seen.add(key_node.value)
        return super().construct_mapping(node, deep)


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def load_mapping(path: str | Path) -> dict[str, Any]:
    """A YAML or JSON file's top-level mapping; ConfigError naming the file otherwise."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read config file ({e})") from e
    try:
        data = json.loads(text) if path.suffix.lower() == ".json" else yaml.load(text, Loader=_Loader)  # noqa: S506
    except (yaml.YAMLError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path}: invalid {'JSON' if path.suffix.lower() == '.json' else 'YAML'}: {e}") from e
    if data is None:
        raise ConfigError(f"{path}: empty config file")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config file must hold a mapping of keys to values, got {type(data).__name__}")
    bad = [k for k in data if not isinstance(k, str)]
    if bad:
        raise ConfigError(f"{path}: keys must be strings, got {bad[0]!r}")
    return data


def parse_scalar(text: str) -> Any:
    """A command-line value (``--set key=value``) read as a YAML scalar: 3 -> int, 0.5 / 1e-3 -> float."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError:
        return text


# --------------------------------------------------------------------------------------------
# values


def _coerce(value: Any, default: Any, where: str, pair: bool = False) -> Any:
    """Check ``value`` against the type of the ``default`` it replaces; convert harmless forms
    (``pair``: an int key that also takes an (h, w) pair, a task's ``pair_params``)."""
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    if isinstance(default, int):
        if isinstance(value, bool):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str) and re.fullmatch(r"[-+]?\d+", value.strip()):
            return int(value)
        if pair and isinstance(value, (list, tuple)) and len(value) == 2 \
                and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return tuple(value)  # (height, width)
        raise ConfigError(f"{where}: expected an integer{' or [height, width]' if pair else ''}, got {value!r}")
    if isinstance(default, float):
        if isinstance(value, bool):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        if isinstance(value, (int, float)):
            out = float(value)
        elif isinstance(value, str):
            try:
                out = float(value)
            except ValueError:
                raise ConfigError(f"{where}: expected a number, got {value!r}") from None
        else:
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        if not math.isfinite(out):
            raise ConfigError(f"{where}: expected a finite number, got {value!r}")
        return out
    if isinstance(default, str):
        if isinstance(value, str):
            return value
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    if isinstance(default, tuple):
        if isinstance(value, (list, tuple)):
            return tuple(value)
        raise ConfigError(f"{where}: expected a list, got {value!r}")
    if default is None:  # a required file path
        if isinstance(value, (str, Path)):
            return str(value)
        raise ConfigError(f"{where}: expected a file path, got {value!r}")
    return value


def _unknown(where: str, key: str, allowed: Sequence[str], what: str = "key") -> ConfigError:
    return ConfigError(f"{where}: unknown {what} {key!r}; allowed: {', '.join(allowed) if allowed else 'none'}")


# --------------------------------------------------------------------------------------------
# task configs


def task_defaults(task: str) -> dict[str, Any]:
    """The operator parameters of ``task`` and their defaults (None = required)."""
    return dict(TASKS[task].params)


@dataclass
class TaskConfig:
    """A validated task config: ``build_operator(task, image_size, seed, **params)`` + the noise level."""

    task: str
    params: dict[str, Any] = field(default_factory=dict)
    noise_sigma: float = DEFAULT_NOISE_SIGMA
    source: str = "<defaults>"

    def as_dict(self) -> dict[str, Any]:
        """The config as written in a file (every parameter, defaults filled in)."""
        full = {**task_defaults(self.task), **self.params}
        return {"task": self.task, **{k: list(v) if isinstance(v, tuple) else v for k, v in full.items()},
                "noise_sigma": self.noise_sigma}

    def with_params(self, task: str | None = None, **params: Any) -> "TaskConfig":
        """A copy with another task and/or parameters (validated); parameters of the old task that
        the new one does not take are dropped."""
        name = task or self.task
        allowed = task_defaults(name)
        merged = {k: v for k, v in self.params.items() if k in allowed}
        merged.update(params)
        return parse_task({"task": name, **merged, "noise_sigma": self.noise_sigma}, self.source)

    def build(self, image_size: tuple[int, int], seed: int = 0):
        return build_operator(self.task, image_size=image_size, seed=seed, **self.params)


def parse_task(data: Mapping[str, Any], source: str, base_dir: Path | None = None) -> TaskConfig:
    """Validate a task mapping ``{task, <operator params>, noise_sigma}``."""
    data = dict(data)
    if "task" not in data:
        raise ConfigError(f"{source}: missing key 'task' (one of: {', '.join(TASKS)})")
    name = data.pop("task")
    if not isinstance(name, str) or name not in TASKS:
        raise _unknown(source, str(name), list(TASKS), "task")
    noise = data.pop("noise_sigma", DEFAULT_NOISE_SIGMA)
    noise = _coerce(noise, 0.0, f"{source}: key 'noise_sigma'")
    why = noise_sigma_problem(noise)
    if why:
        raise ConfigError(f"{source}: key 'noise_sigma' {why}")
    allowed = TASKS[name].params
    params: dict[str, Any] = {}
    for key, value in data.items():
        if key not in allowed:
            raise ConfigError(f"{source}: unknown key {key!r} for task {name!r}; allowed: "
                              f"{', '.join(['task', *allowed, 'noise_sigma'])}")
        value = _coerce(value, allowed[key], f"{source}: key {key!r}", pair=key in TASKS[name].pair_params)
        if key.endswith("_path") and base_dir is not None and not Path(value).is_absolute():
            value = str((base_dir / value).resolve())
        params[key] = value
    try:  # the values too, before any image is read (not the image-size checks: no size yet)
        check_task_params(name, **params)
    except ValueError as e:
        raise ConfigError(f"{source}: {e}") from e
    return TaskConfig(name, params, noise, source)


# --------------------------------------------------------------------------------------------
# sampler configs


def _method(name: str, where: str):
    if not isinstance(name, str) or name not in METHODS:
        raise _unknown(where, str(name), sorted(METHODS), "method")
    return METHODS[name]


def sampler_fields(method: str, preset: str | None = DEFAULT_PRESET) -> dict[str, Any]:
    """Field name -> value in the preset (None: the method's default preset), for the method's config class."""
    m = _method(method, "sampler config")
    preset = m.default_preset if preset is None else preset
    base = m.presets[preset] if preset in m.presets else None
    if base is not None and dataclasses.is_dataclass(base):
        return {f.name: getattr(base, f.name) for f in dataclasses.fields(base) if f.init}
    params = inspect.signature(m.config_class).parameters
    return {k: getattr(base, k, p.default) for k, p in params.items() if k != "self"}


def steps_field(method: str) -> str | None:
    """The field that ``--steps`` sets: annealing levels (NFC, DAPS) or sampler steps (DPS, ...)."""
    names = sampler_fields(method, next(iter(_method(method, "--method").presets)))
    for candidate in ("num_levels", "num_steps", "steps"):
        if candidate in names:
            return candidate
    return None


def _validate_overrides(method: str, preset: str, overrides: Mapping[str, Any],
                        provenance: Mapping[str, str]) -> dict[str, Any]:
    allowed = sampler_fields(method, preset)
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        where = provenance.get(key, "sampler config")
        if key not in allowed:
            raise ConfigError(f"{where}: unknown key {key!r} for method {method!r}; allowed: "
                              f"{', '.join(['method', 'preset', *allowed])}")
        current = allowed[key]
        if dataclasses.is_dataclass(current) and not isinstance(current, type):
            if dataclasses.is_dataclass(value) and not isinstance(value, type):
                value = dataclasses.asdict(value)
            if not isinstance(value, Mapping):
                raise ConfigError(f"{where}: key {key!r} takes a mapping of "
                                  f"{', '.join(f.name for f in dataclasses.fields(current))}, got {value!r}")
            sub = {f.name: getattr(current, f.name) for f in dataclasses.fields(current) if f.init}
            nested = {}
            for k, v in value.items():
                if k not in sub:
                    raise ConfigError(f"{where}: unknown key {k!r} in {key!r}; allowed: {', '.join(sub)}")
                nested[k] = _coerce(v, sub[k], f"{where}: key '{key}.{k}'")
            out[key] = nested
        elif _takes_number_or_name(method, preset, key):
            out[key] = value if isinstance(value, str) and not _is_number(value) else _coerce(value, 0.0, f"{where}: key {key!r}")
        else:
            out[key] = _coerce(value, current, f"{where}: key {key!r}")
    return out


def _takes_number_or_name(method: str, preset: str | None, key: str) -> bool:
    """Whether the preset's config field is typed ``float | str`` (a number or a rule's name, e.g.
    NFC's ``sigma_max: auto``); the config class validates the name."""
    m = _method(method, "sampler config")
    preset = m.default_preset if preset is None else preset
    hint = typing.get_type_hints(type(m.presets[preset]) if preset in m.presets else m.config_class).get(key)
    return set(typing.get_args(hint)) == {float, str}


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@dataclass
class SamplerSpec:
    """method + preset + field overrides, with where each override came from."""

    method: str = DEFAULT_METHOD
    preset: str | None = DEFAULT_PRESET
    overrides: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, str] = field(default_factory=dict)

    @property
    def resolved_preset(self) -> str:
        """The preset's name, the method's default when none was given."""
        return _method(self.method, self.provenance.get("method", "sampler config")).default_preset \
            if self.preset is None else self.preset

    def set(self, key: str, value: Any, source: str) -> None:
        """Override one field; ``band.cutoff_start`` style keys set a nested field."""
        if "." in key:
            outer, inner = key.split(".", 1)
            nested = dict(self.overrides.get(outer) or {})
            nested[inner] = value
            self.overrides[outer] = nested
            self.provenance[outer] = source
        else:
            self.overrides[key] = value
            self.provenance[key] = source

    def update(self, other: "SamplerSpec", method_set: bool, preset_set: bool) -> None:
        if method_set:
            self.method = other.method
        if preset_set:
            self.preset = other.preset
        for key, value in other.overrides.items():
            if isinstance(value, Mapping) and isinstance(self.overrides.get(key), Mapping):
                value = {**self.overrides[key], **value}
            self.overrides[key] = value
            self.provenance[key] = other.provenance.get(key, "sampler config")

    def validate(self) -> dict[str, Any]:
        m = _method(self.method, self.provenance.get("method", "sampler config"))
        if self.resolved_preset not in m.presets:
            raise ConfigError(f"{self.provenance.get('preset', 'sampler config')}: unknown preset "
                              f"{self.preset!r} for method {self.method!r}; allowed: {', '.join(m.presets)}")
        return _validate_overrides(self.method, self.resolved_preset, self.overrides, self.provenance)

    def build(self) -> Any:
        """The method's config object: the preset with the overrides applied."""
        kwargs = self.validate()  # nested mappings are merged onto the preset's value by get_config
        try:
            return get_config(self.method, self.resolved_preset, **kwargs)
        except (ValueError, TypeError) as e:
            where = ", ".join(sorted({self.provenance.get(k, "sampler config") for k in kwargs})) or "sampler config"
            raise ConfigError(f"{where}: invalid {self.method} settings: {e}") from e

    def as_dict(self) -> dict[str, Any]:
        return {"method": self.method, "preset": self.resolved_preset, **self.validate()}


def parse_sampler(data: Mapping[str, Any], source: str, default_method: str = DEFAULT_METHOD,
                  default_preset: str | None = DEFAULT_PRESET) -> tuple[SamplerSpec, bool, bool]:
    """Validate ``{method, preset, <fields>}``; returns (spec, method given, preset given)."""
    data = dict(data)
    method_set, preset_set = "method" in data, "preset" in data
    spec = SamplerSpec(data.pop("method", default_method), data.pop("preset", default_preset))
    spec.provenance.update(method=source, preset=source)
    _method(spec.method, source)
    for key, value in data.items():
        spec.set(key, value, source)
    spec.validate()
    return spec, method_set, preset_set


# --------------------------------------------------------------------------------------------
# whole files


@dataclass
class ConfigBundle:
    """Everything a list of config files says, merged in order."""

    task: TaskConfig | None = None
    sampler: SamplerSpec = field(default_factory=SamplerSpec)
    seed: int | None = None
    num_samples: int | None = None
    simulation: dict[str, Any] | None = None
    simulation_dir: Path | None = None
    sources: list[str] = field(default_factory=list)
    #: the prior a run record (resolved_config.json) names, and that file: informational (the
    #: prior is chosen with --prior), for a warning when another one is in use
    recorded_prior: tuple[str, str] | None = None


def _merge_sampler(bundle: ConfigBundle, data: Mapping[str, Any], source: str) -> None:
    spec, method_set, preset_set = parse_sampler(data, source, bundle.sampler.method, bundle.sampler.preset)
    if method_set and spec.method != bundle.sampler.method:
        bundle.sampler = SamplerSpec()  # overrides of another method do not carry over
    bundle.sampler.update(spec, method_set, preset_set)
    bundle.sampler.provenance.update({k: source for k in ("method", "preset") if k in data})


def load_config(paths: Sequence[str | Path], bundle: ConfigBundle | None = None) -> ConfigBundle:
    """Read and merge config files (task, sampler, run or simulation records), later ones winning."""
    bundle = bundle or ConfigBundle()
    for p in paths:
        path = Path(p)
        data = load_mapping(path)
        src = str(path)
        bundle.sources.append(src)
        kind = data.get("kind")
        task = data.get("task")
        if kind is not None and kind not in (KIND_RUN, KIND_SIMULATION):
            raise ConfigError(f"{src}: unknown kind {kind!r}; allowed: {KIND_RUN}, {KIND_SIMULATION}")
        if kind == KIND_SIMULATION and data.get(INCOMPLETE):
            raise ConfigError(f"{src}: {data[INCOMPLETE]}")
        if kind is not None or isinstance(task, Mapping) or "sampler" in data:
            for key in data:
                if key not in _RUN_KEYS and key not in _INFO_KEYS:
                    raise _unknown(src, key, list(_RUN_KEYS))
            if task is not None:
                if not isinstance(task, Mapping):
                    raise ConfigError(f"{src}: key 'task' of a run config must be a mapping, got {task!r}")
                bundle.task = parse_task(task, f"{src} (task)", path.parent.resolve())
            if data.get("sampler") is not None:
                if not isinstance(data["sampler"], Mapping):
                    raise ConfigError(f"{src}: key 'sampler' must be a mapping, got {data['sampler']!r}")
                _merge_sampler(bundle, data["sampler"], f"{src} (sampler)")
            if isinstance(data.get("prior"), str):
                bundle.recorded_prior = (data["prior"], src)
            if data.get("seed") is not None:
                bundle.seed = _coerce(data["seed"], 0, f"{src}: key 'seed'")
            if data.get("num_samples") is not None:
                bundle.num_samples = _coerce(data["num_samples"], 1, f"{src}: key 'num_samples'")
            if kind == KIND_SIMULATION:
                bundle.simulation, bundle.simulation_dir = data, path.parent.resolve()
        elif isinstance(task, str):
            sampler_keys = [k for k in data if k in ("method", "preset")]
            if sampler_keys:
                raise ConfigError(f"{src}: a task config cannot also set {sampler_keys[0]!r}; put the sampler "
                                  f"in its own file, or use sections 'task:' and 'sampler:'")
            bundle.task = parse_task(data, src, path.parent.resolve())
        elif "method" in data or "preset" in data:
            _merge_sampler(bundle, data, src)
        elif task is not None:
            raise _unknown(src, str(task), list(TASKS), "task")
        else:
            raise ConfigError(
                f"{src}: cannot tell what this config is for: a task config needs 'task: <name>' "
                f"({', '.join(TASKS)}), a sampler config 'method: <name>' ({', '.join(sorted(METHODS))}); "
                f"found keys {', '.join(map(str, data)) or 'none'}")
    return bundle
