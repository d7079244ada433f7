"""Symbolic values: what the source says a setting is, resolved once the whole project is read.

The scanner turns an expression such as ``4 if args.fixed else 0`` into a small
tree of tuples (a *Sym*) instead of a value, because the argparse parser that
gives ``args.fixed`` its default may live in another file. The linker resolves
the trees with the project's argparse table (`resolve`).

Sym forms (plain tuples, so summaries pickle cheaply between processes)::

    ("k", value)                 a constant (int, float, str, bool, None)
    ("arg", dest)                an argparse attribute, ``args.workers``
    ("cuda",)                    ``torch.cuda.is_available()``: judged True (see below)
    ("pos",)                     a number known to be > 0 (``os.cpu_count()``)
    ("?",)                       unknown
    ("if", test, a, b)           ``a if test else b``
    ("not", x) / ("and", xs) / ("or", xs)
    ("cmp", ops, operands)       a comparison chain
    ("bin", op, a, b)            arithmetic
    ("call", name, args)         min / max / int / float / bool / str of Syms
    ("imp", module_path, name)   a constant imported from a project module
    ("dict", ((key, sym), ...))  a dict literal (``**kwargs`` of a DataLoader)
    ("merge", a, b)              ``a.update(b)`` of two dicts
    ("devtype", x)               ``torch.device(x).type``
    ("devof",)                   ``x.device``: the device of a tensor, wherever that is (``TENSOR_DEVICE``)
    ("param", func_id, name, index, default)  a parameter, resolved from the call sites
    ("attr", module_path, class, name)  ``self.name`` read in a method: what the class assigns it

Judging assumptions, documented for users: a script is judged as it runs with its
argparse defaults on a machine with a CUDA GPU (that is where its GPU performance
matters), so ``torch.cuda.is_available()`` is taken as True.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpudoctor.rules.static_api.facts import (
    POSITIVE,
    POSITIVE_VALUE,
    TENSOR_DEVICE,
    UNKNOWN,
    UNKNOWN_VALUE,
    Resolved,
    Sym,
    _Marker,
    const,
)

__all__ = [
    "POSITIVE", "POSITIVE_VALUE", "UNKNOWN", "UNKNOWN_VALUE", "ArgDef", "Resolved", "Resolver", "Sym", "const",
    "sym_dict_items",
]


@dataclass(frozen=True, slots=True)
class ArgDef:
    """One ``parser.add_argument`` call."""

    dest: str
    flag: str  # "--workers" (or the positional name)
    default: Sym
    file: str
    line: int


_CMP: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "in": lambda a, b: a in b,
    "not in": lambda a, b: a not in b,
    "is": operator.is_,
    "is not": operator.is_not,
}
_BIN: dict[str, Callable[[Any, Any], Any]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "//": operator.floordiv,
    "/": operator.truediv,
    "%": operator.mod,
}
_SAFE_TYPES = (int, float, str, bool, type(None), tuple)
#: Distinct (sym, file) evaluations one resolve may make before the rest is unknown: a value a
#: script's reader could follow takes a few dozen.
MAX_EVALS = 5000


class Resolver:
    """Resolves Syms against the project: argparse defaults, imported constants, call sites.

    ``args`` maps an argparse dest to its definitions (the one in the same file wins);
    ``constant`` looks up ``("imp", path, name)``; ``param`` gives the Syms a parameter
    takes at its call sites, each with the file it is written in; ``attr`` gives the Sym an
    instance attribute (``self.ngpu``) is assigned in its class, and the file.
    """

    def __init__(
        self,
        args: Mapping[str, list[ArgDef]],
        constant: Callable[[str, str], Sym | None] | None = None,
        param: Callable[[Sym], list[tuple[Sym, str]]] | None = None,
        attr: Callable[[Sym], tuple[Sym, str] | None] | None = None,
    ) -> None:
        self.args = args
        self.constant = constant
        self.param = param
        self.attr = attr
        # one resolve's values by (sym, file): a parameter takes the values of its call sites, whose
        # arguments are parameters in turn; without it a chain of helpers costs sites**depth
        self._memo: dict[tuple[Sym, str], Any] = {}
        self._evals = 0
        self._active = 0

    def resolve(self, sym: Sym, file: str = "", depth: int = 0) -> Resolved:
        origins: list[str] = []
        if not self._active:
            self._memo.clear()
            self._evals = 0
        self._active += 1
        try:
            value = self._eval(sym, file, origins, depth)
        except Exception:  # noqa: BLE001 - user values may not support an operation
            value = UNKNOWN_VALUE
        finally:
            self._active -= 1
        return Resolved(value, origins)

    def _eval(self, sym: Sym, file: str, origins: list[str], depth: int) -> Any:
        """``_value`` once per (sym, file) in one resolve, and at most MAX_EVALS of them: past it, unknown."""
        try:
            key = (sym, file)
            if key in self._memo:
                return self._memo[key]
        except TypeError:  # an unhashable part: not remembered
            return self._value(sym, file, origins, depth)
        self._evals += 1
        if self._evals > MAX_EVALS:
            return UNKNOWN_VALUE
        self._memo[key] = UNKNOWN_VALUE  # a cycle (a parameter passed back to itself) is unknown
        value = self._value(sym, file, origins, depth)
        self._memo[key] = value
        return value

    def arg_default(self, dest: str, file: str) -> ArgDef | None:
        defs = self.args.get(dest)
        if not defs:
            return None
        for d in defs:
            if d.file == file:
                return d
        return defs[0]

    def _value(self, sym: Sym, file: str, origins: list[str], depth: int) -> Any:  # noqa: C901
        if depth > 40 or not sym:
            return UNKNOWN_VALUE
        kind = sym[0]
        ev = self._eval
        if kind == "k":
            return sym[1]
        if kind == "pos":
            return POSITIVE_VALUE
        if kind == "cuda":
            return True
        if kind == "arg":
            d = self.arg_default(sym[1], file)
            if d is None:
                return UNKNOWN_VALUE
            value = ev(d.default, d.file, origins, depth + 1)
            shown = "unknown" if not _plain(value) else repr(value)
            origins.append(f"`{d.flag}` (default {shown})")
            return value
        if kind == "imp":
            if self.constant is None:
                return UNKNOWN_VALUE
            target = self.constant(sym[1], sym[2])
            return UNKNOWN_VALUE if target is None else ev(target, sym[1], origins, depth + 1)
        if kind == "attr":
            if self.attr is None:
                return UNKNOWN_VALUE
            found = self.attr(sym)
            return UNKNOWN_VALUE if found is None else ev(found[0], found[1], origins, depth + 1)
        if kind == "param":
            if self.param is None:
                return UNKNOWN_VALUE
            values = [ev(s, where, origins, depth + 1) for s, where in self.param(sym)]
            if not values:
                return UNKNOWN_VALUE
            first = values[0]
            if all(_plain(v) and v == first and type(v) is type(first) for v in values):
                return first
            return UNKNOWN_VALUE
        if kind == "if":
            t = _truth(ev(sym[1], file, origins, depth + 1))
            if t is None:
                a = ev(sym[2], file, origins, depth + 1)
                b = ev(sym[3], file, origins, depth + 1)
                if _plain(a) and _plain(b) and a == b:
                    return a
                if _positive(a) and _positive(b):
                    return POSITIVE_VALUE
                return UNKNOWN_VALUE
            return ev(sym[2] if t else sym[3], file, origins, depth + 1)
        if kind == "not":
            t = _truth(ev(sym[1], file, origins, depth + 1))
            return UNKNOWN_VALUE if t is None else (not t)
        if kind in ("and", "or"):
            # a part that decides it decides it, even after a part that cannot be told
            # (`x.is_cuda and self.ngpu > 1` with --ngpu 1 is False)
            last: Any = UNKNOWN_VALUE
            unknown = False
            for part in sym[1]:
                v = ev(part, file, origins, depth + 1)
                t = _truth(v)
                if t is None:
                    unknown = True
                    continue
                if kind == "and" and not t:
                    return v
                if kind == "or" and t:
                    return v
                last = v
            return UNKNOWN_VALUE if unknown else last
        if kind == "cmp":
            ops, operands = sym[1], sym[2]
            values = [ev(o, file, origins, depth + 1) for o in operands]
            if not all(_plain(v) for v in values):
                return UNKNOWN_VALUE
            for op, a, b in zip(ops, values, values[1:], strict=False):
                fn = _CMP.get(op)
                if fn is None:
                    return UNKNOWN_VALUE
                if not fn(a, b):
                    return False
            return True
        if kind == "bin":
            fn = _BIN.get(sym[1])
            a = ev(sym[2], file, origins, depth + 1)
            b = ev(sym[3], file, origins, depth + 1)
            if fn is None or not (_plain(a) and _plain(b)):
                if sym[1] in ("+", "*") and _positive(a) and _positive(b):
                    return POSITIVE_VALUE
                return UNKNOWN_VALUE
            if isinstance(a, str) and isinstance(b, int) and sym[1] == "*" and b > 10_000:
                return UNKNOWN_VALUE
            return fn(a, b)
        if kind == "call":
            name, parts = sym[1], sym[2]
            values = [ev(p, file, origins, depth + 1) for p in parts]
            if name == "max":
                if any(_plain(v) and isinstance(v, (int, float)) and v > 0 for v in values):
                    known = [v for v in values if _plain(v)]
                    if len(known) == len(values):
                        return max(known)
                    return POSITIVE_VALUE
            if not all(_plain(v) for v in values):
                if name == "min" and values and all(_positive(v) for v in values):
                    return POSITIVE_VALUE
                if name in ("int", "bool", "float") and len(values) == 1 and values[0] is POSITIVE_VALUE:
                    return True if name == "bool" else POSITIVE_VALUE
                return UNKNOWN_VALUE
            fn2 = {"min": min, "max": max, "int": int, "float": float, "bool": bool, "str": str}.get(name)
            if fn2 is None or not values:
                return UNKNOWN_VALUE
            return fn2(*values)
        if kind == "dict":
            out: dict[Any, Any] = {}
            for key, value_sym in sym[1]:
                out[key] = value_sym  # values stay symbolic: the caller resolves the keys it needs
            return _SymDict(out)
        if kind == "merge":
            a = ev(sym[1], file, origins, depth + 1)
            b = ev(sym[2], file, origins, depth + 1)
            if isinstance(a, _SymDict) and isinstance(b, _SymDict):
                merged = _SymDict(a)
                merged.update(b)
                return merged
            return UNKNOWN_VALUE
        if kind == "devof":
            return TENSOR_DEVICE
        if kind == "devtype":
            v = ev(sym[1], file, origins, depth + 1)
            if isinstance(v, str):
                return v.split(":", 1)[0]
            return UNKNOWN_VALUE
        return UNKNOWN_VALUE


class _SymDict(dict):
    """A dict literal whose values are still Syms."""


def _plain(value: Any) -> bool:
    return isinstance(value, _SAFE_TYPES) and not isinstance(value, _Marker)


def _positive(value: Any) -> bool:
    if value is POSITIVE_VALUE:
        return True
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def _truth(value: Any) -> bool | None:
    if value is UNKNOWN_VALUE:
        return None
    if value is POSITIVE_VALUE:
        return True
    if isinstance(value, _SymDict):
        return bool(value)
    if _plain(value):
        return bool(value)
    return None


def sym_dict_items(resolver: Resolver, sym: Sym, file: str) -> tuple[dict[str, Sym] | None, list[str]]:
    """The entries of a Sym that resolves to a dict literal (``**kwargs``), or None."""
    origins: list[str] = []
    try:
        value = resolver._eval(sym, file, origins, 0)
    except Exception:  # noqa: BLE001
        return None, origins
    if isinstance(value, _SymDict):
        return {str(k): v for k, v in value.items()}, origins
    return None, origins
