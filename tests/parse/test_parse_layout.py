"""The run directory's layout (``model.layout``): one set of names for collect, parse, the CLI and view."""

from __future__ import annotations

import pytest

from gpudoctor.collect import rundir as collect_rundir
from gpudoctor.model import SCHEMA_VERSION, layout
from gpudoctor.parse import rundir as parse_rundir


@pytest.mark.parametrize("name", [layout.STEPS, layout.SETTINGS, layout.PSTATS, layout.CHILD_STATE, layout.SAMPLES])
def test_rank_tags_round_trip(tmp_path, name) -> None:
    tagged = layout.rank_tagged(name, 3)
    assert layout.rank_of(tagged, name) == 3
    assert layout.rank_of(name, name) is None
    (tmp_path / tagged).write_text("{}")
    assert [p.name for p in tmp_path.glob(layout.rank_glob(name))] == [tagged]
    assert layout.rank_tagged(name, None) == name


def test_the_names_are_those_of_the_docs() -> None:
    assert layout.rank_tagged(layout.STEPS, 3) == "steps.rank3.jsonl"
    assert layout.rank_tagged(layout.CHILD_STATE, 1) == ".child-state.rank1.json"
    assert layout.rank_of("steps.rankX.jsonl", layout.STEPS) is None
    assert layout.trace_name("host_12", 7) == "host_12.00000007.pt.trace.json.gz"
    assert layout.plain_trace(layout.trace_name("h", 1)) == "h.00000001.pt.trace.json"
    assert layout.lock_name(layout.VERIFY_DIR) == ".verify.lock"
    assert SCHEMA_VERSION == layout.SCHEMA_VERSION


def test_collect_and_parse_read_the_same_names() -> None:
    for name in ("MANIFEST", "SETTINGS", "STEPS", "SAMPLES", "PSTATS", "CHILD_STATE"):
        assert getattr(collect_rundir, name) == getattr(parse_rundir, name) == getattr(layout, name)
    assert parse_rundir.TRACE_GLOBS == layout.TRACE_GLOBS
    assert collect_rundir.TRACE_SUFFIX == layout.TRACE_SUFFIX


def test_parse_finds_every_rank_tagged_copy(tmp_path) -> None:
    """The training processes' own accounts of a torchrun job are read by rank, as the other files."""
    for rank in (1, 0):
        (tmp_path / layout.rank_tagged(layout.CHILD_STATE, rank)).write_text("{}")
    (tmp_path / layout.rank_tagged(layout.STEPS, 2)).write_text("")
    assert [r for r, _ in parse_rundir.rank_files(tmp_path, layout.CHILD_STATE)] == [0, 1]
    assert [r for r, _ in parse_rundir.rank_files(tmp_path, layout.STEPS)] == [2]
    assert layout.is_run_dir(tmp_path) is False  # rank-tagged files alone do not make a run directory
    (tmp_path / layout.MANIFEST).write_text("{}")
    assert layout.is_run_dir(tmp_path)
