from __future__ import annotations

import sys

try:
    from gpudoctor.cli import main
except KeyboardInterrupt:  # Ctrl-C while gpudoctor itself is still importing: no traceback
    if sys.stderr is not None:
        sys.stderr.write("gpudoctor: interrupted\n")
    sys.exit(130)

if __name__ == "__main__":
    main()
