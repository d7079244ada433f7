"""What the scanner keeps of one module: plain, picklable records (no AST nodes).

A module is scanned once, possibly in a worker process; the linker joins the
summaries of every module of the project (calls across files, argparse defaults
defined elsewhere). The records the rules' static checks read (``Site``, ``Ctx``,
``Loop``, ``LoaderFact``, ``Fact`` …) are defined in ``gpudoctor.rules.static_api.facts``;
these are the scanner's and the linker's own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpudoctor.rules.static_api.facts import (
    Ctx,
    Fact,
    Guard,
    LoaderFact,
    Loop,
    Marker,
    Site,
    Sym,
    Transfer,
)
from gpudoctor.static.symbolic import ArgDef

__all__ = [
    "Call", "ClassInfo", "Ctx", "Fact", "FileError", "FuncSummary", "Guard", "LoaderFact", "Loop", "Marker",
    "ModuleSummary", "Site", "Transfer",
]


@dataclass(slots=True)
class Call:
    """A call whose callee may be a function of the project."""

    callee: tuple  # ("name", n) | ("attr", "mod.f") | ("self", m) | ("inst", class_ref, m)
    site: Site
    ctx: Ctx
    args: tuple[Sym, ...] = ()
    kwargs: tuple[tuple[str, Sym], ...] = ()
    assigned: tuple[str | None, ...] = ()  # names bound to the result (tuple unpacking: one per element)


@dataclass(slots=True)
class FuncSummary:
    fid: str  # qualified name in its module: "train", "Trainer.fit", "<module>"
    name: str
    cls: str | None
    line: int
    params: tuple[str, ...] = ()
    param_defaults: dict[str, Sym] = field(default_factory=dict)
    no_grad_decorated: bool = False
    framework_step: bool = False  # a step method a framework runs once per training step (Lightning's training_step)
    calls: list[Call] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    transfers: list[Transfer] = field(default_factory=list)
    loaders: list[LoaderFact] = field(default_factory=list)
    facts: list[Fact] = field(default_factory=list)  # shared kinds and the kinds the rules' Watches record
    loops: list[Loop] = field(default_factory=list)
    nested: dict[str, str] = field(default_factory=dict)  # local def name -> fid


@dataclass(slots=True)
class ClassInfo:
    name: str
    bases: tuple[str, ...]  # dotted, as written
    methods: dict[str, str]  # method name -> fid
    framework: str = ""  # the framework that runs its step methods ("lightning", "transformers"), else ""


@dataclass(slots=True)
class ModuleSummary:
    path: str  # absolute
    display: str  # as shown in findings
    modname: str  # dotted name, "" when unknown
    imports: dict[str, tuple[str, str]] = field(default_factory=dict)  # local name -> (module path, attr or "")
    functions: dict[str, FuncSummary] = field(default_factory=dict)
    classes: dict[str, ClassInfo] = field(default_factory=dict)
    constants: dict[str, Sym] = field(default_factory=dict)
    attrs: dict[str, Sym] = field(default_factory=dict)  # "Class.name" -> what its methods assign to self.name
    argdefs: list[ArgDef] = field(default_factory=list)
    arg_overrides: dict[str, Sym] = field(default_factory=dict)  # parser.set_defaults(...)
    suppress: dict[int, frozenset[str]] = field(default_factory=dict)  # line -> codes ("*": all)
    lines: dict[int, str] = field(default_factory=dict)  # source lines quoted in findings


@dataclass(slots=True)
class FileError:
    path: str
    message: str  # one line, names the file
    internal: bool = False  # a bug in gpudoctor rather than a problem of the file
