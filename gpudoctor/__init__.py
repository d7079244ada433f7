"""gpudoctor: why is my GPU waiting, and what should I change?"""

from __future__ import annotations

__version__ = "0.1.0"
