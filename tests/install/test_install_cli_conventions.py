"""Command-line conventions: bare ``gpudoctor``, colour (NO_COLOR, FORCE_COLOR, --color),
``view`` without its extra, and no message naming a command that does not exist."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
from installlib import ROOT, blocker, env, gd, write_train

from gpudoctor.cli import cli, use_color
from gpudoctor.cli_options import ScriptCommand

ANSI = "\x1b["


def test_bare_gpudoctor_prints_the_help_and_exits_0(tmp_path) -> None:
    res = gd(cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("Usage: gpudoctor") and "Commands:" in res.stdout
    assert res.stdout == gd("--help", cwd=tmp_path).stdout
    assert res.stderr == ""


def test_an_unknown_command_points_at_the_help_that_exists(tmp_path) -> None:
    res = gd("nosuch", cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr.strip() == "gpudoctor: error: No such command 'nosuch'. (see gpudoctor --help)"
    res = gd("profile", "--nosuch", cwd=tmp_path)
    assert res.returncode == 2 and res.stderr.rstrip().endswith("(see gpudoctor profile --help)")
    # the hint's command works
    assert gd("profile", "--help", cwd=tmp_path).returncode == 0


# --------------------------------------------------------------------------- colour


@pytest.mark.parametrize(
    ("flag", "tty", "environ", "expected"),
    [
        (None, True, {}, True),
        (None, False, {}, False),
        (None, True, {"NO_COLOR": "1"}, False),
        (None, True, {"NO_COLOR": ""}, True),  # https://no-color.org: set *and not empty*
        (None, False, {"FORCE_COLOR": "1"}, True),
        (None, False, {"FORCE_COLOR": ""}, False),
        (None, True, {"NO_COLOR": "1", "FORCE_COLOR": "1"}, False),  # CPython's order: NO_COLOR first
        (True, False, {"NO_COLOR": "1"}, True),  # the flag wins
        (False, True, {"FORCE_COLOR": "1"}, False),
    ],
)
def test_use_color(flag, tty, environ, expected) -> None:
    assert use_color(flag, tty, environ) is expected


@pytest.fixture(scope="module")
def script(tmp_path_factory) -> Path:
    """`check` on this script finds something, so that the terminal report has a coloured severity."""
    folder = tmp_path_factory.mktemp("colour")
    path = write_train(folder)
    path.write_text(path.read_text(encoding="utf-8").replace("for i in", "loader = torch.utils.data.DataLoader("
                                                             "range(64), batch_size=8)\nfor i in"), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("args", "extra", "coloured"),
    [
        ((), {}, False),  # stdout is a pipe here
        ((), {"FORCE_COLOR": "1"}, True),
        ((), {"FORCE_COLOR": ""}, False),
        ((), {"FORCE_COLOR": "1", "NO_COLOR": "1"}, False),
        (("--color",), {"NO_COLOR": "1"}, True),
        (("--no-color",), {"FORCE_COLOR": "1"}, False),
    ],
)
def test_check_colours_its_terminal_report_by_the_conventions(script, args, extra, coloured) -> None:
    res = gd("check", script, *args, cwd=script.parent, extra_env=extra)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip()
    assert (ANSI in res.stdout) is coloured


def test_colour_never_goes_into_a_file_or_another_format(script, tmp_path) -> None:
    out = tmp_path / "r.txt"
    res = gd("check", script, "--color", "-o", out, cwd=tmp_path, extra_env={"FORCE_COLOR": "1"})
    assert res.returncode == 0, res.stderr
    assert ANSI not in out.read_text(encoding="utf-8")
    res = gd("check", script, "--format", "md", cwd=tmp_path, extra_env={"FORCE_COLOR": "1"})
    assert ANSI not in res.stdout


def test_empty_no_color_keeps_colour_on_a_terminal(script) -> None:
    """NO_COLOR= (set, empty) on a real terminal: colour stays on."""
    import pty

    def run(extra: dict[str, str]) -> str:
        master, slave = pty.openpty()
        try:
            proc = subprocess.Popen([sys.executable, "-m", "gpudoctor", "check", str(script)], stdout=slave,
                                    stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, env=env(**extra),
                                    cwd=script.parent)
        finally:
            os_close(slave)  # the child holds its own: the pty reads EOF (EIO) when it exits
        return read_pty(master, proc)

    assert ANSI in run({"NO_COLOR": ""})
    assert ANSI not in run({"NO_COLOR": "1"})


def os_close(fd: int) -> None:
    import os

    try:
        os.close(fd)
    except OSError:
        pass


def read_pty(master: int, proc: subprocess.Popen, timeout: float = 120) -> str:
    """Everything written to the pty until the process ends (EIO once the last writer has closed it)."""
    import os
    import select

    chunks: list[bytes] = []
    try:
        while True:
            ready, _, _ = select.select([master], [], [], timeout)
            if not ready:
                break
            try:
                data = os.read(master, 65536)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
            if proc.poll() is not None and not select.select([master], [], [], 0.2)[0]:
                break
    finally:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        finally:
            os_close(master)
    return b"".join(chunks).decode("utf-8", "replace")


# --------------------------------------------------------------------------- view without its extra


@pytest.mark.parametrize("missing", [("tensorboard",), ("torch_tb_profiler",), ("tensorboard", "torch_tb_profiler")])
def test_view_without_the_extra_names_it(tmp_path, missing) -> None:
    folder = blocker(tmp_path / "blocked", missing)
    res = gd("view", tmp_path, cwd=tmp_path, blocked=folder)
    assert res.returncode == 2
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("gpudoctor: error: `gpudoctor view` needs ")
    assert lines[0].endswith('pip install "gpudoctor[view]"')
    for module in missing:
        assert module.replace("_", "-") in lines[0]


# --------------------------------------------------------------------------- commands named in messages

# "gpudoctor WORD" read as a command: in backticks, after "see"/"run"/"try"/"use", or followed by an
# option, an UPPERCASE placeholder, a path or a file name
_COMMAND = re.compile(
    r"(?:`gpudoctor ([a-z][\w-]*)"
    r"|\b(?:see|run|try|use|with|pass) gpudoctor ([a-z][\w-]*)"
    r"|\bgpudoctor ([a-z][\w-]*)(?= (?:-|[A-Z][A-Z_]+\b|\S*(?:/|\.[a-z]{1,5}\b))))"
)


def _strings(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value
        elif isinstance(node, ast.JoinedStr):  # an f-string: its literal parts, placeholders as X
            yield node.lineno, "".join(v.value if isinstance(v, ast.Constant) else "X" for v in node.values)


def command_mentions(text: str) -> list[str]:
    return [next(g for g in m.groups() if g) for m in _COMMAND.finditer(text)]


def test_the_scan_finds_commands_and_skips_prose() -> None:
    assert command_mentions("see gpudoctor cli --help") == ["cli"]
    assert command_mentions("run `gpudoctor profile` again") == ["profile"]
    assert command_mentions("gpudoctor analyze RUN") == ["analyze"]
    assert command_mentions("gpudoctor report run/ -o x.md") == ["report"]
    assert command_mentions("gpudoctor could not record how (os._exit())") == []
    assert command_mentions("it was sent to gpudoctor alone)") == []
    assert command_mentions("when gpudoctor watched them.") == []


def test_every_command_named_in_the_package_exists() -> None:
    real = set(cli.commands)
    assert {"profile", "analyze", "report", "check", "compare", "verify", "view", "rules", "explain"} <= real
    wrong = []
    files = sorted((ROOT / "gpudoctor").rglob("*.py"))
    for path in [*files, ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        items = _strings(path) if path.suffix == ".py" else enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        for lineno, text in items:
            wrong += [f"{path.relative_to(ROOT)}:{lineno}: gpudoctor {w}" for w in command_mentions(text) if w not in real]
    assert wrong == []


def test_every_option_named_after_a_command_exists() -> None:
    """`gpudoctor CMD --opt` in the package's strings and the README: CMD has --opt."""
    pattern = re.compile(r"\bgpudoctor ([a-z]+)((?: (?:[\w./…-]+|`[^`]*`))*)")
    wrong, checked = [], 0
    for path in [*sorted((ROOT / "gpudoctor").rglob("*.py")), ROOT / "README.md"]:
        items = _strings(path) if path.suffix == ".py" else enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        for lineno, text in items:
            for m in pattern.finditer(text):
                cmd = cli.commands.get(m.group(1))
                if cmd is None:
                    continue
                known = {o for p in cmd.params if isinstance(p, click.Option) for o in (*p.opts, *p.secondary_opts)}
                known |= {"-h", "--help"}
                named = m.group(2).split(" -- ")[0]
                if isinstance(cmd, ScriptCommand):  # what follows the script is the script's (`train.py --epochs 1`)
                    named = " ".join(cmd._split(named.split())[0])
                for opt in re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", named):
                    checked += 1
                    if opt not in known:
                        wrong.append(f"{path.relative_to(ROOT)}:{lineno}: gpudoctor {m.group(1)} … {opt}")
    assert checked >= 20  # the scan reads the examples (41 options named when written)
    assert wrong == []
