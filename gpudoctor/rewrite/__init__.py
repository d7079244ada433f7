"""The rewrite engine: a finding's fix as an edit of the user's own source, with LibCST.

One engine serves three things (docs/check.md):

- **before/after** (``snippet``): the statement a fix changes as the file has it, and the
  same statement rewritten, the script's own arguments, layout and comments kept
  (``shuffle=True``, ``collate_fn=…`` stay where they are). ``gpudoctor check`` and the
  reports of ``profile`` / ``analyze`` (from the call sites a run records) show these;
- ``gpudoctor check --fix`` / ``--diff`` (``apply``): every edit of a file made at once, the
  rest of the file byte for byte as it was;
- **refusals**: an edit that cannot be made safely is skipped with the reason, never
  guessed: its node is not where the finding says (the file changed), a ``**kwargs`` may
  already hold the keyword, a flag it conflicts with is set (``fused=True`` with
  ``foreach=True``), several nodes fit, or workers would be added to a script that builds
  its DataLoader at import time without an ``if __name__ == "__main__":`` guard.

An ``Edit`` (``gpudoctor.model.findings``) says what to change; the rules make them
(``gpudoctor.rules.edits``), this package makes the change and never decides one. It is
pure (text in, text out) and imports the model only, and LibCST on first use (~0.2 s):
a report without edits never loads it. ``apply`` checks that the result still parses and
compiles before anyone writes it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from gpudoctor.rewrite.text import RewriteError, decode_source, encode_like

# the names that need LibCST, imported on first use (PEP 562)
_LAZY = {"Applied": "engine", "apply": "engine", "Snippet": "snippet", "snippet": "snippet"}

__all__ = ["Applied", "RewriteError", "Snippet", "apply", "decode_source", "encode_like", "snippet"]


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{mod}"), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from gpudoctor.rewrite.engine import Applied, apply
    from gpudoctor.rewrite.snippet import Snippet, snippet
