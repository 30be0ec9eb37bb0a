"""Overrides of a config dataclass: the one place where a setting's value is checked against its
field's type. ``apply_overrides(cfg, {"num_levels": 3, "band.cutoff_start": "0.5"})`` is ``cfg``
with those fields replaced.

Keys are field names; ``outer.inner`` (or ``outer: {inner: ...}``) sets a field of a field that
holds a dataclass, on top of that field's current value. Values are coerced from the field's
annotation (:func:`coerce`): ``int`` takes 3, 3.0 and "3"; ``float`` a finite number or a numeric
string; ``bool`` only true or false; ``str`` a string; a tuple a list; a union (``float | str``)
its first member that fits. A mismatch is a :class:`ConfigError` naming the key and the value.
The dataclass's own ``__post_init__`` then checks ranges and names.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import types
import typing
from pathlib import Path
from typing import Any, Mapping

__all__ = ["ConfigError", "coerce", "coerce_overrides", "apply_overrides", "field_types", "flatten"]


class ConfigError(ValueError):
    """A config file, flag or override that does not validate; the message names the key (and the
    file or flag where the caller knows it). ``key``: the override key at fault, when there is one."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


_INT = re.compile(r"[-+]?\d+")
_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string", Path: "a file path",
          tuple: "a list"}


def _name(hint: Any) -> str:
    if _is_union(hint):
        return " or ".join(_name(h) for h in typing.get_args(hint) if h is not type(None))
    if typing.get_origin(hint) is tuple:
        args = typing.get_args(hint)
        return "[height, width]" if args == (int, int) else "a list"
    return _NAMES.get(hint, getattr(hint, "__name__", str(hint)))


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def _fits(value: Any, hint: Any) -> tuple[bool, Any]:
    """(True, the value converted to ``hint``) when it fits, else (False, None)."""
    if hint is bool:
        return isinstance(value, bool), value
    if isinstance(value, bool):  # true/false is not a number
        return False, None
    if hint is int:
        if isinstance(value, int):
            return True, value
        if isinstance(value, float) and value.is_integer():
            return True, int(value)
        if isinstance(value, str) and _INT.fullmatch(value.strip()):
            return True, int(value)
        return False, None
    if hint is float:
        if isinstance(value, (int, float)):
            out = float(value)
        elif isinstance(value, str):
            try:
                out = float(value)
            except ValueError:
                return False, None
        else:
            return False, None
        return math.isfinite(out), out
    if hint is str:
        return isinstance(value, str), value
    if hint is Path:
        return isinstance(value, (str, Path)), str(value)
    if hint is tuple or typing.get_origin(hint) is tuple:
        if not isinstance(value, (list, tuple)):
            return False, None
        args = typing.get_args(hint)
        if not args or (len(args) == 2 and args[1] is Ellipsis):
            return True, tuple(value)
        if len(value) != len(args):
            return False, None
        items = [_fits(v, h) for v, h in zip(value, args)]
        return all(ok for ok, _ in items), tuple(v for _, v in items)
    if _is_union(hint):
        if value is None and type(None) in typing.get_args(hint):
            return True, None
        for member in typing.get_args(hint):
            ok, out = _fits(value, member)
            if ok:
                return True, out
        return False, None
    return True, value  # Any, or a type this module does not check


def coerce(value: Any, hint: Any, key: str) -> Any:
    """``value`` converted to the type ``hint`` (an annotation: int, float, bool, str, Path (a file
    path, kept as str), tuple[...], a union of those); ConfigError naming ``key`` when it does not fit."""
    ok, out = _fits(value, hint)
    if not ok:
        what = "a finite number" if hint is float and _number(value) else _name(hint)  # inf, nan
        raise ConfigError(f"key {key!r}: expected {what}, got {value!r}", key)
    return out


def _number(value: Any) -> bool:
    """Whether ``value`` reads as a number (inf and nan included)."""
    if isinstance(value, bool):
        return False
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


@functools.lru_cache(maxsize=None)
def field_types(cls: type) -> dict[str, Any]:
    """Field name -> annotation of the dataclass ``cls``'s constructor fields."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(cls) if f.init}


def flatten(overrides: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"band": {"cutoff_start": 0.5}}`` -> ``{"band.cutoff_start": 0.5}``, in order."""
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _group(cls: type) -> bool:
    return isinstance(cls, type) and dataclasses.is_dataclass(cls)


def coerce_overrides(cls: type, overrides: Mapping[str, Any], owner: str = "") -> dict[str, Any]:
    """The overrides of a ``cls`` instance as flat dotted keys, each value coerced to its field's
    type. ConfigError (``key`` set) for an unknown key, a group of settings given a plain value, or
    a value that does not fit."""
    flat = flatten(overrides)
    unknown = [k for k in flat if not _known(cls, k)]
    if unknown:
        group, prefix = _deepest_group(cls, unknown[0])
        allowed = [f"{prefix}{n}" for n in field_types(group)]
        raise ConfigError(f"unknown {owner + ' ' if owner else ''}config keys {unknown}; allowed: "
                          f"{', '.join(allowed) or 'none'}", unknown[0])
    out: dict[str, Any] = {}
    for key, value in flat.items():
        hint = _field_at(cls, key)
        if _group(hint):
            if not isinstance(value, hint):
                raise ConfigError(f"key {key!r} takes a mapping of {', '.join(field_types(hint))}, got {value!r}", key)
            out[key] = value
        else:
            out[key] = coerce(value, hint, key)
    return out


def _field_at(cls: type, key: str) -> Any:
    hint: Any = cls
    for part in key.split("."):
        hint = field_types(hint)[part]
    return hint


def _deepest_group(cls: type, key: str) -> tuple[type, str]:
    """The innermost dataclass along ``key``'s path, and the dotted prefix of its fields."""
    prefix = ""
    for part in key.split(".")[:-1]:
        hint = field_types(cls).get(part)
        if not _group(hint):
            break
        cls, prefix = hint, f"{prefix}{part}."
    return cls, prefix


def _known(cls: type, key: str) -> bool:
    hint: Any = cls
    for part in key.split("."):
        if not _group(hint) or part not in field_types(hint):
            return False
        hint = field_types(hint)[part]
    return True


def apply_overrides(config: Any, overrides: Mapping[str, Any], owner: str = "") -> Any:
    """``config`` (a dataclass instance) with the overrides (:func:`coerce_overrides`) replaced; a
    dotted key or nested mapping changes one field of a group and keeps the group's others."""
    return _replace(config, coerce_overrides(type(config), overrides, owner))


def _replace(config: Any, flat: Mapping[str, Any]) -> Any:
    direct: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for key, value in flat.items():
        head, _, rest = key.partition(".")
        if rest:
            nested.setdefault(head, {})[rest] = value
        else:
            direct[head] = value
    for head, sub in nested.items():
        direct[head] = _replace(direct.get(head, getattr(config, head)), sub)
    return dataclasses.replace(config, **direct) if direct else config
