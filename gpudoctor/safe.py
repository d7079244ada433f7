"""Untrusted text and untrusted paths, made safe once for every layer.

Standard library only and nothing of ours, like ``errors.py``: every layer may import it
(``collect/`` and ``cli.py`` at start-up, without the ~0.1 s of ``gpudoctor.model``).

Strings that come from a user's script, a trace or a file name reach gpudoctor's own
terminal lines and its reports; paths read from a manifest reach ``analyze`` and
``view``. Both kinds are hostile until shown otherwise:

- :func:`escape_controls` is the one place control characters are escaped, for every
  output: :func:`clean` / :func:`one_line` / :func:`terminal_line` show them as visible
  escapes (``\\x1b``), so an exception message or a file name cannot clear the screen,
  retitle the terminal or forge a line of gpudoctor's, in any format (terminal, Markdown,
  HTML, GitHub workflow commands); :func:`json_text` spells them as JSON's ``\\u001b``
  in a JSON or SARIF document, which then decodes to the same string;
- :func:`inside` resolves a path named by a manifest and returns it only when it
  stays inside the run directory (``..``, absolute paths and symlinks out refused);
- :func:`not_regular` says why a path is not a regular file (a FIFO would block the
  reader forever, a device would never end), before anything reads it.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

# C0/C1 controls (tab and newline aside), DEL, and the bidirectional overrides of "Trojan source".
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
# the same, newline and tab included: for text that must stay on one terminal line
_CONTROL_LINE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _visible(c: int) -> str:
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def _json(c: int) -> str:
    return f"\\u{c:04x}"


def escape_controls(text: object, newlines: bool = False, spelling: str = "visible") -> str:
    """Untrusted text with every control character escaped: C0 and C1 controls, DEL and the
    bidirectional overrides; newline and tab kept unless ``newlines`` (text for one line).

    ``spelling`` is ``"visible"`` (``\\x1b``, for text a person reads: every renderer) or
    ``"json"`` (``\\u001b``, for a JSON document already dumped: JSON's own escape, so the
    document stays valid and decodes to the same string)."""
    spell = _json if spelling == "json" else _visible
    return (_CONTROL_LINE if newlines else _CONTROL).sub(lambda m: spell(ord(m.group())), str(text))


def clean(text: object) -> str:
    """Untrusted text with its control characters shown as visible escapes (``\\x1b``)."""
    return escape_controls(text)


def one_line(text: object) -> str:
    """Untrusted text on one line: whitespace runs (newlines included) collapsed, controls escaped."""
    return escape_controls(" ".join(str(text).split()))


def terminal_line(text: object) -> str:
    """A line gpudoctor prints itself: every control character escaped, newlines too, so that
    a file name or a message from the script can neither drive the terminal nor start a line."""
    return escape_controls(text, newlines=True)


def json_text(document: str) -> str:
    """A dumped JSON document with no raw control character left: ``json.dumps`` escapes C0
    controls in strings but writes C1 controls (``\\x9b`` starts a terminal sequence), DEL and
    the bidirectional overrides as they are; they become ``\\u009b`` (outside strings a JSON
    document has none)."""
    return escape_controls(document, spelling="json")


# --------------------------------------------------------------------------- paths


def inside(base: Path, rel: object) -> Path | None:
    """``base / rel`` resolved (symlinks followed), or None when it leads out of ``base``.

    ``rel`` comes from a file that anybody could have written: an absolute path, ``..``
    or a symlink that points elsewhere is refused, not followed.
    """
    if not isinstance(rel, str) or not rel or "\x00" in rel:
        return None
    root = base.resolve()
    try:
        target = (root / rel).resolve()
    except (OSError, RuntimeError, ValueError):  # a symlink loop, a name the system refuses
        return None
    if target == root or root not in target.parents:
        return None
    return target


_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def not_regular(path: Path, dir_ok: bool = False) -> str:
    """Why ``path`` is not a regular file ("" when it is one; a folder is one when ``dir_ok``).

    Symlinks are followed. A path that does not exist gives "" too: the caller says that
    in its own words.
    """
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return ""
    if stat.S_ISREG(mode) or (dir_ok and stat.S_ISDIR(mode)):
        return ""
    if stat.S_ISDIR(mode):
        return "a folder"
    for test, kind in _KINDS:
        if test(mode):
            return kind
    return "not a regular file"
