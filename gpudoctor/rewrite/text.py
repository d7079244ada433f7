"""A source file's bytes as text and back, exactly: its encoding (PEP 263 cookie or UTF-8) and a
byte-order mark are kept, so that a file rewritten changes only where an edit changed it."""

from __future__ import annotations

import io
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
