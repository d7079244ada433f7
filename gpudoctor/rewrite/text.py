"""A source file's bytes as text and back, exactly: its encoding (PEP 263 cookie or UTF-8) and a
byte-order mark are kept, and in a file of mixed line endings each line's own (``newlines_kept``), so
that a file rewritten changes only where an edit changed it."""

from __future__ import annotations

import difflib
import io
import re
import tokenize
from dataclasses import dataclass


class RewriteError(Exception):
    """An edit that cannot be made safely, or a file that cannot be rewritten: the message says why."""


@dataclass(frozen=True, slots=True)
class Decoded:
    text: str
    encoding: str  # the codec the file's bytes are in
    bom: bool  # a UTF-8 byte-order mark leads the bytes (not part of ``text``)


def decode_source(data: bytes) -> Decoded:
    """The text of a Python source file's bytes; RewriteError when they are not text in their encoding."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as err:
        raise RewriteError(f"its encoding cannot be read ({err})") from None
    bom = data.startswith(b"\xef\xbb\xbf")
    body = data[3:] if bom else data
    codec = "utf-8" if encoding == "utf-8-sig" else encoding
    try:
        text = body.decode(codec)
    except (UnicodeDecodeError, LookupError) as err:
        raise RewriteError(f"not valid {codec} ({err})") from None
    if "\0" in text:
        raise RewriteError("it contains null bytes (not a text file)")
    return Decoded(text, codec, bom)


def encode_like(text: str, like: Decoded) -> bytes:
    """``text`` in the encoding (and with the byte-order mark) of the file it was read from."""
    data = text.encode(like.encoding)
    return b"\xef\xbb\xbf" + data if like.bom else data


_LINE_END = re.compile(r"\r\n|\r|\n")


def mixed_newlines(text: str) -> bool:
    """Whether the text ends its lines in more than one way (\r\n and \n …)."""
    crlf = text.count("\r\n")
    return len({k for k, n in (("crlf", crlf), ("lf", text.count("\n") - crlf), ("cr", text.count("\r") - crlf))
                if n}) > 1


def _ending(line: str) -> str:
    m = _LINE_END.search(line, max(0, len(line) - 2))
    return m.group(0) if m is not None and m.end() == len(line) else ""


def newlines_kept(old: str, new: str) -> str:
    """``new`` with each line it adds ending as the line of ``old`` it is inserted at does (the line it
    replaces, else the one before it), and each line it keeps ending as it did: LibCST ends a line it
    makes with the newline of the file's (or the part's) first line, which in a file of mixed line
    endings is not that of the lines around it."""
    before = io.StringIO(old, newline="").readlines()
    after = io.StringIO(new, newline="").readlines()
    ops = difflib.SequenceMatcher(a=[x.rstrip("\r\n") for x in before], b=[x.rstrip("\r\n") for x in after],
                                  autojunk=False).get_opcodes()
    out: list[str] = []
    for tag, i1, i2, j1, j2 in ops:
        if tag == "equal":  # the line as it was (LibCST may have made its newline anew: a comma added after it)
            for b, a in zip(before[i1:i2], after[j1:j2], strict=True):
                out.append(b if _ending(b) or not _ending(a) else b + _ending(a))
            continue
        for k, line in enumerate(after[j1:j2]):
            at = min(i1 + k, i2 - 1) if i2 > i1 else i1 - 1  # the line replaced, else the one before it
            like = before[at] if 0 <= at < len(before) else (before[0] if before else "")
            end = _ending(line)
            out.append(line[:len(line) - len(end)] + _ending(like) if end and _ending(like) else line)
    return "".join(out)
