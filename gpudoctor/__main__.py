from __future__ import annotations

from gpudoctor.cli import main

if __name__ == "__main__":
    main()
