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
