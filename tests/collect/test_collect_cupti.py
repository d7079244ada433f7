"""TEARDOWN_CUPTI in the training process (collect.cupti): the environment the script gets in each
case, the static read for CUDA graphs, the run-time guard, and what the manifest records."""

from __future__ import annotations

import os
import textwrap
import types
from pathlib import Path

import pytest
from collect_testlib import manifest, only_run_dir, run_profile

from gpudoctor.collect import child_account, cupti
from gpudoctor.collect.child import Child

SCHEDULE = {"skip_first": 2, "wait": 2, "warmup": 1, "active": 2, "repeat": 1,
            "record_shapes": False, "with_stack": False, "profile_memory": False}


def _no_read() -> str | None:
    raise AssertionError("the source is read only before CUDA 12.6")


# --------------------------------------------------------------------------- the rule


def test_the_users_value_is_left_as_it_is():
    for value in ("0", "1", ""):
        env = {cupti.ENV: value}
        d = cupti.decide(env, "12.8", True, _no_read)
        cupti.apply(d, env)
        assert env == {cupti.ENV: value} and d.value is None and "set by the user" in d.why


def test_cuda_12_6_and_later_tear_down_without_reading_the_source():
    for version in ("12.6", "12.8", "13.0"):
        env: dict[str, str] = {}
        d = cupti.decide(env, version, True, _no_read)
        cupti.apply(d, env)
        assert env == {cupti.ENV: "1"} and not d.guard


def test_before_12_6_cuda_graphs_in_the_script_keep_cupti_attached():
    env: dict[str, str] = {}
    d = cupti.decide(env, "12.4", True, lambda: "train.py:12")
    cupti.apply(d, env)
    assert env == {} and "train.py:12" in d.why and "12.4 < 12.6" in d.why


def test_before_12_6_without_graphs_it_tears_down_under_the_guard():
    env: dict[str, str] = {}
    d = cupti.decide(env, "11.8", True, lambda: "")
    cupti.apply(d, env)
    assert env == {cupti.ENV: "1"} and d.guard


def test_nothing_is_set_where_nothing_can_be_said():
    cases = [("12.4", True, lambda: None),  # the source could not be read
             (None, True, _no_read),  # a CPU (or ROCm) build: no CUPTI
             ("12.8", False, _no_read),  # no profiler window of gpudoctor's
             ("twelve", True, _no_read)]
    for version, profiling, site in cases:
        env: dict[str, str] = {}
        d = cupti.decide(env, version, profiling, site)
        cupti.apply(d, env)
        assert env == {} and d.value is None and d.why


# --------------------------------------------------------------------------- the static read


@pytest.mark.parametrize(("code", "line"), [
    ("import torch\ng = torch.cuda.CUDAGraph()\n", 2),
    ("import torch\nx = 1\nwith torch.cuda.graph(g):\n    y = model(x)\n", 3),
    ("from torch.cuda import graph\n", 1),
    ("from torch.cuda import make_graphed_callables\n", 1),
    ("import torch\nm = torch.cuda.make_graphed_callables(m, (x,))\n", 2),
    ("import torch\nm = torch.compile(m, mode='reduce-overhead')\n", 2),
    ("import torch\nm = torch.compile(m, mode='max-autotune')\n", 2),
    ("import torch\nm = torch.compile(m, options={'triton.cudagraphs': True})\n", 2),
    ("import torch._inductor.config as c\nc.triton.cudagraphs = True\n", 2),
])
def test_cuda_graphs_are_seen_in_the_source(code, line):
    assert cupti.cuda_graph_site(code, "/x/train.py") == f"train.py:{line}"


@pytest.mark.parametrize("code", [
    "import torch\nm = torch.compile(m)\n",
    "import torch\nm = torch.compile(m, mode='max-autotune-no-cudagraphs')\n",
    "import networkx as nx\ng = nx.graph(edges)\nself.graph = g\n",
    "import torch\nx = torch.cuda.Event(enable_timing=True)\n",
])
def test_other_code_is_not_taken_for_cuda_graphs(code):
    assert cupti.cuda_graph_site(code, "train.py") == ""


def test_an_unreadable_source_counts_as_unread(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def (:\n")
    assert cupti.read_graph_site(str(bad)) is None
    assert cupti.read_graph_site(str(tmp_path / "missing.py")) is None
    assert cupti.read_graph_site(None) is None


# --------------------------------------------------------------------------- the run-time guard


class _Graph:
    captures = 0

    def capture_begin(self, pool=None):  # noqa: ANN001, ANN201
        type(self).captures += 1
        return pool


def test_a_capture_at_run_time_turns_teardown_off_once():
    env = {cupti.ENV: "1"}
    graph_cls = type("G", (_Graph,), {"captures": 0})
    guard = cupti.GraphGuard(graph_cls, env, lambda: 7)
    assert guard.install() == ""
    assert graph_cls().capture_begin(pool=3) == 3 and graph_cls.captures == 1  # the capture still runs
    assert env == {cupti.ENV: "0", cupti.LAZY_REINIT_ENV: "1"}
    assert guard.note() == "a CUDA graph capture began at step 7: TEARDOWN_CUPTI=0 from then on (CUDA < 12.6)"


def test_the_guard_leaves_a_value_the_script_set_itself():
    env = {cupti.ENV: "1"}
    graph_cls = type("G", (_Graph,), {"captures": 0})
    guard = cupti.GraphGuard(graph_cls, env, lambda: 0)
    guard.install()
    env[cupti.ENV] = "2"  # the script's own os.environ
    graph_cls().capture_begin()
    assert env == {cupti.ENV: "2"} and guard.note() == ""
    assert cupti.GraphGuard(object, env, lambda: 0).install()  # nothing to wrap: says why


# --------------------------------------------------------------------------- the training process


def _child(tmp_path: Path, script: str | None, schedule: bool = True) -> Child:
    cfg = {"run_dir": str(tmp_path), "t0_mono_ns": 0, "argv": ["train.py"], "script_path": script,
           "schedule": SCHEDULE if schedule else None}
    return Child(cfg)


def _fake_torch(cuda: str | None) -> types.SimpleNamespace:
    graph_cls = type("CUDAGraph", (_Graph,), {"captures": 0})
    return types.SimpleNamespace(version=types.SimpleNamespace(cuda=cuda), cuda=types.SimpleNamespace(CUDAGraph=graph_cls))


@pytest.mark.parametrize(("user", "cuda", "graphs", "expect", "ok"), [
    ("0", "12.8", False, "0", False),  # the user's value wins
    (None, "12.8", True, "1", True),  # default, CUDA ≥ 12.6 (graphs or not)
    (None, "12.4", True, None, False),  # CUDA graphs before 12.6: left unset
    (None, "12.4", False, "1", True),  # no graphs before 12.6: set, under the guard
    (None, None, False, None, False),  # a CPU build
])
def test_the_environment_the_training_process_gets(tmp_path, monkeypatch, user, cuda, graphs, expect, ok):
    monkeypatch.delenv(cupti.ENV, raising=False)
    monkeypatch.delenv(cupti.LAZY_REINIT_ENV, raising=False)
    if user is not None:
        monkeypatch.setenv(cupti.ENV, user)
    script = tmp_path / "train.py"
    script.write_text("import torch\n" + ("g = torch.cuda.CUDAGraph()\n" if graphs else "x = 1\n"))
    child = _child(tmp_path, str(script))
    torch = _fake_torch(cuda)
    child._cupti_teardown(torch)
    assert os.environ.get(cupti.ENV) == expect
    entry = child_account.collected_cupti(child)
    assert entry.name == "cupti_teardown" and entry.ok is ok and (entry.detail if ok else entry.reason)
    assert (child.cupti_guard is not None) == (cuda == "12.4" and not graphs)
    if child.cupti_guard is not None:
        torch.cuda.CUDAGraph().capture_begin()  # a graph from a module the script imports
        assert os.environ.get(cupti.ENV) == "0"
        assert "a CUDA graph capture began" in child_account.collected_cupti(child).detail


@pytest.mark.slow
def test_profile_records_the_decision_and_the_script_sees_the_users_value(tmp_path, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import os
        import torch
        m = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for _ in range(8):
            m(torch.randn(2, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
        print("TEARDOWN_CUPTI=" + repr(os.environ.get("TEARDOWN_CUPTI")))
    """))
    runs = {}
    for user in ("0", None):
        monkeypatch.delenv(cupti.ENV, raising=False)
        if user is not None:
            monkeypatch.setenv(cupti.ENV, user)
        out = tmp_path / f"out-{user}"
        proc = run_profile("--out", str(out), "--skip-first", "2", "--warmup", "1", "--active", "2", "--repeat", "1",
                           "--no-cprofile", str(script), cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        entry = next(c for c in manifest(only_run_dir(out))["collected"] if c["name"] == "cupti_teardown")
        seen = [line for line in proc.stdout.splitlines() if line.startswith("TEARDOWN_CUPTI=")]  # the report follows
        runs[user] = (seen[0] if seen else "", entry)
    assert runs["0"][0] == "TEARDOWN_CUPTI='0'" and runs["0"][1]["ok"] is False
    assert "set by the user (TEARDOWN_CUPTI=0)" in runs["0"][1]["reason"]
    import torch  # noqa: PLC0415 - what this machine's torch is decides the default (no CUDA graph in the script)

    want = cupti.decide({}, torch.version.cuda, True, lambda: "")
    assert runs[None][0] == f"TEARDOWN_CUPTI={want.value!r}"
    assert runs[None][1]["ok"] is (want.value == "1")
    if not torch.version.cuda:  # a CPU build: no CUPTI, nothing set
        assert want.value is None and "no CUDA" in runs[None][1]["reason"]
