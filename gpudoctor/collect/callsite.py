"""Which frame of the stack is the user's code: the ``file:line`` that settings and errors point at.

A frame is *the user's* when its file is not part of torch, of gpudoctor, of the
standard library or of another installed package. Where no such frame exists (a
library built the DataLoader, say), the first frame outside torch and gpudoctor
stands in. Paths are written relative to the run's working directory when the
file lies under it, absolute otherwise.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from types import FrameType, TracebackType

from gpudoctor.model import CallSite

_GPUDOCTOR_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _dirs(*keys: str) -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    out = []
    for k in keys:
        p = paths.get(k)
        if p:
            out.append(os.path.abspath(p) + os.sep)
    return tuple(dict.fromkeys(out))


_STDLIB_DIRS = _dirs("stdlib", "platstdlib")
_SITE_DIRS = _dirs("purelib", "platlib")


class FrameClassifier:
    """Classifies code files as gpudoctor's, torch's, library or user code (cached per file)."""

    def __init__(self, cwd: str | None = None, torch_dir: str | None = None) -> None:
        self.cwd = os.path.abspath(cwd or os.getcwd()) + os.sep
        self.torch_dir = (os.path.abspath(torch_dir) + os.sep) if torch_dir else None
        self._kind: dict[str, str] = {}

    def kind(self, filename: str) -> str:
        """"ours", "torch", "library" (stdlib / site-packages / frozen) or "user"."""
        k = self._kind.get(filename)
        if k is not None:
            return k
        if filename.startswith("<"):
            k = "library"
        else:
            path = os.path.abspath(filename)
            if path.startswith(_GPUDOCTOR_DIR):
                k = "ours"
            elif self.torch_dir and path.startswith(self.torch_dir):
                k = "torch"
            elif any(path.startswith(d) for d in _SITE_DIRS):
                # an editable install of the user's own project is not under site-packages
                k = "library"
            elif any(path.startswith(d) for d in _STDLIB_DIRS):
                k = "library"
            else:
                k = "user"
        self._kind[filename] = k
        return k

    def display_path(self, filename: str) -> str:
        if filename.startswith("<"):
            return filename
        path = os.path.abspath(filename)
        if path.startswith(self.cwd):
            return path[len(self.cwd):]
        return path

    def site(self, frame: FrameType) -> CallSite:
        code = frame.f_code
        return CallSite(self.display_path(code.co_filename), frame.f_lineno, code.co_name)

    def user_frame(self, frame: FrameType | None) -> FrameType | None:
        """The innermost user frame at or above ``frame``; else the first frame outside torch/gpudoctor."""
        fallback = None
        f = frame
        while f is not None:
            k = self.kind(f.f_code.co_filename)
            if k == "user":
                return f
            if fallback is None and k == "library":
                fallback = f
            f = f.f_back
        return fallback

    def caller_site(self, depth: int = 2) -> CallSite | None:
        """Call site of whoever called the patched function (skipping torch and gpudoctor frames)."""
        try:
            frame = sys._getframe(depth)
        except ValueError:
            return None
        f = self.user_frame(frame)
        return self.site(f) if f is not None else None

    def traceback_site(self, tb: TracebackType | None) -> CallSite | None:
        """The innermost user frame of a traceback (where the user's code raised or called in)."""
        best = None
        fallback = None
        while tb is not None:
            k = self.kind(tb.tb_frame.f_code.co_filename)
            code = tb.tb_frame.f_code
            here = CallSite(self.display_path(code.co_filename), tb.tb_lineno, code.co_name)
            if k == "user":
                best = here
            elif k == "library" and best is None:
                fallback = here
            tb = tb.tb_next
        return best or fallback
