"""GD503's fix says how to get jemalloc where it is absent (issue 38): it named
/usr/lib/x86_64-linux-gnu/libjemalloc.so.2 whether or not the machine had it."""

from __future__ import annotations

import socket

import pytest
from rule_builders import cpu_manifest, judge, run, settings, steps

from gpudoctor.rules import gd503_host_allocator_churn as gd503


def _finding(hostname: str, env: dict | None = None):
    data = run(manifest=cpu_manifest(hostname=hostname), settings=settings(device_type="cpu", env=env or {}),
               steps=steps(20, 100.0, sys_ms=25.0, user_ms=70.0, faults=5000))
    (f,) = judge("GD503", data).findings
    return f


@pytest.fixture
def libraries(tmp_path, monkeypatch):
    """This machine's library folders, as the test makes them."""
    folder = tmp_path / "lib"
    folder.mkdir()
    monkeypatch.setattr(gd503, "_library_folders", lambda: [str(folder)])
    return folder


def test_absent_here_it_says_how_to_install_it_and_puts_glibc_first(libraries):
    f = _finding(socket.gethostname())
    text = f.fix.instruction
    assert "not installed on this machine" in text and f"no libjemalloc.so.2 in {libraries}" in text
    assert "apt-get install libjemalloc2" in text and "conda install -c conda-forge jemalloc" in text
    assert "dnf install jemalloc" in text
    first = f.fix.after.splitlines()[0]
    assert first.startswith("MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=4294967296 python")
    assert not any(line.startswith("LD_PRELOAD") for line in f.fix.after.splitlines())  # only as a comment


def test_present_here_it_names_the_library_found(libraries):
    lib = libraries / "libjemalloc.so.2"
    lib.write_bytes(b"\x7fELF")
    f = _finding(socket.gethostname())
    assert f"LD_PRELOAD={lib}, installed on this machine" in f.fix.instruction
    assert f.fix.after.splitlines()[0] == f"LD_PRELOAD={lib} python train.py"
    assert "not installed" not in f.fix.instruction


def test_a_run_from_another_machine_says_where_it_comes_from(libraries):
    (libraries / "libjemalloc.so.2").write_bytes(b"\x7fELF")  # this machine's: not the run's
    f = _finding("a-training-node")
    text = f.fix.instruction
    assert "installed on this machine" not in text and "not installed" not in text
    assert "apt-get install libjemalloc2" in text and "LD_PRELOAD=<its path>/libjemalloc.so.2" in text
    assert "# after apt-get install libjemalloc2" in f.fix.after


def test_glibc_knobs_set_name_the_library_or_its_install(libraries):
    env = {"MALLOC_MMAP_THRESHOLD_": "131072"}
    assert "apt-get install libjemalloc2" in _finding(socket.gethostname(), env).fix.instruction
    lib = libraries / "libjemalloc.so.2"
    lib.write_bytes(b"\x7fELF")
    f = _finding(socket.gethostname(), env)
    assert f"LD_PRELOAD={lib}" in f.fix.instruction and f.fix.after == f"LD_PRELOAD={lib} python train.py"


def test_the_search_covers_the_system_and_the_python_environment(monkeypatch):
    monkeypatch.setenv("CONDA_PREFIX", "/opt/conda/envs/train")
    folders = gd503._library_folders()
    assert folders[0].startswith("/usr/lib/") and folders[0].endswith("-linux-gnu")
    assert "/opt/conda/envs/train/lib" in folders
