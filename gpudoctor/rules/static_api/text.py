"""Text for static findings: ``file:line``, how a setting was found, and fix snippets.

The before/after snippets of a fix quote the user's source (``StaticContext.source``)
and change it as little as possible: ``with_kwargs`` sets or removes keyword
arguments of the call, ``sync_after`` moves a per-step host read under
``if step % 100 == 0:``, with the loop's own step counter (``StaticContext.step_counter``).
A snippet uses only names the code has, or says where a new one comes from.
"""

from __future__ import annotations

import ast
import re
import textwrap

from gpudoctor.model.findings import Location
from gpudoctor.rules.static_api.facts import POSITIVE_VALUE, Resolved


def at(loc: Location) -> str:
    """``file:line`` for messages (the finding's location carries the column)."""
    return f"{loc.file}:{loc.line}"


def shown(state: str, r: Resolved | None, default: str) -> str:
    """A DataLoader setting for the checklist: ``4``, ``0 (default)``, ``2 (from `--workers` (default 2))`` …"""
    if state == "missing":
        return f"{default} (default)"
    if state == "unknown" or r is None:
        return "set through **kwargs"
    if r.value is POSITIVE_VALUE:
        return "more than 0 (counted at run time)"  # os.cpu_count() - 1 …
    if not r.known:
        return "decided at run time"
    text = repr(r.value)
    return f"{text} (from {r.origin_text()})" if r.origins else text


def how(name: str, state: str, r: Resolved | None, default: str) -> str:
    """How a setting was found, for a message: ``num_workers not set: default 0``, ``num_workers=0`` …"""
    if state == "missing":
        return f"{name} not set: default {default}"
    if r is not None and r.origins:
        return f"{name} comes from {r.origin_text()}"
    value = r.value if r is not None else default
    return f"{name}={value!r}"


def origin_note(name: str, r: Resolved | None) -> str:
    """``num_workers comes from `--workers` (default 0)``, or "" when the source fixes the value."""
    if r is None or not r.origins:
        return ""
    return f"{name} comes from {r.origin_text()}"


def arg_fix(r: Resolved | None, value: str) -> tuple[str, str] | None:
    """(the command-line flag a value comes from, the value to give it), when a flag decides it."""
    if r is None or not r.origins:
        return None
    flag = r.origins[0].split("`")[1] if "`" in r.origins[0] else ""
    return (f"`{flag}`", value) if flag else None


def dedent(text: str) -> str:
    """Source lines quoted from a file, re-indented as a snippet (continuation lines by four spaces)."""
    lines = text.split("\n")
    indents = [len(x) - len(x.lstrip()) for x in lines if x.strip()]
    cut = min(indents[1:], default=0) if len(lines) > 1 else 0
    first = lines[0].lstrip()
    rest = [x[min(cut, len(x) - len(x.lstrip())):] if x.strip() else x for x in lines[1:]]
    if rest:
        base = min((len(x) - len(x.lstrip()) for x in rest if x.strip()), default=0)
        rest = ["    " + x[base:] if x.strip() else x for x in rest]
        if rest and rest[-1].strip().startswith(")"):
            rest[-1] = rest[-1].strip()
    return "\n".join([first, *rest])


def indent(text: str) -> str:
    """A snippet one level deeper (under a new ``with``)."""
    return "\n".join("    " + x if x.strip() else x for x in text.split("\n"))


def with_kwargs(source: str, changes: dict[str, str | None]) -> str:
    """The call in ``source`` with keyword arguments set (value) or removed (None)."""
    out = source
    for name, value in changes.items():
        pattern = re.compile(rf"(\b{name}\s*=\s*)([^,)\n]+)")
        if pattern.search(out):
            if value is None:
                out = re.sub(rf",?\s*\b{name}\s*=\s*[^,)\n]+", "", out, count=1)
            else:
                out = pattern.sub(lambda m, v=value: m.group(1) + v, out, count=1)
        elif value is not None:
            idx = call_closing_paren(out)
            if idx is None:
                continue
            head = out[:idx].rstrip()
            sep = "" if head.endswith("(") else (" " if head.endswith(",") else ", ")
            out = head + sep + f"{name}={value}" + out[idx:]
    return out


def call_closing_paren(source: str) -> int | None:
    """Index of the parenthesis that closes the DataLoader call in ``source`` (a line or a few of
    the user's code), else its first call; parsed, so that ``for (x, y) in DataLoader(ds):`` gets
    the call, not the tuple. Source that does not parse falls back to the first bracket."""
    text = textwrap.dedent(source)
    margin = next((len(ln) - len(ln.lstrip()) for ln in source.splitlines() if ln.strip()), 0)
    tree = None
    for attempt in (text, text + "\n    pass"):  # a for/with/if header without its body
        try:
            tree = ast.parse(attempt)
            break
        except SyntaxError:
            continue
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)] if tree is not None else []
    if not calls:
        return closing_paren(source)

    def name(call: ast.Call) -> str:
        f = call.func
        return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""

    loaders = [c for c in calls if "DataLoader" in name(c)]
    call = min(loaders or calls, key=lambda c: (c.lineno, c.col_offset))
    lines = source.splitlines(keepends=True)
    if call.end_lineno is None or call.end_col_offset is None or call.end_lineno > len(lines):
        return closing_paren(source)
    line = lines[call.end_lineno - 1]
    shift = margin if line.strip() else 0
    idx = sum(len(ln) for ln in lines[: call.end_lineno - 1]) + shift + call.end_col_offset - 1
    return idx if 0 <= idx < len(source) and source[idx] == ")" else closing_paren(source)


def closing_paren(source: str) -> int | None:
    """Index of the parenthesis that closes the first call in ``source``."""
    depth = 0
    started = False
    quote = ""
    i = 0
    while i < len(source):
        ch = source[i]
        if quote:
            if ch == "\\":
                i += 2
                continue
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#":
            nl = source.find("\n", i)
            if nl < 0:
                break
            i = nl
            continue
        elif ch in "([{":
            depth += 1
            started = True
        elif ch in ")]}":
            depth -= 1
            if started and depth == 0:
                return i
        i += 1
    return None


#: A statement that only shows a value (print, a logger, TensorBoard, a progress bar): under ``if step % 100
#: == 0:`` it shows the same values, less often.
_SHOWS = re.compile(r"^(print|[\w.]*\.(info|debug|warning|log|add_scalar|add_scalars|set_postfix|set_description|"
                    r"write))\(")
#: ``losses.update(loss.item(), n)``: a meter's running sum (pytorch/examples' AverageMeter, torchmetrics'
#: ``update``, torchnet's ``add``), which sums what it is given with ``+=``.
_METER = re.compile(r"^[\w.\[\]]+\.(update|add)\(")


def _meter_update(line: str, pattern: str, text: str) -> bool:
    return pattern == ".item()" and text.endswith(".item()") and bool(_METER.match(line.strip())) and text in line


def sync_after(line: str, pattern: str, text: str, counter: str | None = None) -> str:
    """The fix of a per-step host read (GD102) or copy (GD303): accumulate on the device, or read every
    100 steps, counted by ``counter`` (the loop's step counter; None: the snippet adds one). What a fix
    moved under the ``if`` changes in what the script prints is ``sync_change``'s to say."""
    if not line:
        return ""
    if pattern == ".item()" and "+=" in line and text.endswith(".item()"):
        receiver = text[: -len(".item()")]
        return line.replace(text, f"{receiver}.detach()") + "  # .item() once per epoch / every N steps"
    if _meter_update(line, pattern, text):  # the meter keeps every batch, summed on the device
        receiver = text[: -len(".item()")]
        return line.replace(text, f"{receiver}.detach()") + "  # summed on the device, read when it prints"
    if counter is None:
        return ("# count the steps: `step = 0` before the loop, `step += 1` in it\n"
                "if step % 100 == 0:  # not every step\n    " + line)
    return f"if {counter} % 100 == 0:  # not every step\n    " + line


def sync_change(line: str, pattern: str, text: str) -> str:
    """What ``sync_after``'s after changes in what the script computes and prints, in a sentence for the
    fix's instruction; "" when it keeps every value (a sum on the device). Moving a statement under
    ``if step % 100 == 0:`` runs it every 100th step: a print shows the same values less often, but a
    statement that records the value (a meter, a list, a running sum) then records every 100th batch."""
    stripped = line.strip()
    if not stripped or (pattern == ".item()" and "+=" in line and text.endswith(".item()")):
        return ""
    if _meter_update(line, pattern, text):
        meter = stripped.split("(", 1)[0]
        return (f"`{meter}(…)` is given the tensor (`{text[: -len('.item()')]}.detach()`), so that its running "
                "average still counts every batch, summed on the device, and the GPU is read only when it prints "
                "(a meter that sums with `+=`, as pytorch/examples' AverageMeter does, and as it already does for "
                "the accuracy tensors); a meter that needs a float is better given `.item()` every N steps, which "
                "changes its average")
    if _SHOWS.match(stripped):
        return f"under the `if`, `{stripped}` shows every 100th step's value only: the same values, less often"
    return (f"under the `if`, `{stripped}` runs every 100th step only: what it records (a sum, an average, a list) "
            "then counts every 100th batch, and what the script prints from it changes; to keep every batch, keep "
            "the value on the device where it is accumulated (`.detach()`, not `.item()`) and read it when printed")


# --------------------------------------------------------------------------- checklist reasons

NO_CUDA = "no CUDA device in the checked source (with its argparse defaults)"
NO_LOADER = "no DataLoader in the checked source"
NO_TRAINING_LOOP = "no training loop in the checked source"


def first_of(locs) -> str:
    """The first ``file:line`` of several, "and N more" after it ("" for none)."""
    items = [f"{x.file}:{x.line}" if hasattr(x, "line") else str(x) for x in locs]
    if not items:
        return ""
    return items[0] + (f" and {len(items) - 1} more" if len(items) > 1 else "")
