"""collect: run an unmodified training script under the instruments and leave a run directory.

``profile_run(ProfileOptions(...)) -> ProfileResult`` is the whole API (cli.py's
``profile`` command calls it). The parent side (this process) never imports torch;
the training process runs :mod:`gpudoctor.collect.child`. See docs/run-directory.md.

The names are imported on first use, so that the training process, which imports
``gpudoctor.collect.child``, does not load the parent's machinery.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpudoctor.collect.options import ProfileOptions, ProfileResult
    from gpudoctor.collect.runner import profile_run

__all__ = ["ProfileOptions", "ProfileResult", "profile_run"]


def __getattr__(name: str) -> Any:
    if name in ("ProfileOptions", "ProfileResult"):
        from gpudoctor.collect import options

        return getattr(options, name)
    if name == "profile_run":
        from gpudoctor.collect.runner import profile_run

        return profile_run
    raise AttributeError(f"module 'gpudoctor.collect' has no attribute {name!r}")
