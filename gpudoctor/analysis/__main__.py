"""``python -m gpudoctor.analysis PATH…``: parse + every metric, printed as JSON.

The metrics half of ``gpudoctor analyze`` without the rules and the report: for
checking the analysis layer on its own and for timing it (benchmarks/analyze.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if args else 2
    from gpudoctor.analysis import analyze_trace
    from gpudoctor.errors import GpudoctorError
    from gpudoctor.parse import load_inputs

    try:
        loaded = load_inputs([Path(a) for a in args])
    except GpudoctorError as err:
        print(f"gpudoctor: error: {err}", file=sys.stderr)
        return err.exit_code
    out = {
        "source": loaded.run.source,
        "notes": list(loaded.run.notes),
        "metrics": [analyze_trace(t, loaded.run).to_dict() for t in loaded.timelines],
    }
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
