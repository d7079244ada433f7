"""The Markdown report: a review to paste into a pull request.

Where the step goes first (the account's headline, its parts as one table, the top
actions with their exclusive gains and the step time after each), then the
checklist as task-list items (``- [x]`` applied: evidence shows it in use, ``- [ ]``
recommended with evidence and gain, then *no problem seen*, *not applicable* and
*not measurable here* with the reason), the findings with fix, gain, evidence and
code, the step breakdown of the other traces, the ranks and the environment. GitHub caps a comment at 65,536 characters: the document is built
from whole blocks (a finding, a checklist item, a table) and blocks that do not fit
are left out with a note saying what was left out, so a table is never cut in half.

Untrusted text (kernel names, paths, messages, settings) is escaped: Markdown and
HTML punctuation is backslash-escaped in text, code spans and fences are chosen
longer than any backtick run inside them, and pipes are escaped in table cells.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from dataclasses import dataclass

from gpudoctor.model import ChecklistStatus, Finding, Report, TraceMetrics
from gpudoctor.report import _fmt as f

GITHUB_COMMENT_LIMIT = 65_536
MAX_TABLE_ROWS = 64
_NOTE_RESERVE = 600  # room kept for the truncation note

# Markdown/HTML punctuation; "_" only where it could open or close emphasis (not inside a word).
_SPECIAL = re.compile(r"[\\`*\[\]<>|~&@#$]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
_SEVERITY_MARK = {"error": "🔴", "warning": "🟠", "info": "🔵"}


def esc(text: object) -> str:
    """Inline text: one line, Markdown/HTML punctuation backslash-escaped (also ``@`` and ``#``)."""
    return _SPECIAL.sub(lambda m: "\\" + m.group(), f.one_line(text))


def rich(text: object) -> str:
    """Like ``esc``, but `backtick` pairs in the text become code spans."""
    return "".join(code(part) if is_code else _SPECIAL.sub(lambda m: "\\" + m.group(), part) for is_code, part in f.code_parts(text))


def code(text: object, *, table: bool = False) -> str:
    """An inline code span that holds ``text`` literally (longest backtick run + 1)."""
    s = f.one_line(str(text))
    runs = [len(r) for r in re.findall(r"`+", s)]
    ticks = "`" * ((max(runs) + 1) if runs else 1)
    if s.startswith("`") or s.endswith("`") or (s.startswith(" ") and s.endswith(" ")):
        s = f" {s} "
    if table:
        s = s.replace("|", "\\|")
    return f"{ticks}{s}{ticks}" if s else ""


def fence(text: str, lang: str = "") -> str:
    """A fenced code block whose fence is longer than any backtick run in ``text``."""
    runs = [len(r) for r in re.findall(r"`+", text)]
    ticks = "`" * max(3, (max(runs) + 1) if runs else 3)
    return f"{ticks}{lang}\n{text.rstrip()}\n{ticks}"


def cell(text: object) -> str:
    """Escaped text for a table cell (pipes escaped too)."""
    return esc(text) or " "


def table(header: list[str], rows: list[list[str]], align: list[str] | None = None) -> str:
    """A GitHub table; cells must already be escaped (``cell`` / ``code(table=True)``)."""
    align = align or ["l"] * len(header)
    sep = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(sep) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _length(text: str) -> int:
    """Length as GitHub counts it, conservatively (UTF-16 code units)."""
    return len(text.encode("utf-16-le")) // 2


@dataclass
class _Block:
    text: str
    priority: int  # 0 always kept, then 1, 2 … while they fit
    kind: str = ""  # "finding", "checklist item", "section": what the note counts


def _where(loc, base: str | None = None) -> str:
    """``[`train.py:31`](train.py#L31)``: the place as a link a pull request resolves, relative to
    ``base`` (the folder the script ran in) or else the working directory when under it (absolute
    paths are not links: they name this machine)."""
    path = f.rel_path(loc.file, base) if base else loc.file
    path = f.rel_path(path)
    text = code(f"{path}:{loc.line}")
    if os.path.isabs(path) or not loc.line:
        return text
    return f"[{text}]({urllib.parse.quote(path.replace(os.sep, '/'))}#L{loc.line})"


def _finding_block(n: int, fd: Finding, base: str | None = None) -> str:
    sev = fd.severity.value
    head = f"**{n}. {_SEVERITY_MARK.get(sev, '')} {sev} · {esc(fd.code)} {code(fd.name)}**"
    if fd.location is not None:
        head += f" at {_where(fd.location, base)}"
    if fd.rank is not None:
        head += f" · rank {fd.rank}"
    head += f" · {fd.confidence.value}"
    lines = [head, "", rich(fd.message), "", f"- **Fix:** {rich(fd.fix.instruction)}"]
    if fd.verification is not None:  # --verify: what was measured comes before what was expected
        lines.append(f"- **Verified:** {esc(f.verification_text(fd.verification))}")
        if fd.verification.changes:
            lines.append(f"- **Trial change:** {esc(f.verification_changes(fd.verification))}")
    gain = f.gain_text(fd.gain)
    if gain:
        lines.append(f"- **Gain:** {esc(gain)}")
    ev = [esc(f.metric_text(m)) for m in fd.evidence.metrics]
    for s in fd.evidence.settings:
        item = f"{code(s.name)} = {code(f.with_unit(s.value))}"
        if s.location is not None:
            item += f" at {_where(s.location, base)}"
        ev.append(item)
    ev += [f"{esc(tr.label or 'time range')} ({f.duration(tr.end_ns - tr.start_ns)})" for tr in fd.evidence.time_ranges]
    ev += [rich(note) for note in fd.evidence.notes]
    if ev:
        lines.append("- **Evidence:** " + "; ".join(ev))
    if fd.fix.before or fd.fix.after:
        label = f.snippet_label(fd.fix)
        lines += ["", f"<details><summary>Before → after{': ' + esc(label) if label else ''}</summary>", ""]
        if fd.fix.before:
            lines += [fence(f.clean(fd.fix.before), "python"), ""]
        if fd.fix.after:
            lines += [fence(f.clean(fd.fix.after), "python"), ""]
        lines.append("</details>")
    return "\n".join(lines)


def _checklist_item(status: ChecklistStatus, it) -> str:
    codes = f" ({', '.join(esc(c) for c in it.codes)})" if it.codes else ""
    title = f"**{esc(it.title)}**"
    if status == ChecklistStatus.APPLIED:
        return f"- [x] {title}: {rich(it.reason)}{codes}"
    if status == ChecklistStatus.RECOMMENDED:
        gain = f.gain_text(it.gain)
        gain = f"; **gain:** {esc(gain)}" if gain else ""
        return f"- [ ] {title}: {rich(it.reason)}{gain}{codes}"
    return f"- *{f.STATUS_LABELS[status]}:* {title}: {rich(it.reason)}{codes}"


def _account_block(report: Report) -> str:
    a = report.account
    if a is None:
        return ""
    lines = ["### Where the step goes", "", f"{esc(a.headline)} ({esc(f.account_title(a))})", ""]
    rows = [
        [cell(f.component_label(comp)), f.pct(p), cell(f.duration(ns)), "GPU busy" if side == "device" else "host side"]
        for comp, p, ns, side in f.account_parts(a)
    ]
    lines.append(table(["part of the step", "share", "per step", "side"], rows, ["l", "r", "r", "l"]))
    if a.notes:
        lines += [""] + [f"*{esc(note)}*" for note in a.notes]
    return "\n".join(lines)


def _actions_block(report: Report, base: str | None = None) -> str:
    """What to change first: each action, where (a link), and what it wins, before anything else."""
    a = report.account
    if a is None:
        return ""
    tried = ("\n\n**Tried, did not help:**\n\n" + "\n".join(f"- {esc(f.tried_text(x))}" for x in a.tried)
             if a.tried else "")
    if not a.actions:
        return "### Top actions\n\nNo finding claims a part of this step: nothing to win by a fix here." + tried
    now = f.account_now(a)
    lines = ["### Top actions" + (f" ({esc(now)})" if now else ""), ""]
    by_code = {fd.code: fd for fd in report.findings}
    for n, act in enumerate(a.actions, 1):
        fd = by_code.get(act.code)
        where = f" at {_where(fd.location, base)}" if fd is not None and fd.location is not None else ""
        what = f" — {rich(fd.fix.instruction)}" if fd is not None and fd.fix.instruction else ""
        lines.append(f"{n}. **{esc(f.action_text(act))}**{where}{what}")
    return "\n".join(lines) + tried


def _checklist_rest(groups: list[tuple[ChecklistStatus, list]]) -> str:
    """The items that ask nothing of the reader, folded: by status, one line per distinct reason."""
    n = sum(len(items) for _, items in groups)
    lines = [f"<details><summary>{n} more: {', '.join(f'{len(i)} {f.STATUS_LABELS[s]}' for s, i in groups)}</summary>", ""]
    for status, items in groups:
        for reason, same in f.group_by_reason(items):
            titles = ", ".join(f"**{esc(it.title)}**" for it in same)
            codes = sorted({c for it in same for c in it.codes})
            tail = f" ({', '.join(esc(c) for c in codes)})" if codes else ""
            lines.append(f"- *{f.STATUS_LABELS[status]}:* {titles}: {rich(reason)}{tail}")
    lines += ["", "</details>"]
    return "\n".join(lines)


def _breakdown_table(metrics: tuple[TraceMetrics, ...], account_key: str = "") -> str:
    shown = [
        (i, m) for i, m in enumerate(metrics)
        if m.breakdown_mean_pct and not (account_key and f"trace:{m.path}" in account_key)
    ]
    if not shown:
        return ""
    keys: list[str] = []
    for _, m in shown:
        keys += [k for k in m.breakdown_mean_pct if k not in keys]
    keys = f.component_order(keys)
    if len(shown) <= 6:
        header = ["component"] + [cell(f.trace_label(m, i)) for i, m in shown]
        rows = [
            [cell(f.component_label(k))] + [f.pct(m.breakdown_mean_pct[k]) if k in m.breakdown_mean_pct else "–" for _, m in shown]
            for k in keys
        ]
        text = table(header, rows, ["l"] + ["r"] * len(shown))
    else:
        header = ["trace"] + [cell(f.component_label(k)) for k in keys]
        rows = [
            [cell(f.trace_label(m, i))] + [f.pct(m.breakdown_mean_pct[k]) if k in m.breakdown_mean_pct else "–" for k in keys]
            for i, m in shown[:MAX_TABLE_ROWS]
        ]
        text = table(header, rows, ["l"] + ["r"] * len(keys))
        if len(shown) > MAX_TABLE_ROWS:
            text += f"\n\n{len(shown) - MAX_TABLE_ROWS} more traces are in the JSON and HTML reports."
    first = shown[0][1]
    where = "the ProfilerStep windows" if first.step_source == "ProfilerStep" else "one window (no ProfilerStep markers)"
    title = "Step breakdown of the other traces" if account_key else "Step breakdown"
    return f"### {title}\n\nMean share of step time over {where}.\n\n{text}"


def _ranks_table(report: Report) -> str:
    if not report.ranks:
        return ""
    mixed = f.mixed_jobs(report.ranks)
    rows = []
    for r in report.ranks[:MAX_TABLE_ROWS]:
        c = [cell(x) for x in f.rank_cells(r, mixed)]
        c[-1] = "**straggler**" if r.straggler else ""
        rows.append(c)
    text = table(list(f.RANK_HEADER), rows, ["r", "r", "r", "r", "r", "r", "r", "l"])
    if len(report.ranks) > MAX_TABLE_ROWS:
        text += f"\n\n{len(report.ranks) - MAX_TABLE_ROWS} more ranks are in the JSON and HTML reports."
    lines = f.rank_summary_lines(report.rank_summary)
    if lines:
        text += "\n\n" + "\n".join(
            f"- **{esc(line)}**" if line.startswith("straggler:") else f"- {esc(line)}" for line in lines
        )
    return "### Ranks\n\n" + text


def _blocks(report: Report) -> list[_Block]:
    blocks: list[_Block] = []
    run = report.run
    head = [f"## gpudoctor: {f.findings_headline(report)}", ""]
    meta = f"{code(report.source)} · {esc(report.kind)} · gpudoctor {esc(report.gpudoctor_version)} · {esc(report.created_at)}"
    head.append(meta)
    if run is not None and run.manifest is not None:
        head += ["", f"Run: {esc(f.run_line(run.manifest))}"]
    head += [line for w in report.warnings for line in ("", f"> {_SEVERITY_MARK['warning']} **warning:** {esc(w)}")]
    blocks.append(_Block("\n".join(head), 0))
    # a pull request's reader: what to change first, then the evidence, then the rest folded
    base = run.manifest.cwd if run is not None and run.manifest is not None else None
    text = _actions_block(report, base)
    if text:
        blocks.append(_Block(text, 0))
    if report.findings:
        blocks.append(_Block("### Findings", 0))
        for n, fd in enumerate(report.findings, 1):
            blocks.append(_Block(_finding_block(n, fd, base), 1, "finding"))
    else:
        blocks.append(_Block("### Findings\n\nNone: every rule that could judge this run found nothing to fix.", 0))
    text = _account_block(report)
    if text:
        blocks.append(_Block(text, 0))
    if report.summary:
        rows = [
            [cell(s.label), cell(f.with_unit(s.value, s.unit)), cell(s.window) if s.window else ""]
            for s in report.summary
        ]
        blocks.append(_Block(table(["summary", "value", "of"], rows, ["l", "r", "l"]), 0))
    if report.checklist:
        blocks.append(_Block("### Checklist", 0))
        rest = []
        for status, items in f.checklist_by_status(report.checklist):
            if status in (ChecklistStatus.APPLIED, ChecklistStatus.RECOMMENDED):
                for it in items:
                    blocks.append(_Block(_checklist_item(status, it), 0, "checklist item"))
            else:
                rest.append((status, items))
        if rest:
            blocks.append(_Block(_checklist_rest(rest), 2, "section"))
    if run is not None:
        text = _breakdown_table(run.metrics, report.account.ledger.key if report.account else "")
        if text:
            blocks.append(_Block(text, 2, "section"))
    text = _ranks_table(report)
    if text:
        blocks.append(_Block(text, 2, "section"))
    if report.environment:
        rows = [[cell(k), code(v, table=True) or " "] for k, v in list(report.environment.items())[:MAX_TABLE_ROWS]]
        blocks.append(_Block("### Environment\n\n" + table(["", "version"], rows), 2, "section"))
    notes = [f"- error: {esc(e)}" for e in report.errors]
    if run is not None:
        notes += [f"- {esc(n)}" for n in run.notes]
    if notes:
        blocks.append(_Block("<details><summary>Notes and errors</summary>\n\n" + "\n".join(notes) + "\n\n</details>", 3, "section"))
    return blocks


def _join(blocks: list[_Block]) -> str:
    # Checklist items form one list: no blank line between consecutive items.
    out: list[str] = []
    prev_item = False
    for b in blocks:
        item = b.kind == "checklist item"
        if out:
            out.append("\n" if (item and prev_item) else "\n\n")
        out.append(b.text)
        prev_item = item
    return "".join(out) + "\n"


def render_markdown(report: Report, limit: int = GITHUB_COMMENT_LIMIT) -> str:
    blocks = _blocks(report)
    full = _join(blocks)
    if _length(full) <= limit:
        return full
    budget = limit - _NOTE_RESERVE
    keep = [False] * len(blocks)
    used = 0
    for prio in sorted({b.priority for b in blocks}):
        closed: set[str] = set()  # findings are ranked: once one does not fit, none after it
        for i, b in enumerate(blocks):
            if b.priority == prio and not keep[i] and b.kind not in closed:
                size = _length(b.text) + 2
                if used + size <= budget:
                    keep[i] = True
                    used += size
                elif b.kind == "finding":
                    closed.add(b.kind)
    left: dict[str, int] = {}
    for b, k in zip(blocks, keep, strict=True):
        if not k:
            left[b.kind or "section"] = left.get(b.kind or "section", 0) + 1
    what = ", ".join(f"{n} {kind}{'s' if n > 1 else ''}" for kind, n in left.items())
    note = (
        f"> **Truncated** to fit GitHub's {GITHUB_COMMENT_LIMIT:,}-character comment limit: {what} left out. "
        f"The full report: `gpudoctor report` with `-o report.html` (or `.json`)."
    )
    kept = [b for b, k in zip(blocks, keep, strict=True) if k]
    return _join([*kept, _Block(note, 0)])
