"""Every field of every run file is untrusted (issue 41, case 5): a value that does not fit its type
and range is dropped with a note or rejected with exit 2, never an internal error (exit 4).

A 400-digit integer in ``steps.jsonl`` gave ``OverflowError`` and exit 4 in ``analyze`` and
``compare``. The property test mutates one field (or a whole record) of a small valid run directory
(``manifest.json``, ``settings.json``, ``steps.jsonl``, ``samples.jsonl``, and ``report.json``
with a verification, which ``analyze`` carries over) to huge integers, NaN and infinities, negative
numbers, other types and deep nesting, and runs the command line in this process.
"""

from __future__ import annotations

import contextlib
import copy
import gzip
import io
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "gpu" / "grad_accumulation_slow_collate"
FILES = ("manifest.json", "settings.json", "steps.jsonl", "samples.jsonl", "report.json")
RAW = "__raw_json_text__"  # a value written as raw JSON text (what json.dumps cannot write: 5000 digits)


def run_cli(*args: str) -> tuple[int, str]:
    """``gpudoctor ARGS`` in this process, through the entry point's error handling: (exit code, stderr)."""
    from gpudoctor import cli

    err, out = io.StringIO(), io.StringIO()
    argv, sys.argv = sys.argv, ["gpudoctor", *args]
    code: Any = 0
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            cli._main()
    except SystemExit as e:
        code = e.code
    finally:
        sys.argv = argv
    return (code if isinstance(code, int) else 0 if code is None else 1), err.getvalue()


@pytest.fixture(scope="module")
def base_run(tmp_path_factory) -> Path:
    """The recorded run's records (no trace), samples cut to 20 lines, and a ``report.json`` whose
    findings carry a verification (as after ``gpudoctor verify``)."""
    from gpudoctor.model import Injection, Report, Verification, VerifyStatus

    if not (FIXTURE / "manifest.json.gz").is_file():
        pytest.skip("tests/fixtures/gpu has no grad_accumulation_slow_collate")
    run = tmp_path_factory.mktemp("fields") / "run"
    run.mkdir()
    for name in FILES[:4]:
        with gzip.open(FIXTURE / f"{name}.gz", "rt", encoding="utf-8") as fh:
            text = fh.read()
        if name == "samples.jsonl":
            text = "\n".join(text.splitlines()[:20]) + "\n"
        (run / name).write_text(text, encoding="utf-8")
    code, err = run_cli("analyze", str(run), "--format", "json")
    assert code == 0, err
    report = json.loads((run / "report.json").read_text(encoding="utf-8"))
    assert report["findings"], "the run must have a finding to carry a verification"
    v = Verification(VerifyStatus.CONFIRMED, "1.5x faster", changes=(Injection("dataloader", "num_workers", 4),),
                     speedup=1.5, ci=(1.2, 1.8), p_value=0.01, trials=3, baseline_runs=3, steps=20,
                     baseline_step_ns=30_000_000, trial_step_ns=20_000_000)
    for f in report["findings"]:
        f["verification"] = v.to_dict()
    Report.from_dict(report)
    (run / "report.json").write_text(json.dumps(report), encoding="utf-8")
    return run


def _load(run: Path, name: str) -> Any:
    text = (run / name).read_text(encoding="utf-8")
    return [json.loads(x) for x in text.splitlines() if x.strip()] if name.endswith(".jsonl") else json.loads(text)


def _dump(data: Any, raw: str | None) -> str:
    def one(obj: Any) -> str:
        text = json.dumps(obj)
        return text.replace(json.dumps(RAW), raw) if raw is not None else text

    return "\n".join(one(r) for r in data) + "\n" if isinstance(data, list) else one(data)


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every field (and every object and list) of ``obj``, two items of each list."""
    out = [prefix] if prefix else []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:2]):
            out += _paths(v, (*prefix, i))
    return out


def _targets(run: Path, name: str) -> list[tuple[Any, ...]]:
    data = _load(run, name)
    if name == "report.json":  # the part `analyze` reads of it: the verifications it carries over
        return [p for p in _paths(data) if p[:3] == ("findings", 0, "verification")]
    if isinstance(data, list):  # a record of each kind (samples: meta, gpu, process, host), and a whole record
        first: dict[Any, int] = {}
        for i, row in enumerate(data):
            first.setdefault(row.get("kind"), i)
        return [(i, *p) for i in first.values() for p in [(), *_paths(data[i])]] if first else []
    return _paths(data)


BAD_NUMBERS = st.one_of(
    st.integers(min_value=2**63, max_value=10**400),
    st.integers(min_value=-(10**400), max_value=-(2**63) - 1),
    st.sampled_from([float("nan"), float("inf"), float("-inf"), 1e308, -1e308, -1, -1.5, 0, 2**63 - 1]),
    st.floats(allow_nan=True, allow_infinity=True),
)
OTHER_TYPES = st.one_of(
    st.text(max_size=8), st.booleans(), st.none(), st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.integers(min_value=1, max_value=200).map(lambda n: json.loads("[" * n + "]" * n)),  # nested lists
)
RAW_TEXT = st.sampled_from(["9" * 5000, "-" + "9" * 5000, "[" * 100_000 + "]" * 100_000, "1e999999"])


@st.composite
def mutations(draw: st.DrawFn) -> tuple[str, tuple[Any, ...], Any, str | None]:
    name = draw(st.sampled_from(FILES))
    path = draw(st.sampled_from(_TARGETS[name]))
    raw = draw(st.one_of(st.none(), st.none(), st.none(), RAW_TEXT))
    value = RAW if raw is not None else draw(st.one_of(BAD_NUMBERS, OTHER_TYPES))
    return name, path, value, raw


_TARGETS: dict[str, list[tuple[Any, ...]]] = {}


def _mutated(base: Path, into: Path, name: str, path: tuple[Any, ...], value: Any, raw: str | None) -> None:
    shutil.copytree(base, into)
    data = copy.deepcopy(_load(base, name))
    cur = data
    for key in path[:-1]:
        cur = cur[key]
    cur[path[-1]] = value
    (into / name).write_text(_dump(data, raw), encoding="utf-8")


def _assert_handled(code: int, err: str, what: object) -> None:
    assert code in (0, 2), (what, code, err[-600:])
    assert "internal error" not in err and "Traceback" not in err, (what, err[-600:])


@pytest.mark.parametrize("command", ["analyze", "compare"])
@pytest.mark.parametrize("digits", [400, 5000])
def test_a_huge_integer_in_steps_is_bad_input_not_an_internal_error(base_run, tmp_path, monkeypatch, command, digits):
    """The issue's case: a 400-digit ``wall_ns`` gave OverflowError, exit 4; the record is dropped with a note."""
    monkeypatch.delenv("GPUDOCTOR_DEBUG", raising=False)
    bad = tmp_path / "bad"
    _mutated(base_run, bad, "steps.jsonl", (3, "wall_ns"), RAW, "9" * digits)
    args = ("analyze", str(bad)) if command == "analyze" else ("compare", str(base_run), str(bad))
    code, err = run_cli(*args)
    _assert_handled(code, err, command)
    assert code == 0
    if command == "analyze":
        report = json.loads((bad / "report.json").read_text(encoding="utf-8"))
        notes = " ".join(report["run"]["notes"])
        assert "steps.jsonl: 1 record(s)" in notes or "steps.jsonl: 1 unreadable line(s) skipped" in notes, notes


def test_every_field_out_of_type_or_range_is_a_note_or_exit_2(base_run, monkeypatch):
    monkeypatch.delenv("GPUDOCTOR_DEBUG", raising=False)
    for name in FILES:
        _TARGETS[name] = _targets(base_run, name)
        assert _TARGETS[name], name

    @settings(max_examples=120, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(mutation=mutations(), command=st.sampled_from(["analyze", "compare"]))
    def prop(mutation: tuple[str, tuple[Any, ...], Any, str | None], command: str) -> None:
        name, path, value, raw = mutation
        with tempfile.TemporaryDirectory() as tmp:
            bad = Path(tmp) / "run"
            _mutated(base_run, bad, name, path, value, raw)
            args = ("analyze", str(bad)) if command == "analyze" else ("compare", str(base_run), str(bad))
            code, err = run_cli(*args)
        _assert_handled(code, err, (command, name, path, repr(value)[:60], (raw or "")[:12]))

    prop()
