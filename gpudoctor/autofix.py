"""``gpudoctor check --fix`` / ``--diff``: the fixes that are mechanical and safe, made in the files.

A finding's fix is made when its rule declares its edits automatic (``Rule.autofix``) and
the rewrite engine (``gpudoctor.rewrite``) can make it safely in the file (``Fix.automatic``).
Like ruff, fixing is repeated until nothing more changes (at most ``MAX_PASSES`` rounds): a
DataLoader pinned by one pass gives ``non_blocking=True`` copies in the next. Between passes
the rewritten texts stand in for the files (``check_paths(overlay=…)``); nothing is written
until the last pass, and ``--diff`` writes nothing at all.

Safety:

- only the files given on the command line (or found in the folders given) are changed,
  not the project modules ``check`` follows through imports;
- a file that cannot be read or parsed is reported (``Report.errors``) and left untouched;
- a rewrite that would not parse and compile is never kept (``rewrite.apply`` refuses it);
- a file is written atomically (beside it, then renamed into place) with its mode kept, in
  its own encoding, with its line endings and byte-order mark; one that changed on disk
  since the review read it (its size, times or inode, a symlink put in its place) or since
  the fix read it is not written. A file whose fixes could not be made or written is "not
  written": one line on stderr and exit 1, as ruff's E902;
- a file with other hard links is replaced like any other (atomically: the rename gives
  this name a new file), and stderr says so: its other names keep the old text;
- a temporary file that a ``--fix`` killed by SIGKILL left beside a script
  (``.train.py.PID.tmp``, its process gone) is removed by the next ``--fix`` of that folder,
  with one line.

The exit codes follow ruff's (docs/check.md, "Exit codes"): the findings that remain decide
``--fail-on``; ``--diff`` exits 1 when it shows a change; ``--exit-non-zero-on-fix`` exits 1
when a file was changed.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpudoctor.config import Config
from gpudoctor.errors import UsageError
from gpudoctor.model.findings import Edit, Finding, Report
from gpudoctor.static import check_paths
from gpudoctor.static.sizing import Sizing
from gpudoctor.static.sources import discover

#: Rounds of fixes at most (each checked again); ruff stops at 100, gpudoctor's chains are short.
MAX_PASSES = 4


@dataclass(slots=True)
class FileFix:
    """What ``--fix`` did (or ``--diff`` would do) to one file."""

    path: str  # absolute
    display: str  # as findings name it
    original: bytes = b""
    text: str = ""  # the text after the fixes (the decoded original when none)
    fixed: list[Finding] = field(default_factory=list)  # the findings whose fix was made
    skipped: list[tuple[Finding, str]] = field(default_factory=list)  # automatic fixes that could not be made, and why
    error: str = ""  # why the file was left untouched
    unwritten: bool = False  # its fixes could not be made or written (exit 1, as ruff's E902)
    links: int = 1  # hard links the file had when it was replaced (the others keep the old text)

    @property
    def changed(self) -> bool:
        return bool(self.fixed) and not self.error


@dataclass(slots=True)
class FixResult:
    report: Report  # the check of the files as fixed: the findings that remain
    files: list[FileFix]
    passes: int
    written: bool  # --fix wrote the files (False for --diff)
    cleaned: list[str] = field(default_factory=list)  # stale temporaries of a killed --fix, removed

    @property
    def changed(self) -> list[FileFix]:
        return [f for f in self.files if f.changed]

    @property
    def unwritten(self) -> list[FileFix]:
        """Files whose fixes could not be made or written (unreadable, changed meanwhile, read-only, a full
        disk): exit 1."""
        return [f for f in self.files if f.unwritten]

    @property
    def fixed_count(self) -> int:
        return sum(len(f.fixed) for f in self.changed)

    def diff(self) -> str:
        """A unified diff of every changed file (``--- a/FILE`` / ``+++ b/FILE``), as ``git diff`` shows it."""
        out: list[str] = []
        for f in self.changed:
            before = _decoded(f.original)
            lines = difflib.unified_diff(before.splitlines(keepends=True), f.text.splitlines(keepends=True),
                                         fromfile=diff_name("a/", f.display), tofile=diff_name("b/", f.display))
            for line in lines:
                out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
        return "".join(out)

    def summary(self) -> list[str]:
        """One line per file changed (the findings fixed, by line), per fix left, per file left untouched,
        and the totals: what ``--fix`` reports on stderr."""
        verb = "fixed" if self.written else "would fix"
        out: list[str] = [f"{p}: removed (a temporary file that a killed --fix left)" for p in self.cleaned]
        for f in self.files:
            if f.error:
                out.append(f"{f.display}: not fixed: {f.error}")
                continue
            if f.fixed:
                items = ", ".join(f"{x.code} line {x.location.line if x.location else '?'}" for x in f.fixed)
                out.append(f"{f.display}: {verb} {len(f.fixed)} ({items})")
                if f.links > 1 and self.written:
                    out.append(f"{f.display}: it had {f.links} hard links: the fixed file replaced this name only "
                               f"(written beside it and renamed, as every fix is); its other names keep the old text")
            for x, why in f.skipped:
                where = f"{x.location}" if x.location else f.display
                out.append(f"{where}: {x.code} left as it is: {why}")
        remaining = len(self.report.findings)
        files = len(self.changed)
        lost = len(self.unwritten)
        out.append(f"{verb} {self.fixed_count} finding{'s' if self.fixed_count != 1 else ''} in {files} "
                   f"file{'s' if files != 1 else ''}; {remaining} finding{'s' if remaining != 1 else ''} "
                   + (("remains" if remaining == 1 else "remain") if self.written else "would remain")
                   + (f"; {lost} file{'s' if lost != 1 else ''} could not be written" if lost else ""))
        return out


_GIT_ESCAPES = {"\a": "\\a", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\v": "\\v", "\f": "\\f", "\r": "\\r",
                '"': '\\"', "\\": "\\\\"}


def diff_name(prefix: str, name: str) -> str:
    """A file's name on a ``---`` / ``+++`` line, as ``git diff`` writes it: ``a/`` and the path (an
    absolute one without its leading ``/``: ``a/tmp/x.py``); in double quotes with C escapes when it holds
    a control character, a ``"``, a backslash or a byte over 0x7f (``"a/new\\nline.py"``,
    ``\\033`` for ESC, octal for each byte of UTF-8, as core.quotePath does); and a tab after it when it
    holds a space, for patch. A hostile name can then neither split the header nor drive a terminal."""
    path = prefix + (name[1:] if name.startswith("/") else name)
    raw = path.encode("utf-8", "surrogateescape")
    tab = "\t" if " " in path else ""
    if not any(b < 0x20 or b >= 0x7F or b in (0x22, 0x5C) for b in raw):
        return path + tab
    out = []
    for b in raw:
        c = chr(b)
        if c in _GIT_ESCAPES:
            out.append(_GIT_ESCAPES[c])
        elif b < 0x20 or b >= 0x7F:
            out.append(f"\\{b:03o}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"' + tab


def _decoded(data: bytes) -> str:
    from gpudoctor.rewrite import decode_source

    return decode_source(data).text


def _targets(paths: Sequence[Path]) -> dict[str, Path | None]:
    """The files --fix may change (absolute path → the real path of the folder given it was found in)."""
    targets, _errors, _roots = discover(list(paths))
    return {str(t.path): t.folder for t in targets}


def fix_paths(paths: Sequence[Path], config: Config, *, sizing: Sizing | None = None, write: bool = True) -> FixResult:
    """Check ``paths``, make the automatic fixes, check again until nothing changes; write the files when
    ``write`` (``--fix``), else only compute them (``--diff``)."""
    from gpudoctor.rewrite import RewriteError, apply, decode_source

    targets = _targets(paths)
    cleaned = _clean_stale(targets) if write else []
    stamps = {path: _stamp(path) for path in targets}  # what the review reads: a file changed after is not fixed
    files: dict[str, FileFix] = {}
    decoded = {}
    overlay: dict[str, str] = {}
    report = check_paths(paths, config, sizing=sizing)
    passes = 1
    while True:
        by_file: dict[str, list[Finding]] = {}
        for f in report.findings:
            if f.fix.automatic and f.fix.edits and f.location is not None:
                path = os.path.abspath(f.fix.edits[0].file)
                if path in targets and not (path in files and files[path].error):
                    by_file.setdefault(path, []).append(f)
        progress = False
        for path, findings in sorted(by_file.items()):
            ff = files.get(path)
            if ff is None:
                ff = files[path] = FileFix(path, findings[0].fix.edits[0].file)
                try:
                    ff.original = Path(path).read_bytes()
                    decoded[path] = decode_source(ff.original)
                except (OSError, RewriteError) as err:
                    ff.error, ff.unwritten = f"cannot be read ({err}); not written", True
                    continue
                if _stamp(path) != stamps.get(path):  # saved, replaced or swapped for a symlink since the review
                    ff.error = "it changed on disk while gpudoctor was reviewing it; not written (run --fix again)"
                    ff.unwritten = True
                    continue
            text = overlay.get(path, decoded[path].text)
            owner: dict[Edit, Finding] = {e: f for f in findings for e in f.fix.edits}
            try:
                applied = apply(text, list(owner))
            except RewriteError as err:
                ff.error, ff.unwritten = f"{err}; not written", True
                continue
            made = {id(owner[e]) for e in applied.done}
            ff.fixed += [f for f in findings if id(f) in made]
            ff.skipped += [(owner[e], why) for e, why in applied.skipped if id(owner[e]) not in made]
            if applied.text != text:
                overlay[path] = applied.text
                progress = True
        if not progress:
            break
        report = check_paths(paths, config, sizing=sizing, overlay=overlay)  # what the fixes left, or made fixable
        passes += 1
        if passes > MAX_PASSES:
            break
    for path, ff in files.items():
        ff.text = overlay.get(path, decoded[path].text if path in decoded else "")
        if ff.error:
            ff.text = decoded[path].text if path in decoded else ""
    result = FixResult(report, sorted(files.values(), key=lambda f: f.display), passes, write, cleaned)
    if write:
        _write(result, decoded, targets)
        if any(f.fixed and f.error for f in result.files):  # a file was not written: what remains is on disk
            try:
                result.report = check_paths(paths, config, sizing=sizing)
            except UsageError:  # nothing is left to check (the files went away meanwhile): the last report
                pass
    return result


def _stamp(path: str) -> tuple[int, ...] | None:
    """What tells a file from a changed one without reading it: its inode, size and times (``lstat``: a
    symlink put in its place is another file); None when it cannot be read."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _clean_stale(targets: dict[str, Path | None]) -> list[str]:
    """The temporaries that a ``--fix`` killed by SIGKILL left beside the files it may change, removed
    (``output.remove_stale_temporaries``: ``.NAME.PID.tmp`` of a process that is gone)."""
    from gpudoctor.output import remove_stale_temporaries

    removed: list[str] = []
    for path in targets:
        removed += remove_stale_temporaries(path)
    return removed


def _write(result: FixResult, decoded: dict, targets: dict[str, Path | None]) -> None:
    from gpudoctor.output import replace_file
    from gpudoctor.rewrite import encode_like
    from gpudoctor.static.sources import within

    for f in result.changed:
        folder = targets.get(f.path)
        if folder is not None and not within(os.path.realpath(f.path), str(folder)):
            # a file of a folder given now leads out of it (a symlink put in its place): never written
            f.error = f"it now leads out of {folder} (a symlink); not written"
            f.unwritten = True
            continue
        if not os.access(f.path, os.W_OK):
            f.error = "the file is read-only; not written (make it writable to have it fixed)"
            f.unwritten = True
            continue
        try:
            now = Path(f.path).read_bytes()
        except OSError as err:
            f.error = f"cannot be read again before writing ({err.strerror or err}); not written"
            f.unwritten = True
            continue
        if now != f.original:
            f.error = "it changed on disk while gpudoctor was fixing it; not written (run --fix again)"
            f.unwritten = True
            continue
        try:
            data = encode_like(f.text, decoded[f.path])
        except UnicodeEncodeError as err:
            f.error = f"the fixed text cannot be saved in the file's encoding ({err}); not written"
            f.unwritten = True
            continue
        try:
            f.links = os.stat(f.path).st_nlink
            replace_file(f.path, data, "fixed file")
        except OSError as err:
            f.error = f"cannot be read again before writing ({err.strerror or err}); not written"
            f.unwritten = True
        except UsageError as err:
            f.error = str(err)
            f.unwritten = True
