"""The pieces the fault suite relies on, one by one: safe text and paths, checked manifests, writes that fail."""

from __future__ import annotations

import errno
import json
import os
import re
from pathlib import Path

import pytest

from gpudoctor import safe
from gpudoctor.collect import rundir
from gpudoctor.model import Edit, Manifest
from gpudoctor.model._serde import FieldTypeError, check

# --------------------------------------------------------------------------- gpudoctor.safe


def test_terminal_line_escapes_every_control_character() -> None:
    assert safe.terminal_line("a\x1b[31mb\x07\nc\td") == "a\\x1b[31mb\\x07\\x0ac\\x09d"
    assert safe.terminal_line("\u202eevil") == "\\u202eevil"  # a bidirectional override
    assert safe.terminal_line("plain ünïcode · ok") == "plain ünïcode · ok"
    assert safe.clean("keeps\nnewlines\tand tabs\x1b") == "keeps\nnewlines\tand tabs\\x1b"


def test_inside_refuses_every_way_out(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "sub").mkdir(parents=True)
    (run / "sub" / "t.json").write_text("{}")
    (tmp_path / "secret").write_text("x")
    (run / "out").symlink_to(tmp_path / "secret")
    (run / "in").symlink_to(run / "sub" / "t.json")
    assert safe.inside(run, "sub/t.json") == (run / "sub" / "t.json").resolve()
    assert safe.inside(run, "in") == (run / "sub" / "t.json").resolve()
    for bad in ("/etc/passwd", "../secret", "sub/../../secret", "out", "", ".", "a\x00b"):
        assert safe.inside(run, bad) is None, bad
    assert safe.inside(run, 42) is None


def test_not_regular_names_the_kind(tmp_path: Path) -> None:
    fifo = tmp_path / "p"
    os.mkfifo(fifo)
    (tmp_path / "f").write_text("x")
    assert safe.not_regular(fifo) == "a FIFO (named pipe)"
    assert safe.not_regular(Path("/dev/null")) == "a character device"
    assert safe.not_regular(tmp_path / "f") == ""
    assert safe.not_regular(tmp_path) == "a folder" and safe.not_regular(tmp_path, dir_ok=True) == ""
    assert safe.not_regular(tmp_path / "missing") == ""


# --------------------------------------------------------------------------- manifests are type-checked


def _manifest() -> dict:
    return Manifest(schema_version=1, gpudoctor_version="0", run_id="r", command=(), script=None, module=None,
                    argv=(), cwd="/", started_at="", started_at_unix_ns=0).to_dict()


@pytest.mark.parametrize(
    ("change", "field", "says"),
    [
        ({"traces": 42}, "traces", "must be a list of strings, not int 42"),
        ({"traces": ["a", 3]}, "traces[1]", "must be a string"),
        ({"status": "exploded"}, "status", "must be one of 'completed'"),
        ({"exit_code": True}, "exit_code", "must be an integer or null, not true"),
        ({"collected": [{"name": "x", "ok": "yes"}]}, "collected[0].ok", "must be true or false"),
        ({"versions": {"torch": 2}}, "versions.torch", "must be a string"),
        ({"write_errors": [{"path": "x"}]}, "write_errors[0].error", "is missing"),
    ],
)
def test_check_names_the_field(change: dict, field: str, says: str) -> None:
    data = {**_manifest(), **change}
    with pytest.raises(FieldTypeError) as err:
        check(Manifest, data)
    assert err.value.field == field and says in str(err.value)


def test_check_accepts_what_to_dict_writes_and_old_manifests() -> None:
    data = _manifest()
    check(Manifest, data)
    old = {k: v for k, v in data.items() if k not in ("write_errors", "rank_ends")}  # written before these fields
    check(Manifest, old)
    assert Manifest.from_dict(old).write_errors == ()



def test_check_takes_a_fixed_tuple_item_by_item() -> None:
    """``tuple[str, int]`` (an edit's keyword positions): each item against its own type, as many as
    there are types; ``to_dict``'s output is accepted (both items were once checked as the first: a
    position 5 and a keyword removed, None, made a report.json malformed)."""
    edit = Edit("call_args", "train.py", 31, args=(("num_workers", "4"), ("pin_memory", None)),
                positions=(("batch_size", 1), ("num_workers", 5)))
    check(Edit, edit.to_dict())
    for bad, says in ((["num_workers", "5"], "positions[0][1]' must be an integer"),
                      (["num_workers"], "positions[0]' must be a list of 2 items (a string, an integer)"),
                      (["num_workers", 5, 6], "positions[0]' must be a list of 2 items")):
        with pytest.raises(FieldTypeError, match=re.escape(says)):
            check(Edit, {**edit.to_dict(), "positions": [bad]})


# --------------------------------------------------------------------------- writes that fail


def test_a_jsonl_writer_records_a_full_disk_and_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = rundir.JsonlWriter(tmp_path / "steps.jsonl")
    real_write = os.write
    budget = [150]

    def write(fd: int, data: bytes) -> int:
        if budget[0] <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = real_write(fd, bytes(data)[: budget[0]])
        budget[0] -= n
        return n

    monkeypatch.setattr(rundir.os, "write", write)
    for i in range(10):
        w.write({"index": i, "pad": "x" * 20})
    w.close()
    assert w.error == "No space left on device (ENOSPC)"
    assert w.lines_written + w.lines_lost == 10 and 0 < w.lines_written < 10
    assert "not written after the first" in w.lost_text()
    assert rundir.repair_jsonl(tmp_path / "steps.jsonl")  # the torn line it left is cut
    assert len(rundir.read_jsonl(tmp_path / "steps.jsonl")) == w.lines_written


def test_an_atomic_write_that_fails_leaves_the_old_file_and_no_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "settings.json"
    target.write_text('{"old": true}')

    def refuse(src: object, dst: object) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(rundir.os, "replace", refuse)
    with pytest.raises(OSError) as err:
        rundir.write_json_atomic(target, {"new": True})
    assert rundir.os_reason(err.value) == "Read-only file system (EROFS)"
    assert json.loads(target.read_text()) == {"old": True}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["settings.json"]


def test_the_manifest_reserve_takes_the_last_write_in_place(tmp_path: Path) -> None:
    path = tmp_path / "manifest.json"
    rundir.write_json_atomic(path, {"status": "running"}, reserve_bytes=4096)
    assert json.loads(path.read_text()) == {"status": "running"}  # padded, still JSON
    size = path.stat().st_size
    rundir.rewrite_json_in_place(path, {"status": "completed", "collected": ["x"] * 50})
    assert path.stat().st_size == size and json.loads(path.read_text())["status"] == "completed"
    with pytest.raises(OSError) as err:
        rundir.rewrite_json_in_place(path, {"big": "y" * 10_000})
    assert err.value.errno == errno.ENOSPC
    assert json.loads(path.read_text())["status"] == "completed"  # untouched when it does not fit


def test_kineto_leftovers_are_settled(tmp_path: Path) -> None:
    whole = tmp_path / "h_1.00000002.pt.trace.json"
    (tmp_path / (whole.name + ".tmp")).write_text('{"traceEvents": []}\n')  # the rename Kineto could not do
    assert rundir.settle_trace_export(whole) == ""
    assert json.loads(whole.read_text()) == {"traceEvents": []}
    cut = tmp_path / "h_1.00000009.pt.trace.json"
    (tmp_path / (cut.name + ".tmp")).write_text('{"traceEvents": [{"ph": "X"')  # a write that stopped
    why = rundir.settle_trace_export(cut)
    assert why and not cut.exists()
    assert (tmp_path / (cut.name + ".incomplete")).read_text().startswith('{"traceEvents"')
    assert "Kineto wrote no file" in rundir.settle_trace_export(tmp_path / "none.pt.trace.json")
    # cut right after an event's closing brace (seen on a full tmpfs): not taken for the end
    brace = tmp_path / "h_1.00000012.pt.trace.json"
    (tmp_path / (brace.name + ".tmp")).write_text('{"traceEvents": [\n  {\n    "args": {\n      "Ev Idx": 283\n    }\n  }')
    assert rundir.settle_trace_export(brace) and (tmp_path / (brace.name + ".incomplete")).is_file()
    kineto = tmp_path / "h_1.00000020.pt.trace.json"
    kineto.write_text('{"traceEvents": [\n  {"ph": "i"}\n  ],"traceName": "runs/a\\"b.pt.trace.json" }')
    assert rundir.settle_trace_export(kineto) == ""


def test_cprofile_that_cannot_be_written_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpudoctor.collect import schedule as sched
    from gpudoctor.collect.steps import cprofile_window

    def full(path: Path, data: bytes, sync: bool = False) -> None:
        raise OSError(errno.EFBIG, os.strerror(errno.EFBIG))

    monkeypatch.setattr(cprofile_window, "write_bytes_atomic", full)
    window = cprofile_window.CprofileWindow(True, 0, 5, sched.CprofileBudget(), tmp_path / "profile.pstats")
    window.on_step_start(0, [])
    assert window.resume_after_bookkeeping(0)  # the boundary's last act: the window records step 0
    sum(range(1000))
    window.stop()
    assert window.write_error == "File too large (EFBIG)"
    assert not (tmp_path / "profile.pstats").exists()
