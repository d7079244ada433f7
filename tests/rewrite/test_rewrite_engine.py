"""gpudoctor.rewrite on its own: text in, text out; the rest of the file byte for byte; refusals with a reason."""

from __future__ import annotations

import pytest

from gpudoctor.rewrite import RewriteError, apply, decode_source, encode_like, snippet
from gpudoctor.rules import edits

LOADER = '''import torch
from torch.utils.data import DataLoader


def main():
    # a comment that stays
    loader = DataLoader(ds, batch_size=4,   shuffle=True, collate_fn=pad)  # trailing comment
    return loader
'''


def test_call_args_keep_the_scripts_own_arguments_and_layout():
    e = edits.dataloader_args("t.py", 7, {"num_workers": 4, "persistent_workers": True})
    out = apply(LOADER, [e])
    assert out.done == (e,) and out.skipped == ()
    assert out.text == LOADER.replace("collate_fn=pad)", "collate_fn=pad, num_workers=4, persistent_workers=True)")


def test_positional_argument_is_changed_in_place():
    text = "def f():\n    return DataLoader(ds, 4, True, None, None, 0)\n"
    out = apply(text, [edits.dataloader_args("t.py", 2, {"num_workers": 2})])
    assert out.text == "def f():\n    return DataLoader(ds, 4, True, None, None, 2)\n"


def test_kwargs_may_hold_the_keyword_so_the_edit_is_refused():
    text = "def f(**kw):\n    return DataLoader(ds, **kw)\n"
    out = apply(text, [edits.dataloader_args("t.py", 2, {"pin_memory": True})])
    assert out.text == text and out.done == ()
    assert "**kw" in out.skipped[0][1]


def test_workers_need_a_main_guard_at_module_level():
    text = "loader = DataLoader(ds, batch_size=4)\n"
    out = apply(text, [edits.dataloader_args("t.py", 1, {"num_workers": 2})])
    assert out.text == text and "import time" in out.skipped[0][1]
    guarded = 'if __name__ == "__main__":\n    loader = DataLoader(ds, batch_size=4)\n'
    assert "num_workers=2" in apply(guarded, [edits.dataloader_args("t.py", 2, {"num_workers": 2})]).text


def test_fused_is_refused_beside_foreach():
    text = "opt = torch.optim.Adam(p, lr=1e-3, foreach=True)\n"
    out = apply(text, [edits.optimizer_args("t.py", 1, "torch.optim.Adam", {"fused": True})])
    assert out.text == text and "foreach=True" in out.skipped[0][1]


def test_no_grad_wrap_uses_the_modules_alias_of_torch():
    text = "import torch as th\n\n\ndef ev(m, xs):\n    for x in xs:\n        m(x)\n"
    out = apply(text, [edits.wrap("t.py", 6, "torch.no_grad()")])
    assert out.text == "import torch as th\n\n\ndef ev(m, xs):\n    with th.no_grad():\n        for x in xs:\n            m(x)\n"
    again = apply(out.text, [edits.wrap("t.py", 7, "torch.no_grad()")])
    assert again.done == () and "already under" in again.skipped[0][1]


def test_crlf_line_endings_and_encoding_are_kept():
    data = "# -*- coding: latin-1 -*-\r\nimport torch\r\n# caf\xe9\r\nopt = torch.optim.SGD(p, lr=0.1)\r\n".encode("latin-1")
    dec = decode_source(data)
    assert dec.encoding == "iso-8859-1"  # tokenize names latin-1 so
    out = apply(dec.text, [edits.optimizer_args("t.py", 4, "torch.optim.SGD", {"fused": True})])
    assert encode_like(out.text, dec) == data.replace(b"lr=0.1)", b"lr=0.1, fused=True)")


def test_an_unparseable_text_raises_and_a_file_that_changed_is_refused():
    with pytest.raises(RewriteError, match="cannot parse"):
        apply("for x in :\n", [edits.wrap("t.py", 1, "torch.no_grad()")])
    out = apply("x = 1\n", [edits.optimizer_args("t.py", 1, "torch.optim.SGD", {"fused": True})])
    assert out.done == () and "has the file changed" in out.skipped[0][1]


def test_snippet_is_the_statement_before_and_after():
    cut = snippet(LOADER, [edits.dataloader_args("t.py", 7, {"pin_memory": True})])
    assert cut.line == 7
    assert cut.before == "loader = DataLoader(ds, batch_size=4,   shuffle=True, collate_fn=pad)  # trailing comment"
    assert cut.after == "loader = DataLoader(ds, batch_size=4,   shuffle=True, collate_fn=pad, pin_memory=True)  # trailing comment"


def _many_loaders(n: int) -> str:
    head = "import torch\nfrom torch.utils.data import DataLoader\n\n"
    body = "".join(f"\ndef train_{i}(ds, model):\n    loader = DataLoader(ds, batch_size=32)\n"
                   f"    for x, y in loader:\n        x = x.cuda()\n        model(x).sum().backward()\n"
                   for i in range(n))
    return head + body


def _loader_and_copy_edits(text: str) -> list:
    """A check's order: one rule's edits down the file, then another's from its top again."""
    lines = text.splitlines()
    loaders = [i for i, x in enumerate(lines, 1) if "DataLoader(ds" in x]
    copies = [i for i, x in enumerate(lines, 1) if "x.cuda()" in x]
    return ([edits.dataloader_args("t.py", n, {"pin_memory": True}) for n in loaders]
            + [edits.non_blocking("t.py", n, "cuda") for n in copies])


def test_edits_in_a_part_parsed_again_after_it_left_the_cache_are_made(monkeypatch):
    # a part that left the source's cache (it keeps the last MAX_PARTS) and is asked for again is parsed
    # again; its edits must be planned on the one index (the first parse), or spans raised KeyError
    from gpudoctor.rewrite import parts as rewrite_parts
    monkeypatch.setattr(rewrite_parts, "MAX_PARTS", 3)
    text = _many_loaders(200)
    todo = _loader_and_copy_edits(text)
    out = apply(text, todo)
    assert out.skipped == () and len(out.done) == len(todo) == 400
    assert out.text.count("pin_memory=True") == 200 and out.text.count("x.cuda(non_blocking=True)") == 200
    assert len(out.spans) == 400


@pytest.mark.slow
def test_a_600_kb_file_takes_every_edit():
    # over MAX_PARTS parts (the promise: a file up to 1 MiB is rewritten); the reviewer's k560.py crashed
    text = _many_loaders(4100)
    assert len(text) > 600_000
    todo = _loader_and_copy_edits(text)
    out = apply(text, todo)
    assert out.skipped == () and len(out.done) == len(todo)


MIXED_HEAD = "import torch\r\nfrom torch.utils.data import DataLoader\r\n\r\n"
MIXED_BODY = ("\ndef main():\n    loader = DataLoader(\n        ds,\n        batch_size=4,\n    )\n"
              "    return loader\n")


def test_a_line_added_to_a_file_of_mixed_newlines_ends_as_the_lines_around_it():
    """Lines added in the \\n part of a file whose first line ends in \\r\\n ended in \\r\\n (LibCST takes a
    module's newline from its first line), and the line before them was changed to \\r\\n too."""
    text = MIXED_HEAD + MIXED_BODY
    out = apply(text, [edits.dataloader_args("t.py", 8, {"num_workers": 2, "pin_memory": True})])
    assert out.done and out.text == MIXED_HEAD + MIXED_BODY.replace(
        "        batch_size=4,\n", "        batch_size=4,\n        num_workers=2,\n        pin_memory=True,\n")
    # and the other way round: an insert after \r\n imports in a file whose body ends lines in \n
    text = "import torch\nimport os\n" + MIXED_BODY.replace("\n", "\r\n")
    out = apply(text, [edits.at_startup("t.py", 1, "torch.backends.cudnn.benchmark = True")])
    assert out.done and "\r\ntorch.backends.cudnn.benchmark = True\r\n" not in out.text
    assert "import os\n\ntorch.backends.cudnn.benchmark = True\n" in out.text
    assert out.text.count("\r\n") == text.count("\r\n")
