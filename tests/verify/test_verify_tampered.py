"""`gpudoctor verify` on an edited run directory runs nothing without --yes (issue 41, item 1).

Every check verify made before a trial compared fields of the manifest it distrusts, so an edited
manifest chose the code: the standard library's ``timeit.py`` with ``-s "<code>"`` and a matching
``script_sha256`` (cwd ``/``), the same as ``module: "timeit"``, or a relative ``cwd`` into the run
directory holding a script with a matching hash. Each ran the code, exit 0, without --yes. Here
each variant's code would write a marker file: through the real CLI, with no terminal to answer,
verify must exit 2 with the command it would run and "pass --yes", and the marker must not exist.
The run is a recorded GPU run (tests/fixtures/gpu), which verify has fixes to try for: it gets as
far as the trials.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import timeit
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECORDED = ROOT / "tests" / "fixtures" / "gpu" / "cudnn_benchmark_off"  # GD403: a fix verify can apply
TIMEIT = timeit.__file__


def _sha(path: Path | str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _unpack(dest: Path) -> Path:
    if not (RECORDED / "manifest.json.gz").is_file():
        pytest.skip("tests/fixtures/gpu/cudnn_benchmark_off is absent")
    dest.mkdir()
    for f in RECORDED.iterdir():
        if f.name.endswith(".pt.trace.json.gz"):
            shutil.copyfile(f, dest / f.name)
        elif f.name.endswith(".gz"):
            (dest / f.name[: -len(".gz")]).write_bytes(gzip.decompress(f.read_bytes()))
    return dest


def _tampered(tmp_path: Path, variant: str, marker: Path) -> Path:
    run = _unpack(tmp_path / "run")
    m = json.loads((run / "manifest.json").read_text())
    code = f"open({str(marker)!r}, 'w').write('ran')"
    timeit_argv = [TIMEIT, "-n", "1", "-r", "1", "-s", code, "pass"]
    if variant == "stdlib-script":
        m.update(cwd="/", script=TIMEIT, module=None, argv=timeit_argv, script_sha256=_sha(TIMEIT))
    elif variant == "stdlib-module":
        m.update(cwd="/", script=None, module="timeit", argv=timeit_argv, script_sha256=_sha(TIMEIT))
    else:  # a relative cwd into the run directory, a script there with its own hash
        (run / "work").mkdir()
        (run / "work" / "train.py").write_text(code + "\n")
        m.update(cwd="run/work", script="train.py", module=None, argv=["train.py"],
                 script_sha256=_sha(run / "work" / "train.py"))
    (run / "manifest.json").write_text(json.dumps(m, indent=2))
    return run


def _verify(run: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = os.environ.copy()  # the session's own state folder (tests/conftest.py): no record of this run
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return subprocess.run([sys.executable, "-m", "gpudoctor", "verify", str(run), "--verify-budget", "60", *args],
                          cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("variant", ["stdlib-script", "stdlib-module", "relative-cwd"])
def test_an_edited_run_directory_runs_nothing_without_yes(tmp_path: Path, variant: str) -> None:
    marker = tmp_path / "MARKER"
    run = _tampered(tmp_path, variant, marker)
    res = _verify(run, tmp_path)
    assert not marker.exists(), f"verify ran the run directory's code ({variant})"
    assert res.returncode == 2, res.stderr[-2000:]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpudoctor: error:"), res.stderr[-2000:]
    assert "no record that this user's gpudoctor wrote its manifest" in lines[0]
    assert "pass --yes to run it" in lines[0] and "Traceback" not in res.stderr
    shown = "timeit" if variant.startswith("stdlib") else "train.py"
    assert f"its trials would run, in {'/' if shown == 'timeit' else str(tmp_path / 'run' / 'work')}:" in lines[0]
    assert shown in lines[0] and ("MARKER" in lines[0] or shown == "train.py")  # the command, its -s code
    assert not (run / "verify").exists()  # nothing was started or written
