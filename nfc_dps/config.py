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
keys. A sampler field's value is coerced from the field's type in one place
(:mod:`nfc_dps.overrides`, which ``get_config`` applies), a task parameter's from its default's;
YAML reads ``1e-3`` as a float and refuses a duplicated key. Later files override earlier ones;
command-line flags override files (the caller applies them with :meth:`SamplerSpec.set`); a run
resolves its sampler once (:meth:`SamplerSpec.resolve` -> :class:`ResolvedSampler`).
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from .noise import EstimatedNoise, GaussianNoise, NoiseModel, NoiseSpecError, parse_noise
from .operators import TASKS, build_operator, check_task_params, noise_sigma_problem
from .overrides import ConfigError, coerce, coerce_overrides, flatten
from .samplers import METHODS, get_config, with_preset_hint

__all__ = [
    "ConfigError", "TaskConfig", "SamplerSpec", "ResolvedSampler", "ConfigBundle", "DEFAULT_NOISE_SIGMA", "KIND_RUN", "PER_IMAGE_SEED",
    "KIND_SIMULATION", "INCOMPLETE", "load_mapping", "load_config", "parse_task", "parse_sampler", "task_defaults",
    "parse_scalar",
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
PER_IMAGE_SEED = ("nfc_dps.restore_inputs.stable_seed(seed, name): a hash of the base seed and the image's path relative "
                  "to the input folder ('/'-separated), never its position in the folder")
#: ``noise_sigma: auto``: the Gaussian noise level estimated per image from the measurement
AUTO_NOISE_SIGMA = "auto"
UNITS_NOTE = ("images and noise_sigma in [0, 1] pixel units; DPS/DAPS/NFC's sigma_y = 0.05 "
              "(for images in [-1, 1]) is noise_sigma = 0.025 here")

#: keys of a run config (and of the records we write) that configure the run
_RUN_KEYS = ("kind", "task", "sampler", "seed", "num_samples")
#: keys we write into resolved_config.json / simulation.json for people to read; ignored on load
_INFO_KEYS = ("versions", "per_image_seed", "prior", "units", "created", "command", "device", "note",
              "images", "measurements", "ground_truth", "kernels", "masks", "simulated_task", "alpha",
              "bit_depth", "outputs", "noise_seed", "operator_seed", "inputs", "threads", "simulation_seed",
              "precision", "max_batch", "batch_size")


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


def _param_type(default: Any, pair: bool) -> Any:
    """The type a task parameter takes: its default's (None: a required file path; ``pair``: an
    int that also takes an (h, w) pair, a task's ``pair_params``)."""
    if default is None:
        return Path
    kind = type(default)
    return int | tuple[int, int] if pair and kind is int else kind


def _checked(value: Any, kind: Any, where: str, key: str) -> Any:
    """:func:`~nfc_dps.overrides.coerce`, its error prefixed with ``where`` (the file or flag)."""
    try:
        return coerce(value, kind, key)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}", key) from None


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
    #: or "auto": estimated per image when restoring; None: each input file's own (a task that
    #: reads its measurement from the file: jpeg)
    noise_sigma: float | str | None = DEFAULT_NOISE_SIGMA
    source: str = "<defaults>"
    #: a non-Gaussian noise model's spec (``poisson:30``; key ``noise``), or one whose parameters are
    #: estimated per image when restoring (``poisson-gaussian:auto``); None: Gaussian of noise_sigma
    noise: str | None = None

    @property
    def estimates_noise(self) -> bool:
        """Whether the noise's parameters are estimated per image (``noise_sigma: auto``, or a
        ``noise`` of ``kind:auto``)."""
        return isinstance(self.noise_model, EstimatedNoise)

    @property
    def noise_model(self) -> NoiseModel | EstimatedNoise | None:
        """The measurement's noise model: ``noise``'s, else Gaussian of ``noise_sigma``; with ``auto``
        the :class:`~nfc_dps.noise.EstimatedNoise` of its kind (each image's parameters are estimated
        by restore); None where it is each file's own (``noise_sigma`` None: the operator read from the
        file declares it)."""
        if self.noise_sigma is None and not self.noise:
            return None
        if self.noise:
            return parse_noise(self.noise, estimated=True)
        if self.noise_sigma == AUTO_NOISE_SIGMA:
            return EstimatedNoise("gaussian")
        return GaussianNoise(self.noise_sigma)

    def as_dict(self) -> dict[str, Any]:
        """The config as written in a file (every parameter, defaults filled in)."""
        full = {**task_defaults(self.task), **self.params}
        return {"task": self.task, **{k: list(v) if isinstance(v, tuple) else v for k, v in full.items()},
                "noise_sigma": self.noise_sigma, **({"noise": self.noise} if self.noise else {})}

    def with_params(self, task: str | None = None, **params: Any) -> "TaskConfig":
        """A copy with another task and/or parameters (validated); parameters of the old task that
        the new one does not take are dropped."""
        name = task or self.task
        allowed = task_defaults(name)
        merged = {k: v for k, v in self.params.items() if k in allowed}
        merged.update(params)
        noise = {"noise": self.noise} if self.noise else {}
        sigma = self.noise_sigma
        if TASKS[name].reads_measurement is not None and sigma == DEFAULT_NOISE_SIGMA and not noise:
            sigma = None  # another task's default level, never stated: the file's noise instead
        return parse_task({"task": name, **merged, "noise_sigma": sigma, **noise}, self.source)

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
    if TASKS[name].reads_measurement is not None:  # the noise is each file's own: nothing to state
        stated = {k: data.pop(k) for k in ("noise_sigma", "noise") if data.get(k) is not None}
        data.pop("noise_sigma", None), data.pop("noise", None)
        if stated:
            raise ConfigError(f"{source}: {file_noise_problem(name, stated)}")
        return _task_config(name, data, source, base_dir, None, None)
    noise = data.pop("noise_sigma", DEFAULT_NOISE_SIGMA)
    if noise != AUTO_NOISE_SIGMA:
        noise = _checked(noise, float, source, "noise_sigma")
        why = noise_sigma_problem(noise)
        if why:
            raise ConfigError(f"{source}: key 'noise_sigma' {why}")
    spec = data.pop("noise", None)
    if spec is not None:
        try:  # kind:auto is restore's: simulate and calibrate refuse it (cli.tasks.resolve_task)
            model = parse_noise(spec, estimated=True) if isinstance(spec, str) else None
        except NoiseSpecError as e:  # the key and the spec named once
            raise ConfigError(f"{source}: key 'noise' {e.spec!r}: {e.reason}") from None
        if model is None:
            raise ConfigError(f"{source}: key 'noise' must be a spec such as 'poisson:30', got {spec!r}")
        estimated = isinstance(model, EstimatedNoise)
        if not estimated and model.stated_problem():
            raise ConfigError(f"{source}: key 'noise' {spec!r}: {model.stated_problem()}")
        if not estimated and model.gaussian_sigma is not None:  # gaussian:s is noise_sigma s
            noise, spec = model.gaussian_sigma, None
        else:
            spec = str(model)
            if noise == AUTO_NOISE_SIGMA:
                raise ConfigError(f"{source}: noise_sigma 'auto' estimates a Gaussian noise level; the noise model "
                                  f"{spec} {'estimates' if estimated else 'states'} its own: give one of them")
    return _task_config(name, data, source, base_dir, noise, spec)


def file_noise_problem(task: str, stated: Mapping[str, Any]) -> str:
    """Why a noise stated for ``task``, whose noise is each input file's own, is refused."""
    given = ", ".join(f"{k} {v!r}" for k, v in stated.items())
    return (f"task {task!r} reads its noise from each file (a JPEG's quantisation error, q_min / sqrt(12) of the "
            f"file's own tables); {given} would contradict it: leave the noise out")


def _task_config(name: str, data: dict[str, Any], source: str, base_dir: Path | None, noise: Any,
                 spec: str | None) -> TaskConfig:
    """The :class:`TaskConfig` of ``data``'s operator parameters, checked, with the noise given."""
    allowed = TASKS[name].params
    params: dict[str, Any] = {}
    for key, value in data.items():
        if key not in allowed:
            raise ConfigError(f"{source}: unknown key {key!r} for task {name!r}; allowed: "
                              f"{', '.join(['task', *allowed, 'noise_sigma', 'noise'])}")
        value = _checked(value, _param_type(allowed[key], key in TASKS[name].pair_params), source, key)
        if key.endswith("_path") and base_dir is not None and not Path(value).is_absolute():
            value = str((base_dir / value).resolve())
        params[key] = value
    try:  # the values too, before any image is read (not the image-size checks: no size yet)
        check_task_params(name, **params)
    except ValueError as e:
        raise ConfigError(f"{source}: {e}") from e
    return TaskConfig(name, params, noise, source, spec)


# --------------------------------------------------------------------------------------------
# sampler configs


def _method(name: str, where: str):
    if not isinstance(name, str) or name not in METHODS:
        raise _unknown(where, str(name), sorted(METHODS), "method")
    return METHODS[name]


def _source(key: str | None, provenance: Mapping[str, str]) -> str:
    """Where the override ``key`` came from: its own, its group's or (for a group) its fields' sources."""
    inside = sorted({v for k, v in provenance.items() if key and k.startswith(f"{key}.")})
    while key:
        if key in provenance:
            return provenance[key]
        key = key.rpartition(".")[0]
    return ", ".join(inside) or "sampler config"


def validate_overrides(method: str, preset: str | None, overrides: Mapping[str, Any],
                        provenance: Mapping[str, str]) -> dict[str, Any]:
    """``overrides`` of ``method``'s config coerced to the field types (flat dotted keys), a
    ConfigError prefixed with where its key came from (``provenance``). The fields are those of the
    preset's config class (None: the method's default preset)."""
    m = _method(method, "sampler config")
    preset = m.default_preset if preset is None else preset
    cls = type(m.presets[preset]) if preset in m.presets else m.config_class
    try:
        return coerce_overrides(cls, overrides, method)
    except ConfigError as e:
        raise ConfigError(f"{_source(e.key, provenance)}: {with_preset_hint(method, cls, e)}", e.key) from None


@dataclass(frozen=True)
class ResolvedSampler:
    """A run's sampler, resolved once from its :class:`SamplerSpec`: the method, the preset's name
    and the config object (the preset with every override applied)."""

    method: str
    preset: str
    config: Any

    def as_dict(self) -> dict[str, Any]:
        """``{method, preset, <every config field>}``: what a run records of its sampler."""
        return {"method": self.method, "preset": self.preset, **dataclasses.asdict(self.config)}


@dataclass
class SamplerSpec:
    """method + preset + field overrides (flat: ``band.cutoff_start`` for a field of a group), with
    where each override came from; :meth:`resolve` makes the config."""

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
        """Override one field (``band.cutoff_start``: a field of a group); a mapping sets each of its keys."""
        for k, v in flatten({key: value}).items():
            self.overrides.pop(k, None)  # a later setting goes last, as it is applied
            self.overrides[k] = v
            self.provenance[k] = source

    def update(self, other: "SamplerSpec", method_set: bool, preset_set: bool) -> None:
        if method_set:
            self.method = other.method
        if preset_set:
            self.preset = other.preset
        for key, value in other.overrides.items():
            self.set(key, value, other.provenance.get(key, "sampler config"))

    def _checked_preset(self) -> str:
        m = _method(self.method, self.provenance.get("method", "sampler config"))
        if self.resolved_preset not in m.presets:
            raise ConfigError(f"{self.provenance.get('preset', 'sampler config')}: unknown preset "
                              f"{self.preset!r} for method {self.method!r}; allowed: {', '.join(m.presets)}")
        return self.resolved_preset

    def check(self) -> None:
        """Check the method, the preset and each override's key and type (their values' ranges
        are the config class's to check, in :meth:`resolve`); ConfigError naming the file or flag
        and the key."""
        validate_overrides(self.method, self._checked_preset(), self.overrides, self.provenance)

    def resolve(self) -> ResolvedSampler:
        """The method's config: the preset with the overrides applied (:func:`get_config`, the one
        override path); ConfigError naming the file or flag and the key."""
        preset = self._checked_preset()
        try:
            config = get_config(self.method, preset, **self.overrides)
        except ConfigError as e:
            raise ConfigError(f"{_source(e.key, self.provenance)}: {e}", e.key) from None
        except (ValueError, TypeError) as e:  # the config class's own checks of the values
            where = ", ".join(sorted({_source(k, self.provenance) for k in self.overrides})) or "sampler config"
            raise ConfigError(f"{where}: invalid {self.method} settings: {e}") from e
        return ResolvedSampler(self.method, preset, config)


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
    spec.check()  # each file on its own; the run resolves the merged spec once
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
                bundle.seed = _checked(data["seed"], int, src, "seed")
            if data.get("num_samples") is not None:
                bundle.num_samples = _checked(data["num_samples"], int, src, "num_samples")
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
