"""One rule per module (``gdNNN_<name>.py``); see ``registry``."""

from __future__ import annotations
