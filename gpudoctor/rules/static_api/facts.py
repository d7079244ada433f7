"""The records a static check reads: where a fact sits, the shared facts, and values.

The scanner (``gpudoctor.static``) turns each function of a script into these plain,
picklable records (no AST nodes); the static checks of the rules read them through a
``StaticContext``. A record's fields are the scanner's contract with every rule:

- ``Site``: where in the file (1-based line and column, and where it ends);
- ``Ctx``: where inside its function (the loops around it, the ``if`` tests guarding
  it, whether it runs only every N iterations, whether autograd is off);
- the shared facts every rule may read: ``Loop``, ``Marker`` (the training-step
  markers), ``LoaderFact`` (a DataLoader construction), ``Transfer`` (a batch copied to
  the device);
- ``Fact``: anything else, by kind: "cuda", "compile" and "jit" are recorded for every
  check, and a rule records its own kinds through its ``Watch`` (``scan.py``);
- ``Function``: one function of the project with its records, as checks see it;
- values: a *Sym* is what the source says a value is, before the project's argparse
  defaults and call sites resolve it (``gpudoctor.static.symbolic`` lists its forms);
  a ``Resolved`` is what it resolved to.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

Guard = tuple  # (Sym, polarity: bool): the enclosing ``if`` tests

# --------------------------------------------------------------------------- where


@dataclass(slots=True)
class Site:
    line: int
    col: int  # 1-based, in characters
    end_line: int
    end_col: int = 0  # 1-based column just past the node on end_line (0: unknown)


@dataclass(slots=True)
class Ctx:
    """Where a fact sits inside its function."""

    loops: tuple[int, ...] = ()  # enclosing loop ids, outermost first
    periodic: frozenset[int] = frozenset()  # loops it runs in only every N iterations (under `if i % N == 0:`)
    periodic_any: bool = False  # under such an `if` anywhere in the function
    guards: tuple[Guard, ...] = ()
    no_grad: bool = False  # inside `with torch.no_grad()` / inference_mode / set_grad_enabled(False)


# --------------------------------------------------------------------------- shared facts


@dataclass(slots=True)
class Marker:
    kind: str  # "backward" | "optimizer.step"
    site: Site
    ctx: Ctx


@dataclass(slots=True)
class Transfer:
    """``x.to(device)`` / ``x.cuda()`` of a batch-derived value."""

    text: str
    method: str  # ".to" | ".cuda"
    non_blocking: Sym | None
    site: Site
    ctx: Ctx
    statement: str = ""  # the whole source line, for the fix snippet


@dataclass(slots=True)
class LoaderFact:
    """A DataLoader construction."""

    site: Site
    ctx: Ctx
    kwargs: dict[str, Sym]
    stars: tuple[Sym, ...] = ()  # ``**kw`` arguments (dict literals or unknown)
    text: str = ""
    bindings: list[str] = field(default_factory=list)  # names it is bound to
    returned_index: int | None = None  # returned by its function (-1: alone, k: tuple position)
    in_memory: bool = False  # the dataset is a TensorDataset
    # worker_init_fn: (callee ref, bound positional Syms, bound keyword Syms) of functools.partial
    worker_init: tuple | None = None
    dataset: str = ""  # the dataset as a dotted name (``ds``, ``self.train_set``); "" for any other expression
    # what a worker started by spawn / forkserver could not unpickle ("`collate_fn` is a lambda"; "": nothing seen)
    unpicklable: str = ""


@dataclass(slots=True)
class Fact:
    """Anything else a check asks about: kind, where, and a value when it has one.

    Kinds every check may read: "cuda" (the program uses CUDA; at most two per function
    are kept; ``value``: the device it names, when a setting decides it), "compile"
    (``torch.compile``), "jit" (TorchScript), "framework_eval" (an evaluation step method a
    framework runs with autograd off, ``extra``: the framework), "trainer" (a framework trainer
    that runs the training loop itself, ``extra``: the framework). A rule's ``Watch``
    records its own kinds (GD403's "conv", GD502's "empty_cache" …); ``data`` carries
    what else its hook kept (plain, picklable values).
    """

    kind: str
    site: Site
    ctx: Ctx
    value: Sym | None = None
    text: str = ""
    extra: str = ""
    data: Any = None


@dataclass(slots=True)
class Loop:
    id: int
    site: Site
    ctx: Ctx  # the loop's own context (its parent loops, guards, no_grad)
    text: str  # "for images, labels in loader:"
    mentions: frozenset[str] = frozenset()  # names and attributes used anywhere in its body
    target_is_batch: bool = False  # iterates something other than range()/parameters()
    iter_names: frozenset[str] = frozenset()  # names in the iterated expression (`enumerate(train_loader)`)
    # the framework whose loop this stands for ("Lightning" …): its site is the step method's `def`
    # (Lightning's training_step), run once per training step; "" for a loop of the source
    framework: str = ""
    # what its body may change in place: the dotted receivers of attribute assignments and method calls
    # (`ds.epoch = epoch`, `loader.dataset.set_epoch(epoch)` → "ds", "loader.dataset")
    changes: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True, eq=False)
class Function:
    """One function of the project (or a module's top level, fid ``"<module>"``), as checks see it."""

    gid: str  # "<module path>::<function id>": the key of the project's call graph
    path: str  # the module's absolute path
    file: str  # the module as shown in findings
    fid: str  # qualified name in its module: "train", "Trainer.fit", "<module>"
    name: str
    line: int
    loops: list[Loop]
    markers: list[Marker]
    loaders: list[LoaderFact]
    transfers: list[Transfer]
    facts: list[Fact]
    no_grad_decorated: bool  # under @torch.no_grad() / @torch.inference_mode()
    lines: Mapping[int, str]  # the module's source lines kept for quoting (the lines of its facts)

    def of_kind(self, kind: str) -> list[Fact]:
        """Its facts of one kind, in source order."""
        return [f for f in self.facts if f.kind == kind]


# --------------------------------------------------------------------------- values

Sym = tuple

UNKNOWN: Sym = ("?",)
POSITIVE: Sym = ("pos",)


def const(value: Any) -> Sym:
    """A value the source fixes."""
    return ("k", value)


def is_const(sym: Sym) -> bool:
    """Whether the source fixes this value (a literal)."""
    return bool(sym) and sym[0] == "k"


def const_value(sym: Sym) -> Any:
    """The value of a literal Sym (``is_const``), else None."""
    return sym[1] if is_const(sym) else None


def sym_in(value: Sym, options: tuple, negate: bool = False) -> Sym:
    """``value in options`` (``not in`` with ``negate``), resolved later."""
    return ("cmp", ("not in",) if negate else ("in",), (value, const(options)))


def sym_any(values: tuple[Sym, ...]) -> Sym:
    """``a or b or …``, resolved later."""
    return ("or", values)


class _Marker:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


#: Resolution results that are not a Python value.
UNKNOWN_VALUE = _Marker("<unknown>")
POSITIVE_VALUE = _Marker("<positive>")
#: ``x.device``: the device some tensor is on, wherever that is (a device that follows, never one chosen).
TENSOR_DEVICE = _Marker("<a tensor's device>")


@dataclass(slots=True)
class Resolved:
    """The value of a Sym and the argparse flags it came from."""

    value: Any
    origins: list[str] = field(default_factory=list)  # "`--workers` (default 0)"

    @property
    def known(self) -> bool:
        return not isinstance(self.value, _Marker)

    def truth(self) -> bool | None:
        """True / False, or None when it cannot be told."""
        if self.value is POSITIVE_VALUE:
            return True
        if isinstance(self.value, _Marker):
            return None
        try:
            return bool(self.value)
        except Exception:  # noqa: BLE001 - any object whose truth is odd
            return None

    def origin_text(self) -> str:
        return ", ".join(dict.fromkeys(self.origins))
