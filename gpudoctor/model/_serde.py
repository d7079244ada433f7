"""``to_dict`` / ``from_dict`` for the model's frozen dataclasses (stdlib only).

Tuples of dataclasses, optional fields, enums (``str`` subclasses) and plain
mappings round-trip through JSON. Unknown keys in input are ignored, so a newer
run directory stays readable by an older gpudoctor where the schema allows it.
"""

from __future__ import annotations

import dataclasses
import enum
import sys
import types
import typing
from functools import cache
from typing import Any, TypeVar

T = TypeVar("T")


def to_dict(obj: Any) -> Any:
    """Convert a dataclass (recursively) to JSON-ready builtins."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): to_dict(v) for k, v in obj.items()}
    return obj


@cache
def _hints(cls: type) -> dict[str, Any]:
    module = sys.modules[cls.__module__]
    return typing.get_type_hints(cls, vars(module))


def _convert(tp: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return _convert(args[0], value)
        for a in args:  # first that accepts the value
            try:
                return _convert(a, value)
            except (TypeError, ValueError, KeyError):
                continue
        return value
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], v) for v in value)
        return tuple(_convert(a, v) for a, v in zip(args, value, strict=False))
    if origin is list:
        (arg,) = typing.get_args(tp)
        return [_convert(arg, v) for v in value]
    if origin is dict:
        _, varg = typing.get_args(tp)
        return {k: _convert(varg, v) for k, v in value.items()}
    if isinstance(tp, type):
        if dataclasses.is_dataclass(tp):
            return from_dict(tp, value)
        if issubclass(tp, enum.Enum):
            return tp(value)
        if tp is float and isinstance(value, int):
            return float(value)
    return value


def from_dict(cls: type[T], data: dict[str, Any]) -> T:
    """Build ``cls`` from ``data`` produced by :func:`to_dict` (unknown keys ignored)."""
    if not isinstance(data, dict):
        raise TypeError(f"{cls.__name__}: expected an object, got {type(data).__name__}")
    hints = _hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in data:
            kwargs[f.name] = _convert(hints[f.name], data[f.name])
    return cls(**kwargs)


class Serde:
    """Mixin giving a dataclass ``to_dict()`` and ``from_dict()``."""

    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    @classmethod
    def from_dict(cls: type[T], data: dict[str, Any]) -> T:
        return from_dict(cls, data)
