"""What a benchmark run is: the method lists, the protocols' tasks (:func:`task_specs`), the run's
settings (:class:`BenchSpec`), and the grid's columns: each method at each NFE budget
(:class:`MethodRun`, :func:`method_config`, :func:`method_runs`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..baselines import CLASSICAL, applicable
from ..config import DEFAULT_NOISE_SIGMA
from ..noise import GaussianNoise, NoiseModel
from ..operators import TASKS
from ..samplers import METHODS, get_config, get_method


def diffusion_methods() -> tuple[str, ...]:
    """Every registered sampler in ``rank`` order (a new one in nfc_dps.samplers.METHODS is a column
    with no edit here)."""
    return tuple(METHODS)


#: every registered sampler (:func:`diffusion_methods` when this module was imported)
DIFFUSION_METHODS = diffusion_methods()
#: the grid's default columns: every sampler, and every classical method for the measurements it
#: simulates (a linear operator's image under Gaussian noise)
DEFAULT_METHODS = DIFFUSION_METHODS + tuple(name for name, m in CLASSICAL.items()
                                            if m.operator_kind == "linear" and "gaussian" in m.noise_kinds)
PROTOCOLS = ("local", "paper", "oracle", "mixture", "calibration", "nonlinear", "noise_level", "blind", "jpeg")

FORMAT_VERSION = 1


@dataclass(frozen=True)
class TaskSpec:
    """A benchmark task: a registered task (:data:`nfc_dps.operators.TASKS`) and the protocol's
    values of its parameters."""

    name: str
    params: dict[str, Any]


def task_specs(protocol: str, size: int, boundary: str) -> dict[str, TaskSpec]:
    """The tasks of a protocol at image size ``size`` (see module doc and docs/benchmarks.md).

    local: SR x4 bicubic; box inpainting, box size/2 with margin size/16; random inpainting 70%;
    Gaussian blur 25x25 std 2; motion blur 25x25 intensity 0.5 (seeded per image); denoising.
    paper (DPS/DAPS at 256): SR x4 bicubic; 128x128 box (size/2) with margin 16 (size/16);
    70% random; Gaussian 61/3.0; motion 61/0.5.
    """
    blur = {"boundary": boundary}
    box = {"box_size": max(1, size // 2), "margin": max(0, size // 16)}
    if protocol == "paper":
        gk, mk = {"kernel_size": 61, "kernel_std": 3.0}, {"kernel_size": 61, "intensity": 0.5}
    else:
        gk, mk = {"kernel_size": 25, "kernel_std": 2.0}, {"kernel_size": 25, "intensity": 0.5}
    specs = [
        TaskSpec("sr_bicubic", {"factor": 4}),
        TaskSpec("inpaint_box", box),
        TaskSpec("inpaint_random", {"missing_fraction": 0.7}),
        TaskSpec("deblur_gaussian", {**gk, **blur}),
        TaskSpec("deblur_motion", {**mk, **blur}),
        TaskSpec("denoise", {}),
    ]
    # every other registered task that reads no file (neither its operator nor, as jpeg, its
    # measurement: the jpeg protocol has real files), at its default parameters and the protocol's
    # boundary (opt-in: --tasks)
    specs += [TaskSpec(name, {k: v for k, v in blur.items() if k in t.params}) for name, t in TASKS.items()
              if not t.reads and t.reads_measurement is None and name not in {s.name for s in specs}]
    return {s.name: s for s in specs}


#: the name a task (or calibration setting) is seeded under where it differs from its own, so
#: that the committed result files stay reproducible by their commands
SEED_NAMES = {"sr_bicubic": "sr4", "embedded-sr_bicubic": "embedded-sr4"}


def seed_name(name: str) -> str:
    """The name the seeds of task or setting ``name`` are drawn under (:data:`SEED_NAMES`)."""
    return SEED_NAMES.get(name, name)


DEFAULT_TASKS = ("sr_bicubic", "inpaint_box", "inpaint_random", "deblur_gaussian", "deblur_motion")
#: the tasks' names in the generated tables
TASK_LABELS = {"sr_bicubic": "SR ×4", "inpaint_box": "box inpainting", "inpaint_random": "random inpainting",
               "deblur_gaussian": "Gaussian deblur", "deblur_motion": "motion deblur", "denoise": "denoising"}


#: the key that marks a config.json as the mixture protocol's (its rows have other columns than the grid's)
MIXTURE_RECORD_KEY = "prestated_setting"


@dataclass
class BenchSpec:
    """Everything a benchmark run needs (built from the command line by :func:`spec_from_args`)."""

    protocol: str = "local"
    out: Path = Path("runs/bench/local")
    prior: str | None = None
    images: str | None = None
    image_names: tuple[str, ...] = ()
    num_images: int | None = None
    size: int = 64
    zoom: int = 2
    tasks: tuple[str, ...] = DEFAULT_TASKS
    methods: tuple[str, ...] = DEFAULT_METHODS
    budgets: tuple[int, ...] = ()
    preset: str = "fast"
    samples: int = 1
    #: the measurements' noise (the local and paper protocols' and the oracle's; the other protocols
    #: measure under their own)
    noise: NoiseModel = GaussianNoise(DEFAULT_NOISE_SIGMA)
    seed: int = 0
    boundary: str = "circular"
    device: str = "cpu"
    precision: str = "auto"
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    plots: bool = True
    save_images: bool = True
    label: str = ""
    oracle_alpha: float = 2.0
    oracle_pixel_std: float = 0.5
    #: the calibration protocol's NFE on the embedded prior, its validation tiles there and the
    #: coverage its calibrated interval targets
    embedded_budget: int = 20
    validation_images: int = 9
    coverage: float = 0.9

    def fingerprint(self) -> dict[str, Any]:
        """The settings that change a row's numbers (an existing OUT must agree on them)."""
        fp = {"protocol": self.protocol, "size": self.size, "zoom": self.zoom, "preset": self.preset,
              "samples": self.samples, "sigma_y": self.recorded_sigma(), "seed": self.seed, "boundary": self.boundary,
              "overrides": self.overrides, "format": FORMAT_VERSION}
        if self.protocol == "oracle":
            fp.update(num_images=self.num_images, oracle_alpha=self.oracle_alpha,
                      oracle_pixel_std=self.oracle_pixel_std)
        if self.protocol in ("mixture", "calibration"):
            fp.update(num_images=self.num_images)
        if self.protocol == "calibration":
            fp.update(validation_images=self.validation_images, coverage=self.coverage)
        if self.samples > 1:  # a mean-of-K row's NFE and seconds count all K chains (folders without this key: one chain's NFE)
            fp["mean_rows_count"] = "all chains"
        if self.noise.gaussian_sigma is None:  # Gaussian folders keep the record they had
            fp["noise"] = str(self.noise)
        return fp

    def recorded_sigma(self) -> float:
        """The ``sigma_y`` the run's records hold: the Gaussian std, or the default beside a non-Gaussian
        noise's spec."""
        sigma = self.noise.gaussian_sigma
        return DEFAULT_NOISE_SIGMA if sigma is None else sigma



@dataclass(frozen=True)
class MethodRun:
    """One column of the grid: a method (at a preset other than the run's, when ``preset`` is
    set: ``--methods nfc:deterministic``) at a budget (None = classical)."""

    method: str
    budget: int | None
    config: Any = None
    preset: str | None = None

    @property
    def label(self) -> str:
        """The ``method`` column of the results: ``nfc`` or ``nfc:deterministic``."""
        return self.method if self.preset is None else f"{self.method}:{self.preset}"


def method_config(method: str, preset: str, budget: int | None, overrides: dict[str, Any] | None = None) -> Any:
    """The sampler config of ``method`` at ``preset`` with NFE ``budget`` (the config's own
    ``with_nfe``: NFC/DAPS split it into levels x predictor steps, the peers take num_steps =
    budget). ``budget=None`` keeps the preset."""
    try:
        cfg = get_config(method, preset, **(overrides or {}))  # dotted keys: one field of a group
    except TypeError as e:  # a --set value of the wrong type, caught by a comparison in the config's checks
        given = ", ".join(f"{k}={v!r}" for k, v in (overrides or {}).items())
        raise ValueError(f"{method}: a setting of the wrong type ({given}): {e}") from e
    if budget is None:
        return cfg
    return cfg.with_nfe(budget)


def method_runs(spec: BenchSpec) -> list[MethodRun]:
    """The grid's columns: each classical method once, each diffusion method at every budget.
    Every ``--set`` names one diffusion column of the grid and changes that column only: ``nfc``
    the bare method at --preset, ``nfc:deterministic`` that preset."""
    for key in spec.overrides:
        if key.partition(":")[0] not in DIFFUSION_METHODS or key not in spec.methods:
            what = "a classical method has no sampler settings" if key in CLASSICAL else \
                f"not a diffusion column of --methods {','.join(spec.methods)}"
            raise ValueError(f"--set {key}.{next(iter(spec.overrides[key]))}=...: {what}")
    runs = []
    for entry in spec.methods:
        m, _, preset = entry.partition(":")
        if m in CLASSICAL and not preset:
            runs.append(MethodRun(m, None))
        elif m in DIFFUSION_METHODS:
            overrides = spec.overrides.get(entry, {})
            for b in spec.budgets or (None,):
                cfg = method_config(m, preset or spec.preset, b, overrides)
                runs.append(MethodRun(m, int(cfg.nfe), cfg, preset or None))
        else:
            raise ValueError(f"unknown method {entry!r}; choose from {', '.join(DEFAULT_METHODS)} "
                             f"(a diffusion method may name its preset: nfc:deterministic)")
    return runs


def noise_problem(method: str, noise: NoiseModel) -> str | None:
    """Why grid column ``method`` (``nfc``, ``nfc:deterministic``, ``tv``) cannot take measurements
    with ``noise``, or None."""
    name = method.partition(":")[0]
    if name in CLASSICAL:
        why = CLASSICAL[name].noise_problem(noise)
    elif name in METHODS:
        why = get_method(name).noise_problem(noise)
    else:
        return None  # reported as an unknown method
    return f"{name} {why}" if why else None


def not_applicable(run: MethodRun, op) -> str | None:
    """Why ``run`` cannot restore with ``op`` (a note for the summary), or None."""
    if run.method in CLASSICAL:
        return applicable(run.method, op)
    if run.method == "ddrm" and op.decomposition() is None:
        boundary = op.describe().get("boundary")
        return f"DDRM needs a diagonalisable operator (circulant blur, inpainting, denoising); {type(op).__name__}" \
               f"{f' ({boundary} boundary)' if boundary else ''} is not"
    return None


def estimators(run: MethodRun, samples: int) -> list[str]:
    """The estimator rows of a column: deterministic, or a sample plus the mean of ``samples`` when > 1."""
    if run.method in CLASSICAL or run.config.is_deterministic:
        return ["deterministic"]
    return ["sample"] + ([f"mean{samples}"] if samples > 1 else [])


def budget_str(run: MethodRun) -> str:
    """The budget column's value: the NFE budget, 0 for a classical method."""
    return "0" if run.budget is None else str(run.budget)

