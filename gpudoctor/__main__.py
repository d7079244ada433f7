"""Entry point of ``gpudoctor`` (the console script) and ``python -m gpudoctor``.

Kept tiny: SIGINT, SIGTERM and SIGHUP are handled (``gpudoctor.signals``) before click and
the rest of gpudoctor are imported, so a signal at any moment of start-up ends gpudoctor
with one line and ``128 + signal`` (130, 143, 129), never with a traceback. What comes
before this module runs (Python's own start-up, a few tens of milliseconds) is Python's.
"""

from __future__ import annotations

import sys

try:  # stdlib only (signal, os, time: loaded with Python already)
    from gpudoctor import signals
except KeyboardInterrupt:  # Ctrl-C in the microseconds before the handlers exist
    if sys.stderr is not None:
        sys.stderr.write("gpudoctor: interrupted\n")
    sys.exit(130)


def main() -> None:
    signals.install()
    try:
        signals.pause_point("entry")
        from gpudoctor.cli import main as cli_main

        cli_main()
    except KeyboardInterrupt as err:  # while importing, or a second signal while the first was handled
        signals.exit_interrupted(err)


if __name__ == "__main__":
    main()
