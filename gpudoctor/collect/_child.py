"""Entry point of the training process: ``python -m gpudoctor.collect._child`` (see child.py).

Kept tiny so that the real module is imported under its own name, not as ``__main__``
(which the user's script takes over).
"""

import sys

try:
    from gpudoctor.collect.child import main
except KeyboardInterrupt:  # started by torchrun (SIGINT not blocked): Ctrl-C while importing
    sys.exit(130)

if __name__ == "__main__":
    main()
