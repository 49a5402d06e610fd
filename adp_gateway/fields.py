"""Build a frozen settings dataclass from untrusted key/value input.

Used by the plugin's ``adapter_params`` and by the gateway's YAML config, so both give the same
errors: an unknown or missing key, a wrong type or a value outside its choices is rejected with
the field's name and what would be accepted. Field metadata may carry ``size=True`` (accepts
``64GiB``), ``choices=(...)``, ``minimum=N`` and ``help="..."``. A field may be a list of
strings, of ints, or of another settings dataclass (each item a mapping, checked the same way).
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from adp_gateway.errors import ConfigError
from adp_wire.units import parse_size

T = TypeVar("T")


def build(cls: type[T], values: Mapping[str, Any], where: str) -> T:
    """Return ``cls(**values)`` after checking every key and value; ``where`` prefixes errors."""
    assert dataclasses.is_dataclass(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    if not isinstance(values, Mapping):
        raise ConfigError(f"{where}: expected a mapping of settings, got {values!r}")
    for key in values:
        if key not in fields:
            raise ConfigError(f"{where}: unknown key {key!r}{_suggest(key, fields)}")
    for name, f in fields.items():
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if required and name not in values:
            raise ConfigError(f"{where}: missing key {name!r}")
    checked = {
        key: _check(f"{where}.{key}", hints[key], fields[key].metadata, value)
        for key, value in values.items()
    }
    return cls(**checked)


def describe(cls: type[Any]) -> dict[str, tuple[str, Any]]:
    """Map each field to (type name, default), for docs and the manifest test."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        kind = "size" if f.metadata.get("size") else _type_name(hints[f.name])
        out[f.name] = (kind, f.default)
    return out


def _suggest(key: str, known: Mapping[str, Any]) -> str:
    close = difflib.get_close_matches(key, list(known), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"{hint} (accepted: {', '.join(sorted(known))})"


def _check(name: str, hint: Any, meta: Mapping[str, Any], value: Any) -> Any:
    allowed = _allowed_types(hint)
    if value is None and type(None) in allowed:
        return None
    if meta.get("size"):
        return _bounded(name, meta, parse_size(value, name))
    if isinstance(value, bool) and bool not in allowed:
        raise ConfigError(f"{name}: expected {_type_name(hint)}, got the boolean {value!r}")
    if isinstance(value, int) and float in allowed and not isinstance(value, bool):
        value = float(value)
    members = typing.get_args(hint) if len(allowed) > 1 else (hint,)
    lists = [t for t in members if typing.get_origin(t) is list]
    if lists:
        return _check_list(name, typing.get_args(lists[0])[0], value)
    if not isinstance(value, tuple(t for t in allowed if isinstance(t, type))):
        raise ConfigError(
            f"{name}: expected {_type_name(hint)}, got {type(value).__name__} {value!r}"
        )
    choices = meta.get("choices")
    if choices is not None and value not in choices:
        raise ConfigError(f"{name}: {value!r} is not one of {', '.join(map(repr, choices))}")
    return _bounded(name, meta, value)


def _check_list(name: str, item: type[Any], value: Any) -> list[Any]:
    if dataclasses.is_dataclass(item):
        if not isinstance(value, list):
            raise ConfigError(f"{name}: expected a list of mappings, got {value!r}")
        return [build(item, v, f"{name}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, (str, int)):
        value = [value]
    if not isinstance(value, list) or not all(_is(v, item) for v in value):
        raise ConfigError(f"{name}: expected a list of {_type_name(item)}, got {value!r}")
    return value


def _is(value: Any, kind: type[Any]) -> bool:
    return isinstance(value, kind) and not (isinstance(value, bool) and kind is not bool)


def _bounded(name: str, meta: Mapping[str, Any], value: Any) -> Any:
    minimum = meta.get("minimum")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{name}: must be at least {minimum}, got {value!r}")
    return value


def _allowed_types(hint: Any) -> tuple[Any, ...]:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return typing.get_args(hint)
    if typing.get_origin(hint) is list:
        return (list,)
    return (hint,)


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) is list:
        return f"list[{_type_name(typing.get_args(hint)[0])}]"
    if dataclasses.is_dataclass(hint):
        return "mapping"
    allowed = _allowed_types(hint)
    if len(allowed) > 1:
        return " | ".join(_type_name(t) for t in allowed)
    name = getattr(allowed[0], "__name__", str(allowed[0]))
    return "null" if name == "NoneType" else name
