"""The parent's trace compressor runs at the lowest CPU priority, and only its own thread does."""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

import pytest

from gpudoctor.collect import finish
from gpudoctor.model import layout

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")


def _nice_of_thread(target) -> int:
    seen: list[int] = []

    def body() -> None:
        target()
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))

    t = threading.Thread(target=body)
    t.start()
    t.join()
    return seen[0]


def test_the_compressing_thread_gets_nice_19_and_the_rest_of_the_process_keeps_its_own():
    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert _nice_of_thread(finish._lower_this_threads_priority) == finish.COMPRESS_NICE == 19
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before  # this thread untouched
    assert _nice_of_thread(lambda: None) == before  # nor the threads started after it


def test_the_compressor_still_compresses_what_the_training_process_lists(tmp_path: Path):
    """At nice 19 on an idle machine the trace is gzipped while the run goes on, as before."""
    name = "host_1.0.pt.trace.json.gz"
    (tmp_path / name.removesuffix(".gz")).write_text(json.dumps({"traceEvents": []}), encoding="utf-8")
    (tmp_path / layout.CHILD_STATE).write_text(json.dumps({"traces": [name]}), encoding="utf-8")
    comp = finish.TraceCompressor(tmp_path, interval_s=0.01)
    comp.start()
    try:
        deadline = threading.Event()
        for _ in range(500):
            if (tmp_path / name).is_file() and not (tmp_path / name.removesuffix(".gz")).exists():
                break
            deadline.wait(0.02)
    finally:
        comp.stop()
    assert (tmp_path / name).is_file() and not (tmp_path / name.removesuffix(".gz")).exists()


DUMP = """Fatal Python error: Segmentation fault

Thread 0x00007f0000000002 (most recent call first):
  File "/usr/lib/python3.12/threading.py", line 331 in wait

Current thread 0x00007f0000000001 (most recent call first):
  File "/venv/lib/python3.12/site-packages/torch/_dynamo/eval_frame.py", line 632 in _fn
  File "/home/me/proj/train.py", line 41 in step
  File "/home/me/proj/train.py", line 60 in <module>

Extension modules: torch._C (total: 1)
"""


def test_the_crashing_threads_innermost_frame_and_the_users_own(tmp_path: Path):
    assert finish.innermost_frame(DUMP) == ("torch/_dynamo/eval_frame.py:632 in _fn; "
                                            "in your code: me/proj/train.py:41 in step")
    assert finish.innermost_frame("Fatal Python error: Aborted\n\n") == ""
    (tmp_path / layout.CRASH).write_text(DUMP)
    (tmp_path / layout.rank_tagged(layout.CRASH, 1)).write_text("")  # a rank that did not crash
    note = finish.crash_note(tmp_path)
    assert note.startswith("the Python stack at the crash is in crash.txt (innermost: torch/_dynamo/")
    assert not (tmp_path / layout.rank_tagged(layout.CRASH, 1)).exists()  # the empty one is removed
    assert (tmp_path / layout.CRASH).exists()


def test_no_crash_no_note_and_no_file(tmp_path: Path):
    (tmp_path / layout.CRASH).write_text("")
    assert finish.crash_note(tmp_path) == "" and not (tmp_path / layout.CRASH).exists()
