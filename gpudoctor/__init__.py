"""gpudoctor: why is my GPU waiting, and what should I change?

The Python API (``gpudoctor.session``, ``analyze``, ``load``: docs/in-process.md) is imported on first use,
so that ``import gpudoctor`` (and the command line) stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["Session", "__version__", "analyze", "load", "session"]

if TYPE_CHECKING:
    from gpudoctor.api import Session, analyze, load, session


def load_ipython_extension(shell: Any) -> None:
    """``%load_ext gpudoctor`` in IPython or Jupyter: the ``%%gpudoctor`` and ``%gpudoctor_report`` magics."""
    from gpudoctor.integrations.notebook import load_ipython_extension as load

    load(shell)


def __getattr__(name: str) -> Any:
    if name in ("Session", "analyze", "load", "session"):
        from gpudoctor import api

        return getattr(api, name)
    raise AttributeError(f"module 'gpudoctor' has no attribute {name!r}")
