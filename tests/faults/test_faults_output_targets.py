"""``-o PATH`` never replaces what is not a file (issue: hold the contract at the edges, item 1).

As root, ``report RUN -o /dev/full`` used to leave /dev/full a regular file. Every case here
builds its device nodes, FIFOs and symlinks inside a temporary folder: no test touches the
machine's own devices.
"""

from __future__ import annotations

import os
import stat
import subprocess
import threading
from pathlib import Path

import pytest
from faultlib import env, gd, gd_cmd, gd_lines

from gpudoctor.errors import UsageError
from gpudoctor.output import Target, check_output_writable, through_descriptor, write_output

SCRIPT = """\
import torch
from torch.utils.data import DataLoader, TensorDataset
ds = TensorDataset(torch.randn(100, 4))
model = torch.nn.Linear(4, 4).cuda()
for (x,) in DataLoader(ds, batch_size=8):
    loss = model(x.cuda()).sum()
    loss.backward()
    print(loss.item())
"""

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")


def _node(path: Path, kind: int, major: int, minor: int) -> Path:
    try:
        os.mknod(path, kind | 0o666, os.makedev(major, minor))
    except PermissionError:
        pytest.skip("this sandbox refuses mknod")
    return path


def _full(tmp_path: Path) -> Path:
    """A node with /dev/full's numbers: every write gives ENOSPC."""
    return _node(tmp_path / "full", stat.S_IFCHR, 1, 7)


def _null(tmp_path: Path) -> Path:
    return _node(tmp_path / "null", stat.S_IFCHR, 1, 3)


def _reader(fifo: Path) -> tuple[threading.Thread, list[bytes]]:
    got: list[bytes] = []

    def read() -> None:
        with open(fifo, "rb") as fh:
            got.append(fh.read())

    t = threading.Thread(target=read, daemon=True)
    t.start()
    return t, got


# --------------------------------------------------------------------------- the helper


@root_only
def test_a_full_device_is_an_error_and_stays_a_device(tmp_path: Path) -> None:
    full = _full(tmp_path)
    with pytest.raises(UsageError, match=r"No space left on device \(ENOSPC\)"):
        write_output(full, "# report\n")
    assert stat.S_ISCHR(os.lstat(full).st_mode)
    assert os.listdir(tmp_path) == ["full"]  # no temporary file left beside it


@root_only
def test_a_null_device_is_written_through(tmp_path: Path) -> None:
    null = _null(tmp_path)
    write_output(null, "# report\n")
    assert stat.S_ISCHR(os.lstat(null).st_mode)
    check_output_writable(null)  # and the check before a run does not write it either


@root_only
def test_a_block_device_is_refused_untouched(tmp_path: Path) -> None:
    blk = _node(tmp_path / "blk", stat.S_IFBLK, 7, 250)  # a loop device's numbers: never opened
    with pytest.raises(UsageError, match="is a block device"):
        write_output(blk, "x")
    with pytest.raises(UsageError, match="is a block device"):
        check_output_writable(blk)
    assert stat.S_ISBLK(os.lstat(blk).st_mode)


def test_a_fifo_is_written_through_to_its_reader(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    t, got = _reader(fifo)
    write_output(fifo, "# report\n" * 20000)  # more than a pipe's buffer: the writer waits for the reader
    t.join(timeout=30)
    assert got == [b"# report\n" * 20000]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_fifo_with_no_reader_is_waited_for_with_one_line(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    lines: list[str] = []
    readers: list[tuple[threading.Thread, list[bytes]]] = []

    def say(line: str) -> None:  # the reader comes only once the writer said it waits
        lines.append(line)
        readers.append(_reader(fifo))

    write_output(fifo, "late\n", say=say)
    (t, got), = readers
    t.join(timeout=30)
    assert got == [b"late\n"]
    assert len(lines) == 1 and "no reader yet" in lines[0]
    check_output_writable(fifo)  # never opens a FIFO: it would block, or eat a reader
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_symlink_is_followed_and_kept(tmp_path: Path) -> None:
    real = tmp_path / "real.md"
    real.write_text("old")
    real.chmod(0o640)
    link = tmp_path / "link.md"
    link.symlink_to("real.md")
    write_output(link, "new")
    assert link.is_symlink() and os.readlink(link) == "real.md"
    assert real.read_text() == "new"
    assert stat.S_IMODE(real.stat().st_mode) == 0o640  # the mode is kept


def test_a_dangling_symlink_creates_its_target(tmp_path: Path) -> None:
    link = tmp_path / "link.md"
    link.symlink_to("sub/made.md")
    (tmp_path / "sub").mkdir()
    write_output(link, "made")
    assert link.is_symlink() and (tmp_path / "sub" / "made.md").read_text() == "made"


@root_only
def test_a_symlink_to_a_device_writes_the_device(tmp_path: Path) -> None:
    full = _full(tmp_path)
    link = tmp_path / "out.md"
    link.symlink_to(full)
    with pytest.raises(UsageError, match="ENOSPC"):
        write_output(link, "x")
    assert link.is_symlink() and stat.S_ISCHR(os.lstat(full).st_mode)


def test_a_regular_file_is_replaced_atomically_keeping_its_mode(tmp_path: Path) -> None:
    out = tmp_path / "r.md"
    out.write_text("old")
    out.chmod(0o600)
    before = out.stat().st_ino
    write_output(out, "new")
    assert out.read_text() == "new" and stat.S_IMODE(out.stat().st_mode) == 0o600
    assert out.stat().st_ino != before  # renamed into place, not rewritten in place
    assert sorted(os.listdir(tmp_path)) == ["r.md"]


def test_a_folder_and_a_symlink_loop_are_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    with pytest.raises(UsageError, match="is a folder"):
        write_output(tmp_path / "d", "x")
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    with pytest.raises(UsageError, match="ELOOP"):
        write_output(tmp_path / "a", "x")


def test_descriptor_paths_are_recognized(tmp_path: Path) -> None:
    assert through_descriptor("/dev/stdout") == os.path.exists("/dev/stdout")
    assert through_descriptor("/proc/self/fd/1")
    assert not through_descriptor(str(tmp_path / "r.md"))
    link = tmp_path / "out"
    link.symlink_to("/proc/self/fd/1")
    assert through_descriptor(str(link))
    assert Target(str(link)).through


# --------------------------------------------------------------------------- through the command line


@root_only
def test_check_o_on_a_full_device_exits_2_and_keeps_the_device(tmp_path: Path) -> None:
    (tmp_path / "loop.py").write_text(SCRIPT)
    full = _full(tmp_path)
    done = gd("check", "loop.py", "-o", full, "--format", "md", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    (line,) = gd_lines(done.stderr)
    assert "No space left on device" in line and "wrote" not in done.stderr
    assert stat.S_ISCHR(os.lstat(full).st_mode)


def test_check_o_dev_stdout_redirected_to_a_file_writes_that_file(tmp_path: Path) -> None:
    if not os.path.exists("/dev/stdout"):
        pytest.skip("no /dev/stdout here")
    (tmp_path / "loop.py").write_text(SCRIPT)
    out = tmp_path / "out.md"
    with open(out, "w") as sink:
        done = subprocess.run(gd_cmd("check", "loop.py", "-o", "/dev/stdout", "--format", "md"), cwd=tmp_path,
                              env=env(), stdout=sink, stderr=subprocess.PIPE, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert out.read_text().startswith("#") and "GD" in out.read_text()
    assert not out.is_symlink()


def test_check_o_dev_stdout_into_a_pipe(tmp_path: Path) -> None:
    if not os.path.exists("/dev/stdout"):
        pytest.skip("no /dev/stdout here")
    (tmp_path / "loop.py").write_text(SCRIPT)
    done = gd("check", "loop.py", "-o", "/dev/stdout", "--format", "md", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("#") and "GD" in done.stdout


# --------------------------------------------------------------------------- -o onto a source (review of the rewrite)


def test_profile_o_onto_its_script_is_refused_before_the_run(tmp_path: Path) -> None:
    """`profile --format md -o tiny.py tiny.py` replaced the script with the report."""
    script = tmp_path / "tiny.py"
    script.write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    before = script.read_bytes()
    (tmp_path / "link.md").symlink_to(script)
    for out in ("tiny.py", "./sub/../tiny.py", "link.md"):
        (tmp_path / "sub").mkdir(exist_ok=True)
        done = gd("profile", "--format", "md", "-o", out, "tiny.py", cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        (line,) = gd_lines(done.stderr)
        assert "tiny.py" in line and "the script profile runs" in line
        assert script.read_bytes() == before and not (tmp_path / "ran").exists()
        assert not (tmp_path / "gpudoctor-runs").exists()


def test_profile_o_onto_the_module_it_runs_is_refused(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text("print('ran')\n")
    done = gd("profile", "--format", "md", "-o", "pkg/train.py", "-m", "pkg.train", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "pkg/train.py" in gd_lines(done.stderr)[0]
    assert (pkg / "train.py").read_text() == "print('ran')\n"


def test_verify_o_onto_the_runs_script_is_refused(tmp_path: Path) -> None:
    import json

    script = tmp_path / "train.py"
    script.write_text("print('ran')\n")
    run = tmp_path / "run"
    run.mkdir()
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "gpu2" / "tuned_baseline" / "manifest.json"
    manifest = json.loads(fixture.read_text())
    manifest.update(cwd=str(tmp_path), script=str(script), argv=["train.py"], module=None)
    (run / "manifest.json").write_text(json.dumps(manifest))
    done = gd("verify", "run", "--format", "md", "-o", "train.py", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    (line,) = gd_lines(done.stderr)
    assert "train.py" in line and "verify runs again" in line
    assert script.read_text() == "print('ran')\n" and not (run / "verify").exists()
