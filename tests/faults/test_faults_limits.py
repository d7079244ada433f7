"""Input at the limits: nesting no trace has, and more memory than the process may use (issue: hold the
contract at the edges, item 4). Each gives exit 2 and one line that says what to do, never "internal error"."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from faultlib import gd, gd_lines

import gpudoctor.cli as cli

DEPTH = 200_000


@pytest.mark.parametrize("shape", ["arrays", "objects"])
def test_a_trace_nested_200000_levels_deep_is_exit_2(shape: str, tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    if shape == "arrays":
        path.write_text('{"traceEvents": [' + "[" * DEPTH + "]" * DEPTH + "]}")
    else:
        path.write_text('{"traceEvents": [{"ph": "X", "name": "a", "args": ' + '{"a": ' * DEPTH + "1"
                        + "}" * DEPTH + "}]}")
    done = gd("analyze", path, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    (line,) = gd_lines(done.stderr)
    assert "nests deeper" in line and "internal error" not in line and "Traceback" not in done.stderr


def _main_raising(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], err: BaseException,
                  tmp_path: Path) -> tuple[int, str]:
    def boom(*_a, **_k):
        raise err

    monkeypatch.setattr(cli, "load_and_analyze", boom)
    monkeypatch.setattr(sys, "argv", ["gpudoctor", "analyze", str(tmp_path)])
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    return int(exit_.value.code), capsys.readouterr().err


def test_running_out_of_memory_is_exit_2_with_what_to_do(monkeypatch, capsys, tmp_path: Path) -> None:
    """Under `ulimit -v` a large trace raised MemoryError, reported as "internal error ... please report it"."""
    code, err = _main_raising(monkeypatch, capsys, MemoryError(), tmp_path)
    assert code == 2
    assert err.count("\n") == 1 and "out of memory" in err and "ulimit" in err and "internal error" not in err


def test_a_recursion_error_anywhere_is_exit_2(monkeypatch, capsys, tmp_path: Path) -> None:
    code, err = _main_raising(monkeypatch, capsys, RecursionError("maximum recursion depth exceeded"), tmp_path)
    assert code == 2 and err.count("\n") == 1 and "nests deeper" in err


def test_an_internal_error_is_one_short_line(monkeypatch, capsys, tmp_path: Path) -> None:
    """A KeyError whose key was a whole LibCST node filled the terminal with its repr (the 560 KB --diff)."""
    monkeypatch.delenv("GPUDOCTOR_DEBUG", raising=False)
    code, err = _main_raising(monkeypatch, capsys, KeyError("Node(\n" + "    value='',\n" * 5000 + ")"), tmp_path)
    assert code == 4 and err.count("\n") == 1
    assert "internal error: KeyError" in err and "GPUDOCTOR_DEBUG" in err and len(err) < 400
