"""Finding the files to check, reading them, and the project folder their imports may reach.

A file that cannot be read or parsed becomes one line in ``Report.errors``; the
other files are still checked.
"""

from __future__ import annotations

import ast
import io
import os
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path

from gpudoctor import safe
from gpudoctor.static.summary import FileError

#: Folders never entered when a directory is given (they hold no project source).
SKIP_DIRS = frozenset(
    {"__pycache__", ".git", ".hg", ".svn", ".tox", ".nox", ".venv", "venv", "env", "node_modules",
     "site-packages", "dist-packages", "build", "dist", ".mypy_cache", ".pytest_cache", ".ruff_cache",
     "gpudoctor-runs", ".eggs", ".ipynb_checkpoints"}
)

#: The largest file ``gpudoctor check`` reads (bytes): a file over it is skipped with one line, the others
#: are checked. A check costs about 15-30 µs a byte where every function has fixes to cut (a 1 MiB file in
#: under 30 s on 2 cores; benchmarks/check_speed.py --scaling); a larger .py file is generated code or data.
MAX_SOURCE_BYTES = 1 << 20

_SUPPRESS = re.compile(r"#\s*gpudoctor:\s*ignore\b(?:\[([A-Za-z0-9,\s]*)\])?", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Target:
    path: Path  # absolute
    display: str  # as shown to the user
    folder: Path | None = None  # found in this folder given (its real path): --fix writes only inside it


def display_path(path: Path) -> str:
    """Relative to the working directory when inside it, else absolute."""
    try:
        rel = os.path.relpath(path)
    except ValueError:  # another drive (Windows)
        return str(path)
    return str(path) if rel.startswith("..") else rel


def discover(paths: list[Path]) -> tuple[list[Target], list[FileError], list[Path]]:
    """The .py files of the given files and folders (sorted; a file given twice, by another name or a link
    to it, once: as it was first given), errors, and the project folders.

    A project folder bounds where local imports are followed: the folder given, or
    for a file the folder above its topmost package.
    """
    targets: dict[Path, Target] = {}
    errors: list[FileError] = []
    roots: list[Path] = []
    seen: dict[tuple[int, int], Path] = {}  # one file given twice (a symlink, a hard link): checked and fixed once

    def add(target: Target) -> None:
        if target.path in targets:
            return
        try:
            st = os.stat(target.path)
        except (OSError, ValueError):
            key = None
        else:
            key = (st.st_dev, st.st_ino)
        if key is not None:
            if key in seen:
                return
            seen[key] = target.path
        targets[target.path] = target

    for raw in paths:
        shown = str(raw)
        try:
            p = Path(raw).expanduser()
            absolute = Path(os.path.abspath(p))
            exists = absolute.exists()
        except (OSError, ValueError) as err:
            errors.append(FileError(shown, f"{shown}: cannot be read ({err})"))
            continue
        if not exists:
            errors.append(FileError(shown, f"{shown}: no such file or folder; check the path"))
            continue
        kind = safe.not_regular(absolute, dir_ok=True)
        if kind:  # a FIFO or a device would block or never end: refused before any read
            errors.append(FileError(shown, f"{shown}: not a regular file ({kind}); pass a Python script or a folder"))
            continue
        if absolute.is_dir():
            roots.append(absolute)
            real = Path(os.path.realpath(absolute))
            for f in _walk(absolute, errors):
                add(Target(f, display_path(f), real))
            continue
        if absolute.suffix not in (".py", ".pyw"):
            errors.append(
                FileError(shown, f"{shown}: not a Python source file (.py); `gpudoctor check` reads Python scripts")
            )
            continue
        roots.append(package_root(absolute.parent))
        add(Target(absolute, display_path(absolute) if not p.is_absolute() else str(p)))
    return sorted(targets.values(), key=lambda t: str(t.path)), errors, _dedupe_roots(roots)


def _walk(folder: Path, errors: list[FileError]) -> list[Path]:
    """The .py files under ``folder``, without leaving it: symlinked folders are not entered, and a
    symlinked file counts only when it leads to a file inside the folder, under that file's own name
    (found once, and --fix writes the file inside). One that leads out is left alone, as ``git`` and
    ruff's walk leave it."""
    found: list[Path] = []
    real_folder = os.path.realpath(folder)

    def onerror(err: OSError) -> None:
        name = getattr(err, "filename", None) or str(folder)
        errors.append(FileError(str(name), f"{display_path(Path(name))}: folder cannot be read ({err.strerror or err})"))

    for dirpath, dirnames, filenames in os.walk(folder, onerror=onerror, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
        for name in filenames:
            if not name.endswith(".py"):
                continue
            path = Path(dirpath) / name
            if os.path.islink(path):
                real = os.path.realpath(path)
                if not within(real, real_folder) or not os.path.isfile(real):
                    continue  # out of the folder (or dangling): not read, never written
                path = Path(folder) / os.path.relpath(real, real_folder)
            found.append(path)
    return found


def within(path: str, folder: str) -> bool:
    """Whether ``path`` is ``folder`` or lies under it (both real paths)."""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def package_root(folder: Path) -> Path:
    """The folder above the topmost package (a folder with ``__init__.py``) containing ``folder``."""
    d = folder
    while (d / "__init__.py").is_file() and d.parent != d:
        d = d.parent
    return d


def _dedupe_roots(roots: list[Path]) -> list[Path]:
    out: list[Path] = []
    for r in sorted(set(roots), key=lambda p: len(p.parts)):
        if not any(_is_within(r, o) for o in out):
            out.append(r)
    return out


def _is_within(path: Path, folder: Path) -> bool:
    try:
        path.relative_to(folder)
    except ValueError:
        return False
    return True


def module_name(path: Path) -> str:
    """The dotted module name from the package folders above the file (``pkg.sub.mod``)."""
    parts = [path.stem] if path.stem != "__init__" else []
    d = path.parent
    while (d / "__init__.py").is_file() and d.parent != d:
        parts.insert(0, d.name)
        d = d.parent
    return ".".join(parts)


class ImportResolver:
    """Maps an import in a file to a file of the project (never to an installed package).

    Directory listings are cached, so thousands of imports cost a few hundred ``listdir`` calls.
    """

    def __init__(self, roots: list[Path]) -> None:
        self.roots = [str(r) for r in roots]
        self._cache: dict[tuple[str, int, str], str | None] = {}
        self._listing: dict[str, frozenset[str]] = {}
        self._pkg_root: dict[str, str] = {}

    def within(self, path: Path | str) -> bool:
        p = str(path)
        return any(p == r or p.startswith(r.rstrip(os.sep) + os.sep) for r in self.roots)

    def _entries(self, folder: str) -> frozenset[str]:
        found = self._listing.get(folder)
        if found is None:
            try:
                found = frozenset(os.listdir(folder))
            except OSError:
                found = frozenset()
            self._listing[folder] = found
        return found

    def _package_root(self, folder: str) -> str:
        found = self._pkg_root.get(folder)
        if found is None:
            d = folder
            while "__init__.py" in self._entries(d):
                parent = os.path.dirname(d)
                if parent == d:
                    break
                d = parent
            found = self._pkg_root[folder] = d
        return found

    def resolve(self, importer: Path | str, module: str, level: int = 0) -> str | None:
        """The absolute path of ``module`` as imported from ``importer``, if it is in the project."""
        folder = os.path.dirname(str(importer))
        key = (folder, level, module)
        if key in self._cache:
            return self._cache[key]
        found = self._resolve(folder, module, level)
        self._cache[key] = found
        return found

    def _resolve(self, folder: str, module: str, level: int) -> str | None:
        parts = [p for p in module.split(".") if p] if module else []
        if level:
            base = folder
            for _ in range(level - 1):
                base = os.path.dirname(base)
            bases = [base]
        else:
            bases = [folder, self._package_root(folder), *self.roots]
        seen: set[str] = set()
        for base in bases:
            if base in seen:
                continue
            seen.add(base)
            d = base
            ok = True
            for part in parts[:-1]:
                if part not in self._entries(d):
                    ok = False
                    break
                d = os.path.join(d, part)
            if not ok:
                continue
            if parts:
                last = parts[-1]
                entries = self._entries(d)
                if last + ".py" in entries:
                    candidate = os.path.join(d, last + ".py")
                elif last in entries and "__init__.py" in self._entries(os.path.join(d, last)):
                    candidate = os.path.join(d, last, "__init__.py")
                else:
                    continue
            elif "__init__.py" in self._entries(d):
                candidate = os.path.join(d, "__init__.py")
            else:
                continue
            if self.within(candidate):
                return candidate
        return None


def read_source(path: Path, shown: str) -> tuple[str | None, FileError | None]:
    """The decoded text of a file (PEP 263 cookie or UTF-8), or a one-line error."""
    kind = safe.not_regular(path)
    if kind and kind != "a folder":
        return None, FileError(shown, f"{shown}: not a regular file ({kind}); not read")
    try:
        size = path.stat().st_size
    except OSError:
        size = 0  # the read below says why
    if size > MAX_SOURCE_BYTES:
        return None, FileError(shown, too_large(shown, size))
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None, FileError(shown, f"{shown}: no such file; check the path")
    except IsADirectoryError:
        return None, FileError(shown, f"{shown}: is a folder, not a file")
    except OSError as err:
        return None, FileError(shown, f"{shown}: cannot be read ({err.strerror or err})")
    if len(data) > MAX_SOURCE_BYTES:  # it grew since
        return None, FileError(shown, too_large(shown, len(data)))
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as err:
        if "unknown encoding" in str(err):
            return None, FileError(shown, f"{shown}: {err}; save the file as UTF-8")
        encoding = "utf-8"  # undecodable first lines: the decode below names the byte
    try:
        text = data.decode(encoding)
    except (UnicodeDecodeError, LookupError) as err:
        if isinstance(err, UnicodeDecodeError):
            line = data[: err.start].count(b"\n") + 1
            return None, FileError(
                shown,
                f"{shown}: not valid {encoding.upper()} (byte 0x{data[err.start]:02x} on line {line}); "
                "save the file as UTF-8 or declare its encoding (# -*- coding: ... -*-)",
            )
        return None, FileError(shown, f"{shown}: unknown encoding {encoding!r}; save the file as UTF-8")
    if text.startswith("\ufeff"):
        text = text[1:]
    return text, None


def too_large(shown: str, size: int) -> str:
    return (f"{shown}: {size:,} bytes, over the {MAX_SOURCE_BYTES:,} (1 MiB) that `gpudoctor check` reads "
            "(generated code or data?); not checked")


def parse_source(text: str, shown: str) -> tuple[ast.Module | None, FileError | None]:
    try:
        return ast.parse(text, filename=shown), None
    except SyntaxError as err:
        msg = (err.msg or "invalid syntax").split("\n")[0]
        if "null bytes" in msg:
            return None, FileError(shown, f"{shown}: contains null bytes (not a text file); not checked")
        where = f" at line {err.lineno}" if err.lineno else ""
        if err.offset and err.lineno:
            where += f", column {err.offset}"
        return None, FileError(shown, f"{shown}: syntax error{where}: {msg}; fix it to have the file checked")
    except ValueError:  # null bytes (Python < 3.12 raises ValueError)
        return None, FileError(shown, f"{shown}: contains null bytes (not a text file); not checked")
    except (RecursionError, MemoryError):
        return None, FileError(shown, f"{shown}: too deeply nested for Python's parser; not checked")


def suppressions(text: str) -> dict[int, frozenset[str]]:
    """``# gpudoctor: ignore[GD201, GD301]`` / bare ``# gpudoctor: ignore`` comments, per line."""
    if "gpudoctor" not in text:
        return {}
    out: dict[int, frozenset[str]] = {}
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        tokens = []
        for i, line in enumerate(text.splitlines(), 1):
            if "#" in line:
                tokens.append(tokenize.TokenInfo(tokenize.COMMENT, line[line.index("#"):], (i, 0), (i, 0), line))
    for tok in tokens:
        if tok.type != tokenize.COMMENT:
            continue
        m = _SUPPRESS.search(tok.string)
        if not m:
            continue
        codes = frozenset(c.strip().upper() for c in (m.group(1) or "").split(",") if c.strip())
        line = tok.start[0]
        out[line] = out.get(line, frozenset()) | (codes or frozenset({"*"}))
    return out
