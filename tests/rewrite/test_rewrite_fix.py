"""`gpudoctor check --fix` / `--diff` on pytorch/examples-style scripts: one golden diff per kind of fix.

The scripts are under tests/rewrite/scripts/, the diffs under tests/rewrite/golden/. Each
case runs `--diff` (nothing written) and `--fix` (the file rewritten) on a copy in a
temporary folder and checks that both make exactly the golden diff, that the fixed file
compiles, and that checking it again raises none of the codes fixed. After a deliberate
change of a fix, regenerate the diffs and review them:

    GPUDOCTOR_UPDATE_SNAPSHOTS=1 python -m pytest tests/rewrite -q
"""

from __future__ import annotations

import difflib
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpudoctor.cli import main
from gpudoctor.config import Config
from gpudoctor.static import check_paths

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "scripts"
GOLDEN = HERE / "golden"
UPDATE = os.environ.get("GPUDOCTOR_UPDATE_SNAPSHOTS") == "1"

# (golden diff, script, the codes selected, what the diff must contain)
CASES = [
    ("dataloader", "mnist_loader.py", "GD201,GD301",
     ("+        num_workers=4,", "+        persistent_workers=True,", "+        pin_memory=True,")),
    ("persistent_workers", "epochs.py", "GD202", ("persistent_workers=True)",)),
    # a count of workers computed from --workers: every count the script accepts keeps working (issue 38)
    ("persistent_workers_expression", "dcgan_workers.py", "GD202", ("persistent_workers=int(opt.workers) > 0)",)),
    ("no_grad", "eval_loop.py", "GD701", ("+    with torch.no_grad():",)),
    ("cudnn_benchmark_insert", "convnet_cudnn.py", "GD403", ("+torch.backends.cudnn.benchmark = True",)),
    ("cudnn_benchmark_assign", "cudnn_off.py", "GD403", ("+    cudnn.benchmark = True  # was True",)),
    ("non_blocking", "pinned_copies.py", "GD302",
     ("+        x = x.to(device, non_blocking=True)  # the input", "+        y = y.cuda(non_blocking=True)")),
    ("fused_optimizer", "optimizers.py", "GD404", ("betas=(0.5, 0.999), fused=True)",)),
    # every fix at once: pin_memory in the first pass makes the copies' non_blocking=True a fix in the next
    ("mnist_all", "mnist_loader.py", "", ("non_blocking=True", "fused=True", "num_workers=4")),
]


def gpudoctor(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["gpudoctor", *map(str, args)])
    with pytest.raises(SystemExit) as exc:
        main()
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def _copy(tmp_path: Path, name: str) -> Path:
    target = tmp_path / name
    shutil.copyfile(SCRIPTS / name, target)
    return target


def _golden(name: str, text: str) -> None:
    path = GOLDEN / f"{name}.diff"
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return
    assert path.is_file(), f"missing golden diff {path}; create it with GPUDOCTOR_UPDATE_SNAPSHOTS=1"
    assert text == path.read_text(encoding="utf-8"), (
        f"{name}: the diff differs from {path}; if deliberate, regenerate with GPUDOCTOR_UPDATE_SNAPSHOTS=1")


def _unified(before: str, after: str, name: str) -> str:
    return "".join(difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                        fromfile=f"a/{name}", tofile=f"b/{name}"))


@pytest.mark.parametrize(("golden", "script", "select", "expected"), CASES, ids=[c[0] for c in CASES])
def test_fix_makes_the_golden_diff_and_only_it(golden, script, select, expected, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    path = _copy(tmp_path, script)
    original = path.read_bytes()
    sel = ["--select", select] if select else []
    code, diff, err = gpudoctor(monkeypatch, capsys, "check", "--diff", "--workers", "4", *sel, script)
    assert code == 1, err  # a change to show
    assert path.read_bytes() == original
    _golden(golden, diff)
    for line in expected:
        assert line in diff, (line, diff)
    assert "autocast" not in diff  # AMP is never automatic

    code, out, err = gpudoctor(monkeypatch, capsys, "check", "--fix", "--workers", "4", *sel, script)
    assert code == 0, err  # no --fail-on: findings that remain do not fail
    fixed = path.read_text(encoding="utf-8")
    assert _unified(original.decode("utf-8"), fixed, script) == diff  # --fix writes what --diff shows
    compile(fixed, script, "exec")
    assert f"{script}: fixed " in err
    fixed_codes = set(select.split(",")) if select else {"GD201", "GD301", "GD302", "GD404"}
    again = check_paths([path], Config(select=tuple(select.split(",")) if select else ()))
    assert not fixed_codes & {f.code for f in again.findings}, [f.code for f in again.findings]
    # a second --fix has nothing left to do
    code, diff2, _ = gpudoctor(monkeypatch, capsys, "check", "--diff", "--workers", "4", *sel, script)
    assert (code, diff2) == (0, "")


def test_diff_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    path = _copy(tmp_path, "mnist_loader.py")
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    before = path.read_bytes(), path.stat().st_mtime_ns, sorted(os.listdir(tmp_path))
    code, out, _err = gpudoctor(monkeypatch, capsys, "check", "--diff", "--workers", "4", "mnist_loader.py")
    assert code == 1 and out.startswith("--- a/mnist_loader.py\n+++ b/mnist_loader.py\n")
    assert (path.read_bytes(), path.stat().st_mtime_ns, sorted(os.listdir(tmp_path))) == before


def test_fix_keeps_the_file_mode_and_writes_atomically(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    path = _copy(tmp_path, "optimizers.py")
    path.chmod(0o751)
    inode = path.stat().st_ino
    code, _out, err = gpudoctor(monkeypatch, capsys, "check", "--fix", "optimizers.py")
    assert code == 0, err
    assert "fused=True" in path.read_text(encoding="utf-8")
    assert stat.S_IMODE(path.stat().st_mode) == 0o751
    assert path.stat().st_ino != inode  # replaced by a rename, not rewritten in place
    assert sorted(os.listdir(tmp_path)) == ["optimizers.py"]  # no temporary file left


def test_an_unparseable_file_is_reported_and_left_untouched(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    good = _copy(tmp_path, "optimizers.py")
    bad = tmp_path / "broken.py"
    bad.write_bytes(b"import torch\nfor x in :\n    pass\n")
    code, _out, err = gpudoctor(monkeypatch, capsys, "check", "--fix", ".")
    assert code == 0, err
    assert bad.read_bytes() == b"import torch\nfor x in :\n    pass\n"
    assert "broken.py" in err and "fused=True" in good.read_text(encoding="utf-8")


def test_fix_on_a_folder_reports_per_file(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for name in ("optimizers.py", "eval_loop.py", "epochs.py", "import_time_loader.py"):
        _copy(tmp_path, name)
    untouched = (tmp_path / "import_time_loader.py").read_bytes()
    code, _out, err = gpudoctor(monkeypatch, capsys, "check", "--fix", "--workers", "2", ".")
    assert code == 0, err
    lines = err.splitlines()
    assert any(x.startswith("gpudoctor: optimizers.py: fixed 1 (GD404 line 12)") for x in lines), err
    assert any(x.startswith("gpudoctor: eval_loop.py: fixed 1 (GD701 line 14)") for x in lines), err
    assert any(x.startswith("gpudoctor: epochs.py: fixed 1 (GD202 line 18)") for x in lines), err
    assert "gpudoctor: fixed 3 findings in 3 files;" in err
    # workers are not added to a DataLoader built at import time (spawn would import the script again)
    assert (tmp_path / "import_time_loader.py").read_bytes() == untouched


def test_amp_is_never_automatic(tmp_path):
    path = _copy(tmp_path, "mnist_loader.py")
    amp = [f for f in check_paths([path], Config()).findings if f.code == "GD401"]
    assert amp and not any(f.fix.automatic for f in amp)
    from gpudoctor.rules.registry import get

    assert not get("GD401").autofix and "numerics" in get("GD401").not_autofix


def test_a_refused_fix_says_why(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _copy(tmp_path, "import_time_loader.py")
    rep = check_paths([Path("import_time_loader.py")], Config(select=("GD201",)))
    (f,) = rep.findings
    assert not f.fix.automatic
    assert "not changed by `gpudoctor check --fix`: it runs at import time" in str(f.evidence.to_dict())


def test_exit_codes(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _copy(tmp_path, "optimizers.py")
    # --diff: 1 with a change to show, 0 without
    assert gpudoctor(monkeypatch, capsys, "check", "--diff", "optimizers.py")[0] == 1
    # --fix: 0 by default, 1 with --exit-non-zero-on-fix when a file changed
    snapshot = (tmp_path / "optimizers.py").read_bytes()
    assert gpudoctor(monkeypatch, capsys, "check", "--fix", "--exit-non-zero-on-fix", "optimizers.py")[0] == 1
    assert gpudoctor(monkeypatch, capsys, "check", "--fix", "--exit-non-zero-on-fix", "optimizers.py")[0] == 0
    assert gpudoctor(monkeypatch, capsys, "check", "--diff", "optimizers.py")[0] == 0
    (tmp_path / "optimizers.py").write_bytes(snapshot)
    # --fail-on decides on what remains: GD401 (info) stays after --fix
    assert gpudoctor(monkeypatch, capsys, "check", "--fix", "--fail-on", "info", "optimizers.py")[0] == 1
    assert gpudoctor(monkeypatch, capsys, "check", "--fix", "--fail-on", "warning", "optimizers.py")[0] == 0
    # usage errors: 2
    assert gpudoctor(monkeypatch, capsys, "check", "--fix", "--diff", "optimizers.py")[0] == 2
    assert gpudoctor(monkeypatch, capsys, "check", "--workers", "3", "optimizers.py")[0] == 2
    assert gpudoctor(monkeypatch, capsys, "check", "--fix", "--from", str(tmp_path / "nothing"), "optimizers.py")[0] == 2


@pytest.mark.parametrize("spelling", ["same", "dotted", "symlink", "hardlink"])
@pytest.mark.parametrize("extra", [("--fix", "--format", "md"), ("--fix",), (), ("--diff",)])
def test_output_onto_an_input_is_refused_and_the_script_is_intact(spelling, extra, tmp_path, monkeypatch, capsys):
    """`check --fix train.py -o train.py --format md` replaced the script with the report (issue 38, item 1):
    -o naming an input, by any spelling, is exit 2 before anything is written."""
    monkeypatch.chdir(tmp_path)
    script = _copy(tmp_path, "mnist_loader.py")
    before = script.read_bytes()
    (tmp_path / "sub").mkdir()
    out = {"same": "mnist_loader.py", "dotted": "sub/../mnist_loader.py", "symlink": "link.md",
           "hardlink": "hard.md"}[spelling]
    if spelling == "symlink":
        (tmp_path / "link.md").symlink_to(script)
    if spelling == "hardlink":
        os.link(script, tmp_path / "hard.md")
    code, _out, err = gpudoctor(monkeypatch, capsys, "check", *extra, "mnist_loader.py", "-o", out)
    assert code == 2, err
    assert script.read_bytes() == before
    assert "Traceback" not in err and "mnist_loader.py" in err


def test_output_onto_a_file_found_in_a_folder_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "proj").mkdir()
    script = _copy(tmp_path / "proj", "mnist_loader.py")
    before = script.read_bytes()
    code, _out, err = gpudoctor(monkeypatch, capsys, "check", "--fix", "proj", "--format", "md",
                                "-o", "proj/mnist_loader.py")
    assert code == 2 and script.read_bytes() == before, err


def test_output_without_a_format_is_refused_before_the_fix(tmp_path, monkeypatch, capsys):
    """`-o notes.py` says no format: exit 2 and the script not fixed (the fix was written before)."""
    monkeypatch.chdir(tmp_path)
    script = _copy(tmp_path, "mnist_loader.py")
    before = script.read_bytes()
    code, _out, err = gpudoctor(monkeypatch, capsys, "check", "--fix", "mnist_loader.py", "-o", "notes.py")
    assert code == 2 and "format" in err
    assert script.read_bytes() == before and not (tmp_path / "notes.py").exists()


def test_output_to_another_file_still_writes_the_report(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _copy(tmp_path, "mnist_loader.py")
    code, _out, err = gpudoctor(monkeypatch, capsys, "check", "--fix", "mnist_loader.py", "-o", "review.md")
    assert code == 0, err
    assert (tmp_path / "review.md").read_text().startswith("#")


@pytest.mark.slow
def test_the_fixed_dcgan_style_script_runs_with_every_count_of_workers(tmp_path, monkeypatch, capsys):
    """`check --fix` on dcgan wrote persistent_workers=True beside num_workers=int(opt.workers), and the fixed
    script then crashed with --workers 0, which the original accepts (issue 38): it now runs with 0 and 1."""
    monkeypatch.chdir(tmp_path)
    script = _copy(tmp_path, "dcgan_workers.py")
    code, _out, err = gpudoctor(monkeypatch, capsys, "check", "--fix", "--select", "GD202", "dcgan_workers.py")
    assert code == 0 and "fixed 1 (GD202" in err
    fixed = script.read_text(encoding="utf-8")
    assert "num_workers=int(opt.workers), persistent_workers=int(opt.workers) > 0)" in fixed

    def run(path: Path, workers: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(path), "--workers", workers], capture_output=True, text=True,
                              timeout=300, cwd=tmp_path)

    for workers in ("0", "1"):
        done = run(script, workers)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "[1/2] Loss_D" in done.stdout
    # what --fix wrote before: a real DataLoader refuses it with --workers 0
    naive = tmp_path / "naive.py"
    naive.write_text(fixed.replace("persistent_workers=int(opt.workers) > 0", "persistent_workers=True"), encoding="utf-8")
    done = run(naive, "0")
    assert done.returncode != 0 and "persistent_workers option needs num_workers > 0" in done.stderr


# --------------------------------------------------------------------------- the user's source is sacred (issue 38)


def test_a_folder_walk_leaves_a_symlink_out_of_the_folder_alone(tmp_path, monkeypatch, capsys):
    """`check --fix DIR` followed a symlink in DIR and rewrote a file outside it."""
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    victim = _copy(outside, "optimizers.py")
    before = victim.read_bytes()
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "linked.py").symlink_to(victim)  # leads out of proj
    own = _copy(proj, "epochs.py")
    (proj / "alias.py").symlink_to(own)  # leads to a file of proj: that file, once
    monkeypatch.chdir(tmp_path)
    code, _out, err = gpudoctor(monkeypatch, capsys, "check", "--fix", "proj")
    assert code == 0, err
    assert victim.read_bytes() == before and (proj / "linked.py").is_symlink()
    assert "persistent_workers=True" in own.read_text(encoding="utf-8") and (proj / "alias.py").is_symlink()
    assert "linked.py" not in err and "elsewhere" not in err
    assert err.count("epochs.py: fixed 1") == 1, err  # the file and its alias are one file
    # given by name, a symlink is the user's choice: its target is fixed, the link kept
    code, _out, err = gpudoctor(monkeypatch, capsys, "check", "--fix", "proj/linked.py")
    assert code == 0 and victim.read_bytes() != before and (proj / "linked.py").is_symlink(), err
    assert "betas=(0.5, 0.999), fused=True)" in victim.read_text(encoding="utf-8")


def test_a_file_swapped_for_a_symlink_out_of_the_folder_is_not_written(tmp_path, monkeypatch, capsys):
    """Between the walk and the write, a file of the folder replaced by a symlink that leads out of it."""
    import gpudoctor.autofix as autofix

    proj = tmp_path / "proj"
    proj.mkdir()
    script = _copy(proj, "optimizers.py")
    victim = tmp_path / "victim.py"
    original = script.read_bytes()
    victim.write_bytes(original)
    real_write = autofix._write

    def swap_then_write(result, decoded, targets):
        script.unlink()
        script.symlink_to(victim)
        real_write(result, decoded, targets)

    monkeypatch.setattr(autofix, "_write", swap_then_write)
    monkeypatch.chdir(tmp_path)
    code, _out, err = gpudoctor(monkeypatch, capsys, "check", "--fix", "proj")
    assert code == 1, err
    assert victim.read_bytes() == original
    assert "leads out of" in err and "not written" in err


@pytest.mark.parametrize("errno_name", ["EROFS", "ENOSPC", "EACCES"])
def test_a_fix_that_cannot_be_written_exits_1(errno_name, tmp_path, monkeypatch, capsys):
    """`--fix` on a read-only mount or a full disk said so and exited 0: now exit 1 (ruff reports an I/O
    error, E902, as an error that remains), the file intact, the reason on stderr."""
    import errno

    from gpudoctor import output

    monkeypatch.chdir(tmp_path)
    script = _copy(tmp_path, "optimizers.py")
    before = script.read_bytes()
    number = getattr(errno, errno_name)

    def refuse(self, data):
        raise OSError(number, os.strerror(number))

    monkeypatch.setattr(output.Target, "_replace", refuse)
    code, _out, err = gpudoctor(monkeypatch, capsys, "check", "--fix", "optimizers.py")
    assert code == 1, err
    assert script.read_bytes() == before
    assert "optimizers.py: not fixed:" in err and f"({errno_name})" in err and "could not be written" in err
    assert "Traceback" not in err
    # --diff writes nothing: the same failure cannot happen, and it exits as before
    assert gpudoctor(monkeypatch, capsys, "check", "--diff", "optimizers.py")[0] == 1


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes read-only files and folders")
@pytest.mark.parametrize("what", ["file", "folder"])
def test_a_read_only_file_or_folder_is_not_fixed_and_exits_1(what, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ro").mkdir()
    script = _copy(tmp_path / "ro", "optimizers.py")
    before = script.read_bytes()
    locked = script if what == "file" else tmp_path / "ro"
    locked.chmod(0o444 if what == "file" else 0o555)
    try:
        code, _out, err = gpudoctor(monkeypatch, capsys, "check", "--fix", "ro/optimizers.py")
    finally:
        locked.chmod(0o644 if what == "file" else 0o755)
    assert code == 1 and script.read_bytes() == before, err
    assert "not fixed" in err


@pytest.mark.parametrize(("name", "header"), [
    ("new\nline.py", '--- "a/new\\nline.py"\n+++ "b/new\\nline.py"\n'),
    ("esc\x1b[31mred.py", '--- "a/esc\\033[31mred.py"\n'),
    ('quote"back\\slash.py', '--- "a/quote\\"back\\\\slash.py"\n'),
    ("caf\u00e9.py", '--- "a/caf\\303\\251.py"\n'),
    ("sp ace.py", "--- a/sp ace.py\t\n+++ b/sp ace.py\t\n"),
])
def test_diff_headers_escape_hostile_names_as_git_does(name, header, tmp_path, monkeypatch, capsys):
    """The --diff header carried the name raw: a newline split it, an ESC coloured the terminal."""
    monkeypatch.chdir(tmp_path)
    shutil.copyfile(SCRIPTS / "optimizers.py", tmp_path / name)
    code, out, _err = gpudoctor(monkeypatch, capsys, "check", "--diff", name)
    assert code == 1
    assert out.startswith(header), out[:200]
    head = out.split("@@", 1)[0]
    assert "\x1b" not in head and head.count("\n") == 2


def test_diff_of_an_absolute_path_is_named_as_git_names_it(tmp_path, monkeypatch, capsys):
    script = _copy(tmp_path, "optimizers.py")
    monkeypatch.chdir(SCRIPTS)  # elsewhere: the path is shown absolute
    code, out, _err = gpudoctor(monkeypatch, capsys, "check", "--diff", str(script))
    rel = str(script).lstrip("/")
    assert code == 1 and out.startswith(f"--- a/{rel}\n+++ b/{rel}\n"), out[:200]
    assert "a//" not in out


@pytest.mark.parametrize("extra", [("--fix",), ()])
def test_output_onto_a_module_the_script_imports_is_refused(extra, tmp_path, monkeypatch, capsys):
    """check reads the project modules a script imports (and --fix may rewrite them): -o onto one replaced it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.py").write_text("import b\n\nb.train()\n")
    _copy(tmp_path, "mnist_loader.py").rename(tmp_path / "b.py")
    before = (tmp_path / "b.py").read_bytes()
    code, _out, err = gpudoctor(monkeypatch, capsys, "check", *extra, "a.py", "--format", "md", "-o", "b.py")
    assert code == 2, err
    assert "b.py" in err and err.count("\n") == 1
    assert (tmp_path / "b.py").read_bytes() == before


@pytest.mark.parametrize("link", ["symlink", "hardlink", "dotted"])
def test_one_file_given_twice_is_checked_and_fixed_once(link, tmp_path, monkeypatch, capsys):
    """`check a.py sl.py --fix` (sl.py -> a.py) exited 1 with "changed on disk" and counted findings twice."""
    monkeypatch.chdir(tmp_path)
    script = _copy(tmp_path, "mnist_loader.py")
    (tmp_path / "sub").mkdir()
    other = {"symlink": "sl.py", "hardlink": "hard.py", "dotted": "sub/../mnist_loader.py"}[link]
    if link == "symlink":
        (tmp_path / "sl.py").symlink_to(script.name)
    elif link == "hardlink":
        os.link(script, tmp_path / "hard.py")
    once = check_paths([script], Config())
    twice = check_paths([script, Path(other)], Config())
    assert len(twice.findings) == len(once.findings) and twice.summary[0].value == 1
    code, _out, err = gpudoctor(monkeypatch, capsys, "check", "--fix", "mnist_loader.py", other, "--format", "json",
                                "-o", "review.json")
    assert code == 0, err
    assert "changed on disk" not in err and "could not be written" not in err
    assert "num_workers=" in script.read_text()


def test_output_onto_a_report_does_not_read_the_project_twice(tmp_path, monkeypatch, capsys):
    """The modules a script imports are looked up for an -o that may be one (a .py, a hard link) only."""
    import gpudoctor.static as static

    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.py").write_text("import b\n\nb.train()\n")
    _copy(tmp_path, "mnist_loader.py").rename(tmp_path / "b.py")
    (tmp_path / "review.md").write_text("# an earlier report\n")
    calls = []
    real = static.project_files
    monkeypatch.setattr(static, "project_files", lambda paths: calls.append(paths) or real(paths))
    code, _out, err = gpudoctor(monkeypatch, capsys, "check", "a.py", "-o", "review.md")
    assert code == 0 and calls == [], err
    code, _out, err = gpudoctor(monkeypatch, capsys, "check", "a.py", "--format", "md", "-o", "notes.py")
    assert code == 0 and calls == [], err  # a new file: nothing to replace, nothing looked up
    code, _out, err = gpudoctor(monkeypatch, capsys, "check", "a.py", "--format", "md", "-o", "notes.py")
    assert code == 0 and len(calls) == 1, err  # now a Python file: it might have been an imported module


def test_output_onto_a_hard_link_to_an_imported_module_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.py").write_text("import b\n\nb.train()\n")
    module = _copy(tmp_path, "mnist_loader.py").rename(tmp_path / "b.py")
    os.link(module, tmp_path / "review.md")
    before = module.read_bytes()
    code, _out, err = gpudoctor(monkeypatch, capsys, "check", "a.py", "-o", "review.md")
    assert code == 2 and "b.py" in err and module.read_bytes() == before, err


def test_the_summary_says_one_finding_remains(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _copy(tmp_path, "mnist_loader.py")
    code, _out, err = gpudoctor(monkeypatch, capsys, "check", "--fix", "mnist_loader.py", "--select", "GD201,GD401")
    assert "1 finding remains" in err, err
