"""Run sample scripts as ``python SCRIPT ARGS`` would, several in one interpreter.

usage: python quick_runner.py CASES.json RESULTS.json

CASES.json is a list of ``[script_path, [args...]]``. Each case runs through
``runpy.run_path(script, run_name="__main__")`` with ``sys.argv`` set, so torch
is imported once for all of them (the tests stay fast) while each script runs
exactly as it does bare. RESULTS.json gets, per case: ``exit_code`` (0, the
``SystemExit`` code, or 1 on an exception), ``error`` (the traceback),
``stdout`` and ``wall_s``.
"""

from __future__ import annotations

import contextlib
import io
import json
import runpy
import sys
import time
import traceback


def run_case(script: str, args: list[str]) -> dict:
    print(f"quick_runner: {script} {' '.join(args)}", file=sys.stderr, flush=True)
    out = io.StringIO()
    saved_argv = sys.argv
    sys.argv = [script, *args]
    code, error = 0, ""
    start = time.perf_counter()
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # report every failure of the script, whatever it is
        code, error = 1, traceback.format_exc()
    finally:
        sys.argv = saved_argv
    return {"exit_code": code, "error": error, "stdout": out.getvalue(), "wall_s": time.perf_counter() - start}


def main() -> int:
    cases_path, results_path = sys.argv[1], sys.argv[2]
    with open(cases_path, encoding="utf-8") as f:
        cases = json.load(f)
    results = [run_case(script, list(args)) for script, args in cases]
    with open(results_path, "w", encoding="utf-8") as f:
        json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
