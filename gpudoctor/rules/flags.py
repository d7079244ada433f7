"""The flags the run recorded (cuDNN benchmark, TF32): found by name, as evidence and as text."""

from __future__ import annotations

from gpudoctor.model.findings import SettingRef
from gpudoctor.model.run import FlagSetting
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.formatting import location_of


def find_flag(ctx: RuleContext, *suffixes: str) -> FlagSetting | None:
    """The first recorded flag whose name ends with one of ``suffixes`` (collect's names are
    fully qualified: "torch.backends.cudnn.benchmark", "torch.backends.cuda.matmul.allow_tf32",
    "torch.float32_matmul_precision")."""
    s = ctx.settings
    if s is None:
        return None
    for suffix in suffixes:
        for f in s.flags:
            if f.name == suffix or f.name.endswith("." + suffix) or f.name.endswith(suffix):
                return f
    return None


def flag_ref(f: FlagSetting) -> SettingRef:
    return SettingRef(f.name, f.value, location_of(f.call_site))


def flag_text(f: FlagSetting) -> str:
    where = f"set at {f.call_site}" if f.call_site is not None else "left at the default"
    return f"{f.name}={f.value!r} ({where})"
