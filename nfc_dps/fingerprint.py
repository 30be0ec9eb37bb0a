"""The fingerprint of a prior that a calibration records: what the prior computes, from its class,
settings and weights, and, for a prior that runs code other than nfc_dps', torch's or diffusers',
also from its outputs on a fixed, seeded probe. :mod:`nfc_dps.conformal` re-exports these names.
"""

from __future__ import annotations

import hashlib
import math
import types
from typing import Any

import torch

from .priors.base import prior_device


class CalibrationError(ValueError):
    """A calibration that cannot be fitted, read, or applied to this run (a prior that cannot be
    fingerprinted among them); :mod:`nfc_dps.conformal` re-exports it."""


#: where a module's or callable's code must live for its weights to say what it computes (the
#: embedded and folder priors): anything else is also fingerprinted by its outputs on a probe
TRUSTED_CODE = ("nfc_dps", "torch", "diffusers")
#: the probe's noise stds (model units, clamped into the prior's range and deduplicated: the range the
#: samplers call, from a denoiser's few levels up to a diffusion prior's sigma_max of 80), sizes
#: tried (pixels) and seed
PROBE_SIGMAS = (0.05, 0.2, 0.5, 2.0, 10.0, 80.0)
PROBE_SIZES = (16, 64)
PROBE_SEED = 0
#: the probe's outputs ([-1, 1] model units) are hashed rounded to this step
PROBE_STEP = 1.0 / 1024


def _code_root(obj: Any) -> str:
    """The top-level package of the code ``obj`` runs: a function's or method's module, else its class's."""
    if isinstance(obj, (types.FunctionType, types.BuiltinFunctionType)):
        module = getattr(obj, "__module__", None) or ""
    elif isinstance(obj, types.MethodType):
        module = getattr(obj.__func__, "__module__", None) or ""
    else:
        module = type(obj).__module__ or ""
    return module.split(".")[0]


def _wrapped_callables(prior: Any) -> list[Any]:
    """The plain callables (functions, partials, callable objects; not modules) the prior or any of
    its submodules holds as attributes."""
    modules = list(prior.modules()) if isinstance(prior, torch.nn.Module) else [prior]
    return [v for m in modules for v in vars(m).values() if callable(v) and not isinstance(v, (torch.nn.Module, type))]


def weights_determine(prior: Any) -> bool:
    """True when the prior's class, every submodule's class and every callable it holds are
    nfc_dps', torch's or diffusers' code (:data:`TRUSTED_CODE`): then its settings and state dict
    say what it computes. A user's function, ``functools.partial`` or network class: False."""
    modules = list(prior.modules()) if isinstance(prior, torch.nn.Module) else [prior]
    return all(_code_root(m) in TRUSTED_CODE for m in (*modules, *_wrapped_callables(prior)))


def _probe_digest(prior: Any) -> bytes:
    """SHA-256 of the prior's outputs on a fixed, seeded probe: an (N, C, S, S) image uniform in
    [-1, 1] (S the smallest multiple of ``size_multiple`` >= each of :data:`PROBE_SIZES` in turn
    until one runs, or the prior's fixed size) plus Gaussian noise at :data:`PROBE_SIGMAS` (model
    units, clamped into its range; one image per distinct level, N of them), called under no_grad with torch's random state seeded (and
    restored after), outputs in float32 rounded to :data:`PROBE_STEP`. Buffers the call changes (a
    BatchNorm's running statistics in training mode) are put back. CalibrationError when the prior
    cannot denoise the probe, or when a second, identical call gives other outputs (not deterministic)."""
    channels, multiple = int(getattr(prior, "channels", 3)), max(1, int(getattr(prior, "size_multiple", 1)))
    fixed = getattr(prior, "fixed_size", None)
    sizes = [(int(fixed[0]), int(fixed[1]))] if fixed else [(s, s) for s in
                                                            dict.fromkeys(multiple * math.ceil(p / multiple)
                                                                          for p in PROBE_SIZES)]
    lo, hi = float(getattr(prior, "sigma_min", 0.0)), float(getattr(prior, "sigma_max", 1.0))
    sigmas = torch.tensor(list(dict.fromkeys(min(max(s, lo), hi) for s in PROBE_SIGMAS)), dtype=torch.float32)
    module = isinstance(prior, torch.nn.Module)
    device = (prior_device(prior) if module else None) or torch.device("cpu")
    floats = [t.dtype for t in (prior.parameters() if module else ()) if t.is_floating_point()]
    dtype = floats[0] if floats else torch.float32
    buffers = [(b, b.detach().clone()) for b in (prior.buffers() if module else ())]

    def call(x: torch.Tensor) -> Any:
        """The prior on ``x`` with torch's random state seeded (and restored after), its buffers put back."""
        try:
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.no_grad():
                torch.manual_seed(PROBE_SEED)
                return prior.denoise(x.to(device=device, dtype=dtype), sigmas.to(device=device, dtype=dtype))
        finally:
            with torch.no_grad():
                for b, saved in buffers:
                    b.copy_(saved)

    def rounded(out: torch.Tensor) -> torch.Tensor:
        q = torch.nan_to_num(out.detach().float().cpu(), nan=0.0, posinf=1e6, neginf=-1e6)
        return torch.round(q.clamp(-1e6, 1e6) / PROBE_STEP).to(torch.int64)

    for h, w in sizes:
        gen = torch.Generator().manual_seed(PROBE_SEED)
        clean = torch.rand((len(sigmas), channels, h, w), generator=gen) * 2 - 1
        x = clean + sigmas.view(-1, 1, 1, 1) * torch.randn(clean.shape, generator=gen)
        try:
            out, error = call(x), None
        except Exception as e:  # a user's prior may raise anything; a larger probe may run
            error = e
        if error is None:
            break
    if error is not None:
        raise CalibrationError(f"cannot fingerprint the prior {type(prior).__name__} for its calibration: it fails on "
                               f"the probe image {tuple(x.shape)} ({type(error).__name__}: {error})") from error
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(x.shape):
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise CalibrationError(f"cannot fingerprint the prior {type(prior).__name__} for its calibration: the probe "
                               f"image of shape {tuple(x.shape)} gave {got}")
    q = rounded(out)
    again = call(x)  # the same seeded call again: a prior whose outputs differ cannot be identified by them
    if not isinstance(again, torch.Tensor) or tuple(again.shape) != tuple(x.shape) or not torch.equal(rounded(again), q):
        raise CalibrationError(f"the prior {type(prior).__name__} is not deterministic: two calls on one seeded probe "
                               f"image {tuple(x.shape)} gave different outputs (randomness torch's seed does not "
                               f"fix: numpy.random, Python's random, a torch.Generator of its own, or "
                               f"nondeterministic kernels), so no calibration can identify it by its outputs; draw "
                               f"its randomness from torch's global generator (torch.randn, dropout), or make it "
                               f"deterministic")
    return hashlib.sha256(f"{tuple(x.shape)}".encode() + q.contiguous().numpy().tobytes()).digest()


def prior_fingerprint(prior: Any) -> str:
    """16 hex digits over what a prior computes: its class, its declared range, channels and size
    multiple, its own description (``extra_repr``: e.g. a wrapped function's settings), the
    qualified names of the functions it wraps, and its state dict (names, dtypes, shapes, values).
    The same weights give the same fingerprint wherever they are loaded from.

    A prior whose code is not all nfc_dps', torch's or diffusers' (:func:`weights_determine`: a
    ``DenoiserPrior`` around a user's function, a ``functools.partial`` or a closure, a user's
    network class) is also fingerprinted by its outputs on a fixed, seeded probe
    (:func:`_probe_digest`): two factories of one closure or partials of one function with other
    parameters differ. The probe's digest is stable across calls and processes on one machine
    (deterministic kernels); another device or library version may compute other roundings and
    so another fingerprint (calibrate there again). CalibrationError when the probe fails."""
    h = hashlib.sha256(type(prior).__qualname__.encode())
    declared = [getattr(prior, k, None) for k in ("sigma_min", "sigma_max", "channels", "size_multiple",
                                                  "denoiser_only")]
    h.update(repr(declared).encode())
    h.update(prior.extra_repr().encode() if hasattr(prior, "extra_repr") else b"")
    for value in vars(prior).values():
        if callable(value) and not isinstance(value, torch.nn.Module):  # a wrapped function, e.g. DenoiserPrior's fn
            h.update(f"{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', type(value).__qualname__)}"
                     .encode())
    state = prior.state_dict() if hasattr(prior, "state_dict") else {}
    for name in sorted(state):
        t = state[name]
        if isinstance(t, torch.Tensor):
            h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
            h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
                     if t.numel() else b"")
    if not weights_determine(prior):
        h.update(b"probe:" + _probe_digest(prior))
    return h.hexdigest()[:16]
