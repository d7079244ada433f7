"""What the scanner keeps of one module: plain, picklable records (no AST nodes).

A module is scanned once, possibly in a worker process; the linker joins the
summaries of every module of the project (calls across files, argparse defaults
defined elsewhere) and the checks read only these records.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpudoctor.static.symbolic import ArgDef, Sym

Guard = tuple  # (Sym, polarity: bool): the enclosing ``if`` tests


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
class Marker:
    kind: str  # "backward" | "optimizer.step"
    site: Site
    ctx: Ctx


@dataclass(slots=True)
class Sync:
    code: str  # GD102 (blocking scalar read) | GD303 (device -> host copy)
    pattern: str  # ".item()", ".cpu()", "print(<tensor>)", …
    text: str  # the expression, as written
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


@dataclass(slots=True)
class OptimizerFact:
    cls: str  # "AdamW"
    site: Site
    ctx: Ctx
    kwargs: dict[str, Sym]
    star: bool = False
    text: str = ""


@dataclass(slots=True)
class Fact:
    """Anything else a check asks about: kind, where, and a value when it has one.

    kinds: "cuda", "autocast", "autocast_deprecated", "scaler_deprecated", "low_precision",
    "conv", "cudnn_benchmark", "cudnn_deterministic", "deterministic_algorithms", "tf32",
    "data_parallel", "ddp", "compile", "jit", "empty_cache", "pin_memory_call".
    """

    kind: str
    site: Site
    ctx: Ctx
    value: Sym | None = None
    text: str = ""
    extra: str = ""


@dataclass(slots=True)
class Loop:
    id: int
    site: Site
    ctx: Ctx  # the loop's own context (its parent loops, guards, no_grad)
    text: str  # "for images, labels in loader:"
    mentions: frozenset[str] = frozenset()  # names and attributes used anywhere in its body
    model_calls: frozenset[str] = frozenset()  # dotted callees that look like models, called in it
    eval_before: frozenset[str] = frozenset()  # receivers of `.eval()` in effect when it starts
    target_is_batch: bool = False  # iterates something other than range()/parameters()
    iter_names: frozenset[str] = frozenset()  # names in the iterated expression (`enumerate(train_loader)`)


@dataclass(slots=True)
class FuncSummary:
    fid: str  # qualified name in its module: "train", "Trainer.fit", "<module>"
    name: str
    cls: str | None
    line: int
    params: tuple[str, ...] = ()
    param_defaults: dict[str, Sym] = field(default_factory=dict)
    no_grad_decorated: bool = False
    framework_step: bool = False  # Lightning's training_step
    calls: list[Call] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    syncs: list[Sync] = field(default_factory=list)
    transfers: list[Transfer] = field(default_factory=list)
    loaders: list[LoaderFact] = field(default_factory=list)
    optimizers: list[OptimizerFact] = field(default_factory=list)
    facts: list[Fact] = field(default_factory=list)
    loops: list[Loop] = field(default_factory=list)
    nested: dict[str, str] = field(default_factory=dict)  # local def name -> fid


@dataclass(slots=True)
class ClassInfo:
    name: str
    bases: tuple[str, ...]  # dotted, as written
    methods: dict[str, str]  # method name -> fid


@dataclass(slots=True)
class ModuleSummary:
    path: str  # absolute
    display: str  # as shown in findings
    modname: str  # dotted name, "" when unknown
    imports: dict[str, tuple[str, str]] = field(default_factory=dict)  # local name -> (module path, attr or "")
    functions: dict[str, FuncSummary] = field(default_factory=dict)
    classes: dict[str, ClassInfo] = field(default_factory=dict)
    constants: dict[str, Sym] = field(default_factory=dict)
    argdefs: list[ArgDef] = field(default_factory=list)
    arg_overrides: dict[str, Sym] = field(default_factory=dict)  # parser.set_defaults(...)
    suppress: dict[int, frozenset[str]] = field(default_factory=dict)  # line -> codes ("*": all)
    lines: dict[int, str] = field(default_factory=dict)  # source lines quoted in findings


@dataclass(slots=True)
class FileError:
    path: str
    message: str  # one line, names the file
    internal: bool = False  # a bug in gpudoctor rather than a problem of the file
