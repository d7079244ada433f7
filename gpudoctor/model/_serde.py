"""``to_dict`` / ``from_dict`` for the model's frozen dataclasses (stdlib only).

Tuples of dataclasses, optional fields, enums (``str`` subclasses) and plain
mappings round-trip through JSON. Unknown keys in input are ignored, so a newer
run directory stays readable by an older gpudoctor where the schema allows it.
"""

from __future__ import annotations

import dataclasses
import enum
import math
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
        if tp is float and isinstance(value, int) and not isinstance(value, bool):
            try:
                return float(value)
            except OverflowError:  # a 400-digit integer: a bad value, as every other (callers catch ValueError)
                raise ValueError(f"{str(value)[:20]}…: a number out of range") from None
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


# --------------------------------------------------------------------------- checking untrusted input


class FieldTypeError(ValueError):
    """A field of an input file does not have its documented type. ``field``: its path (``collected[2].ok``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"field '{field}' {message}")
        self.field = field


class FieldRangeError(FieldTypeError):
    """A field of an input file has its type but not a value that type can hold (a 400-digit integer,
    a NaN where a finite number is documented)."""


def _fixed(tp: Any) -> bool:
    """``tp`` is a tuple of fixed length (``tuple[str, int]``), not ``tuple[X, ...]`` or a list."""
    args = typing.get_args(tp)
    return typing.get_origin(tp) is tuple and bool(args) and args[-1] is not Ellipsis


def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        text = " or ".join(_describe(a) for a in args)
        return text + (" or null" if len(args) < len(typing.get_args(tp)) else "")
    if origin in (tuple, list):
        args = typing.get_args(tp)
        if _fixed(tp):  # tuple[str, int]: one item of each type, in order
            return f"a list of {len(args)} items ({', '.join(_describe(a) for a in args)})"
        return f"a list of {_describe(args[0]).removeprefix('a ').removeprefix('an ')}s" if args else "a list"
    if origin is dict:
        return "an object"
    if tp is Any:
        return "any value"
    if isinstance(tp, type):
        if dataclasses.is_dataclass(tp):
            return "an object"
        if issubclass(tp, enum.Enum):
            return "one of " + ", ".join(repr(m.value) for m in tp)
        return {str: "a string", int: "an integer", float: "a number", bool: "true or false"}.get(tp, tp.__name__)
    return str(tp)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, str):
        return f"the string {value[:40]!r}"
    return f"{type(value).__name__} {value!r}"[:60]


INT_LIMIT = 2**63  # every integer of a run file is a 64-bit one (nanoseconds, bytes, counts, ids)
FLOAT_LIMIT = float(2**63)  # and no float of one is larger: a second, a percentage, a rate


def _out_of_range(tp: type, value: Any, finite: bool) -> str:
    """Why a value of the right JSON type does not fit ``tp`` ("" when it does)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return ""
    if isinstance(value, int):
        return "" if -INT_LIMIT <= value < INT_LIMIT else "is out of range (more than a 64-bit integer)"
    if tp is float and finite and not (math.isfinite(value) and abs(value) < FLOAT_LIMIT):
        return f"is out of range ({value!r})"
    return ""


def _check_value(tp: Any, value: Any, where: str, finite: bool = False) -> None:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                _check_value(a, value, where, finite)
                return
            except FieldTypeError as err:
                errors.append(err)
        if len(errors) == 1 and errors[0].field != where:  # the nested field is the better name
            raise errors[0]
        raise FieldTypeError(where, f"must be {_describe(tp)}, not {_json_type(value)}")
    bad = FieldTypeError(where, f"must be {_describe(tp)}, not {_json_type(value)}")
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise bad
        args = typing.get_args(tp)
        if _fixed(tp):  # tuple[str, int]: each item against its own type, and as many as there are types
            if len(value) != len(args):
                raise bad
            for i, (a, v) in enumerate(zip(args, value, strict=True)):
                _check_value(a, v, f"{where}[{i}]", finite)
            return
        item = args[0] if args else Any
        for i, v in enumerate(value):
            _check_value(item, v, f"{where}[{i}]", finite)
        return
    if origin is dict:
        if not isinstance(value, dict):
            raise bad
        _, varg = typing.get_args(tp)
        for k, v in value.items():
            _check_value(varg, v, f"{where}.{k}", finite)
        return
    if tp is Any:
        return
    if isinstance(tp, type):
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, dict):
                raise bad
            check(tp, value, where, finite=finite)
            return
        if issubclass(tp, enum.Enum):
            if value not in {m.value for m in tp}:
                raise bad
            return
        if tp is bool:
            ok = isinstance(value, bool)
        elif tp is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif tp is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        else:
            ok = isinstance(value, tp)
        if not ok and tp is int and isinstance(value, float) and not math.isfinite(value):
            raise FieldRangeError(where, f"is not finite ({value!r})")  # JSON's NaN / Infinity for a count
        if not ok:
            raise bad
        why = _out_of_range(tp, value, finite)
        if why:
            raise FieldRangeError(where, why)


def check(cls: type, data: Any, where: str = "", required: bool = True, finite: bool = False) -> None:
    """Raise :class:`FieldTypeError` naming the first field of ``data`` that :func:`from_dict`
    would turn into something else than ``cls`` documents (a number for a list, a string for
    a flag, an unknown status, a required field missing) or that does not fit its range (an
    integer of more than 64 bits, anywhere). Unknown keys are allowed. ``required`` False:
    only the fields present are checked (at the top level). ``finite``: a float field must
    also be finite and below 2**63 (a run file's; a report's gains may be infinite)."""
    if not isinstance(data, dict):
        raise FieldTypeError(where or cls.__name__, f"must be an object, not {_json_type(data)}")
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        name = f"{where}.{f.name}" if where else f.name
        if f.name not in data:
            if required and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise FieldTypeError(name, "is missing")
            continue
        _check_value(hints[f.name], data[f.name], name, finite)
