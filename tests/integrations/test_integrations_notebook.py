"""Notebooks (issue 43, item 3): a ``Report`` shows itself in Jupyter (HTML) and IPython (text), and
``%load_ext gpudoctor`` adds ``%%gpudoctor`` and ``%gpudoctor_report``.

The last test executes a three-cell notebook with ``nbclient`` and a real IPython kernel (the `test` extra
installs nbclient, nbformat and ipykernel; it skips, saying so, without them).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

import gpudoctor
from gpudoctor.errors import GpudoctorError
from gpudoctor.integrations import notebook

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample_scripts"


def test_a_report_renders_itself_for_jupyter_and_ipython(gpu_report):
    _run, report = gpu_report("cudnn_benchmark_off")  # a recorded GPU run: findings and an account
    import gpudoctor.report  # noqa: F401 - registers the display (gpudoctor.analyze/load/session import it)

    html = report._repr_html_()
    assert html is not None and report.findings and report.account is not None
    for fd in report.findings:
        assert fd.code in html
    assert 'class="ledger"' in html and "Where the step goes" in html  # the account's bar
    if report.account.actions:
        assert "Top actions" in html
    assert "<script" not in html and "http://" not in html and "https://" not in html  # offline
    assert "<html" not in html and "body {" not in html  # a fragment, its style scoped to it

    class Printer:
        text_ = ""

        def text(self, t: str) -> None:
            self.text_ += t

    p = Printer()
    report._repr_pretty_(p, False)
    assert report.account.headline in p.text_ and "\x1b[" not in p.text_  # the terminal report, no colour


def test_the_magics_arguments_are_checked(tmp_path):
    args = notebook._cell_args("--steps 30 --out runs --select GD201,gd701")
    assert (args.steps, args.out, notebook._codes(args.select)) == (30, "runs", ("GD201", "GD701"))
    for bad in ("--steps many", "--frobnicate", "stray"):
        with pytest.raises(GpudoctorError, match="%%gpudoctor"):
            notebook._cell_args(bad)
    with pytest.raises(GpudoctorError, match="give a run directory"):
        notebook.gpudoctor_report("  ")
    with pytest.raises(GpudoctorError, match="not a gpudoctor run directory"):
        notebook.gpudoctor_report(str(tmp_path))


def test_load_ext_registers_both_magics():
    registered = []

    class Shell:
        def register_magic_function(self, fn, magic_kind, magic_name):  # noqa: ANN001
            registered.append((magic_kind, magic_name, fn))

    gpudoctor.load_ipython_extension(Shell())
    assert [(k, n) for k, n, _ in registered] == [("cell", "gpudoctor"), ("line", "gpudoctor_report")]


@pytest.mark.slow
def test_a_notebook_runs_a_cell_under_gpudoctor_and_shows_the_report(tmp_path):
    for package in ("nbclient", "nbformat", "ipykernel"):
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"{package} is not installed (`pip install -e .[test]` installs it)")
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(f"import sys\nsys.path.insert(0, {str(SAMPLES)!r})\nimport eval_without_no_grad\n"
                                  "%load_ext gpudoctor"),
        # a planted GD701: an evaluation loop with autograd recording (deterministic, not a timing)
        nbformat.v4.new_code_cell("%%gpudoctor --steps 30 --out runs --name nb\neval_without_no_grad.main([])"),
        nbformat.v4.new_code_cell("s = _gpudoctor\ns.report"),
    ]
    env = {"PYTHONPATH": str(ROOT) + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""),
           "OMP_NUM_THREADS": "1"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the kernel inherits this process's environment
    try:
        client = NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
        client.execute()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    magic_out, last_out = nb.cells[1].outputs, nb.cells[2].outputs
    for outputs in (magic_out, last_out):  # %%gpudoctor shows the report, and so does s.report
        html = "".join(o.get("data", {}).get("text/html", "") for o in outputs if o.get("output_type") == "execute_result")
        assert "gpudoctor-report" in html and "GD701" in html, outputs
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert run_dir.name.startswith("nb-") and (run_dir / "report.json").is_file()
