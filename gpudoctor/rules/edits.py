"""The edits the rules' fixes are made of (``Fix.edits``), one builder per kind of change.

The runtime checks build them at the call sites a run recorded (``file:line``), the static
checks at the nodes the source shows (``file:line:col``); ``gpudoctor.rewrite`` makes the
change (the before/after of a finding, ``gpudoctor check --fix``), and never decides one:
what to set, and what makes it unsafe, is said here. docs/check.md lists the kinds.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpudoctor.model.findings import Edit, Fix, Location

#: DataLoader's parameters that a call may pass by position (torch.utils.data.DataLoader's signature):
#: a fix that sets one the call passes by position changes that argument in place.
DATALOADER_POSITIONS = (("batch_size", 1), ("shuffle", 2), ("sampler", 3), ("batch_sampler", 4), ("num_workers", 5),
                        ("collate_fn", 6), ("pin_memory", 7), ("drop_last", 8))


def source_text(value: object) -> str:
    """A Python value as source: ``4``, ``True``, ``'spawn'``."""
    return repr(value)


def call_args(file: str, line: int, target: str, changes: Mapping[str, object | None], *, col: int | None = None,
              positions: tuple[tuple[str, int], ...] = (), unless: tuple[str, ...] = (),
              requires: tuple[str, ...] = (), text: str = "") -> Edit:
    """Keyword arguments of the call ``target`` at ``file:line`` set (a value) or removed (None)."""
    args = tuple((k, None if v is None else source_text(v)) for k, v in changes.items())
    shown = ", ".join(f"{k}={v}" for k, v in args if v is not None)
    return Edit("call_args", file, line, col, target, args, positions, unless, requires,
                text=text or f"{shown} on the {target}() call at {file}:{line}")


def dataloader_args(file: str, line: int, changes: Mapping[str, object | None], *, col: int | None = None) -> Edit:
    """DataLoader arguments at its call: workers added only where a worker process can start (the
    DataLoader is built in a function or under ``if __name__ == "__main__":``).

    ``persistent_workers=True`` without a count of workers set beside it keeps every count the script
    accepts working (requirement "workers"): DataLoader raises on persistent workers with
    ``num_workers=0``, and a count the call computes (``num_workers=int(opt.workers)``, dcgan's
    ``--workers``) may be 0. The rewrite writes ``True`` beside a literal count above 0,
    ``persistent_workers=<count> > 0`` beside a count computed by an expression it may evaluate twice
    (names, attributes, arithmetic, ``int()``, ``min()`` …), and refuses the edit otherwise (a count of
    0, none passed, one from ``**kwargs`` or from a call that could give another value)."""
    workers = changes.get("num_workers")
    starts_workers = isinstance(workers, int) and not isinstance(workers, bool) and workers > 0
    keeps_workers = changes.get("persistent_workers") is True and not starts_workers
    requires = (*(("main-guard",) if starts_workers else ()), *(("workers",) if keeps_workers else ()))
    return call_args(file, line, "DataLoader", changes, col=col, positions=DATALOADER_POSITIONS,
                     requires=requires,
                     text=f"{', '.join(f'{k}={v!r}' for k, v in changes.items() if v is not None)} on the "
                          f"DataLoader at {file}:{line}")


def optimizer_args(file: str, line: int, cls: str, changes: Mapping[str, object | None], *,
                   col: int | None = None) -> Edit:
    """Constructor arguments of a ``torch.optim`` optimizer: ``fused=True`` is refused beside a true
    ``foreach`` or ``differentiable`` (torch raises on both)."""
    name = cls.rsplit(".", 1)[-1]
    fused = changes.get("fused") is True
    return call_args(file, line, name, changes, col=col,
                     unless=tuple(k for k in ("foreach", "differentiable") if fused and k not in changes),
                     text=f"{', '.join(f'{k}={v!r}' for k, v in changes.items() if v is not None)} on "
                          f"{name}() at {file}:{line}")


def non_blocking(file: str, line: int, method: str, *, col: int | None = None) -> Edit:
    """``non_blocking=True`` on a ``.to(...)`` / ``.cuda(...)`` copy (its third / second positional
    parameter when passed by position)."""
    name = method.lstrip(".")
    return call_args(file, line, name, {"non_blocking": True}, col=col,
                     positions=(("non_blocking", 2 if name == "to" else 1),),
                     text=f"non_blocking=True on the .{name}() copy at {file}:{line}")


def wrap(file: str, line: int, manager: str, *, loop: bool = True) -> Edit:
    """The loop around ``file:line`` (or the statement at it) put under ``with <manager>:``."""
    what = "loop" if loop else "statement"
    return Edit("wrap", file, line, target=what, code=manager, text=f"the {what} at {file}:{line} under `with {manager}:`")


def at_startup(file: str, line: int, statement: str) -> Edit:
    """``statement`` once, after the module's imports (``import torch`` added when it has none)."""
    return Edit("insert", file, line, code=statement, text=f"`{statement}` after the imports of {file}")


def assign(file: str, line: int, target: str, value: object) -> Edit:
    """``…<target> = value`` in place of the value assigned at ``file:line``."""
    return Edit("assign", file, line, target=target, code=source_text(value),
                text=f"{target} = {source_text(value)} at {file}:{line}")


#: The start of the note a finding carries when ``gpudoctor check --fix`` leaves its fix to the author.
FIX_LEFT = "not changed by `gpudoctor check --fix`"


def manual_note(reason: str) -> str:
    """The evidence note of a fix a rule leaves to the author (it would break the script there): why."""
    return f"{FIX_LEFT}: {reason}"


def left_to_author(fix: Fix, reason: str) -> Fix:
    """``fix`` as advice only, no edit: the change would break the script here (``reason``)."""
    return Fix(f"{fix.instruction} Left to you: {reason}.", fix.before, fix.after,
               illustration=f"not an automatic change: {reason}")


def edit_fix(instruction: str, before: str, after: str, *edits: Edit, source: Location | None = None,
             illustration: str = "") -> Fix:
    """A fix whose before/after the rewrite engine remakes from the source where it is at hand: until
    then ``before``/``after`` are the rule's own (an illustration unless ``source`` says they quote it)."""
    return Fix(instruction, before, after, edits=tuple(edits), source=source,
               illustration="" if source is not None else illustration)
