"""``gpudoctor compare``: the settings that changed between the runs, with the ``file:line`` that set them.

DataLoaders and optimizers are paired by call site, then by what they hold; global flags
(cudnn, TF32, matmul precision), AMP, torch.compile and the wrappers, memory calls, the
device, threads and the environment are compared by name (``analysis.compare``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gpudoctor.model.compare import (
    SettingChange,
)
from gpudoctor.model.run import OptimizerSetting, Settings


def _val(v: Any) -> str:
    """A setting's value as Python spells it."""
    if isinstance(v, str):
        return v
    return repr(v)


def _pair(
    items_a: Sequence[Any],
    items_b: Sequence[Any],
    keys: Sequence[Callable[[Any], Any]],
) -> list[tuple[Any | None, Any | None]]:
    """Match items of A with items of B: by each key in turn (in order), the rest by position."""
    left_a = list(range(len(items_a)))
    left_b = list(range(len(items_b)))
    pairs: list[tuple[int | None, int | None]] = []
    for key in keys:
        for i in list(left_a):
            ka = key(items_a[i])
            if ka is None:
                continue
            for j in left_b:
                if key(items_b[j]) == ka:
                    pairs.append((i, j))
                    left_a.remove(i)
                    left_b.remove(j)
                    break
    pairs += list(zip(left_a, left_b, strict=False))
    n = min(len(left_a), len(left_b))
    pairs += [(i, None) for i in left_a[n:]] + [(None, j) for j in left_b[n:]]
    pairs.sort(key=lambda p: (p[0] if p[0] is not None else len(items_a), p[1] if p[1] is not None else 0))
    return [(items_a[i] if i is not None else None, items_b[j] if j is not None else None) for i, j in pairs]


def _site_key(item: Any) -> tuple[str, int] | None:
    site = item.call_site
    return (site.file, site.line) if site is not None else None


_LOADER_FIELDS = ("batch_size", "num_workers", "pin_memory", "prefetch_factor", "persistent_workers", "drop_last",
                  "multiprocessing_context")


_OPTIMIZER_FIELDS = ("foreach", "fused")


def _fields_text(item: Any, fields: Sequence[str]) -> str:
    return ", ".join(f"{k}={_val(getattr(item, k))}" for k in fields)


def _unique_labels(labels: list[str], pairs: list[tuple[Any, Any]]) -> list[str]:
    out = []
    for lab, (a, b) in zip(labels, pairs, strict=True):
        if labels.count(lab) > 1:
            site = (b or a).call_site
            lab = f"{lab} at {site}" if site is not None else lab
        out.append(lab)
    return out


def setting_changes(sa: Settings, sb: Settings) -> list[SettingChange]:
    out: list[SettingChange] = []
    # DataLoaders
    pairs = _pair(sa.dataloaders, sb.dataloaders, [_site_key, lambda d: d.dataset])
    labels = _unique_labels([f"DataLoader({(a or b).dataset})" for a, b in pairs], pairs)
    for label, (a, b) in zip(labels, pairs, strict=True):
        if a is None or b is None:
            out.append(SettingChange(
                "DataLoader", label,
                "absent" if a is None else _fields_text(a, _LOADER_FIELDS[:4]),
                "absent" if b is None else _fields_text(b, _LOADER_FIELDS[:4]),
                a.call_site if a else None, b.call_site if b else None,
            ))
            continue
        for k in _LOADER_FIELDS:
            va, vb = getattr(a, k), getattr(b, k)
            if va != vb:
                out.append(SettingChange("DataLoader", f"{label}.{k}", _val(va), _val(vb), a.call_site, b.call_site))
    # optimizers
    opairs = _pair(sa.optimizers, sb.optimizers, [_site_key, lambda o: o.cls])
    olabels = _unique_labels([f"optimizer({_short(o.cls)})" for o in (a or b for a, b in opairs)], opairs)
    for label, (a, b) in zip(olabels, opairs, strict=True):
        if a is None or b is None:
            out.append(SettingChange(
                "optimizer", label,
                "absent" if a is None else _opt_text(a),
                "absent" if b is None else _opt_text(b),
                a.call_site if a else None, b.call_site if b else None,
            ))
            continue
        if a.cls != b.cls:
            out.append(SettingChange("optimizer", f"{label}.class", a.cls, b.cls, a.call_site, b.call_site))
        for k in _OPTIMIZER_FIELDS:
            va, vb = getattr(a, k), getattr(b, k)
            if va != vb:
                out.append(SettingChange("optimizer", f"{label}.{k}", _val(va), _val(vb), a.call_site, b.call_site))
    # global flags (cudnn, TF32, matmul precision)
    fa = {f.name: f for f in sa.flags}
    fb = {f.name: f for f in sb.flags}
    for name in [*fa, *(n for n in fb if n not in fa)]:
        a_flag, b_flag = fa.get(name), fb.get(name)
        va = a_flag.value if a_flag is not None else None
        vb = b_flag.value if b_flag is not None else None
        if (a_flag is None) != (b_flag is None) or va != vb:
            out.append(SettingChange(
                "flags", name,
                _val(va) if a_flag is not None else "unknown",
                _val(vb) if b_flag is not None else "unknown",
                a_flag.call_site if a_flag else None, b_flag.call_site if b_flag else None,
            ))
    # AMP
    am_a, am_b = _autocast_text(sa), _autocast_text(sb)
    if am_a != am_b:
        out.append(SettingChange("AMP", "autocast", am_a, am_b,
                                 sa.autocast[0].call_site if sa.autocast else None,
                                 sb.autocast[0].call_site if sb.autocast else None))
    gs_a = "used" if sa.grad_scalers else "absent"
    gs_b = "used" if sb.grad_scalers else "absent"
    if gs_a != gs_b:
        out.append(SettingChange("AMP", "GradScaler", gs_a, gs_b,
                                 sa.grad_scalers[0] if sa.grad_scalers else None,
                                 sb.grad_scalers[0] if sb.grad_scalers else None))
    # torch.compile, DataParallel, DDP
    for kind in sorted({w.kind for w in (*sa.wrappers, *sb.wrappers)}):
        wa = [w for w in sa.wrappers if w.kind == kind]
        wb = [w for w in sb.wrappers if w.kind == kind]
        ta = "; ".join(_wrap_text(w) for w in wa) or "absent"
        tb = "; ".join(_wrap_text(w) for w in wb) or "absent"
        if ta != tb:
            category = "torch.compile" if kind == "torch.compile" else "wrapping"
            out.append(SettingChange(category, kind, ta, tb, wa[0].call_site if wa else None,
                                     wb[0].call_site if wb else None))
    # memory, device, threads, environment
    if len(sa.empty_cache_calls) != len(sb.empty_cache_calls):
        out.append(SettingChange("memory", "torch.cuda.empty_cache() call sites", str(len(sa.empty_cache_calls)),
                                 str(len(sb.empty_cache_calls)),
                                 sa.empty_cache_calls[0] if sa.empty_cache_calls else None,
                                 sb.empty_cache_calls[0] if sb.empty_cache_calls else None))
    if sa.device_type != sb.device_type:
        out.append(SettingChange("device", "device type", sa.device_type, sb.device_type))
    for k, name in (("num_threads", "torch.get_num_threads()"), ("interop_threads", "torch.get_num_interop_threads()"),
                    ("cpu_count", "cores available")):
        va, vb = getattr(sa, k), getattr(sb, k)
        if va != vb:
            out.append(SettingChange("threads", name, _val(va) if va is not None else "unknown",
                                     _val(vb) if vb is not None else "unknown"))
    for key in sorted(set(sa.env) | set(sb.env)):
        va, vb = sa.env.get(key), sb.env.get(key)
        if va != vb:
            out.append(SettingChange("environment", key, va if va is not None else "unset",
                                     vb if vb is not None else "unset"))
    return out


def _short(cls: str) -> str:
    return cls.rsplit(".", 1)[-1]


def _opt_text(o: OptimizerSetting) -> str:
    return f"{o.cls}, " + _fields_text(o, _OPTIMIZER_FIELDS)


def _autocast_text(s: Settings) -> str:
    uses = sorted({f"{u.device_type} {u.dtype}" for u in s.autocast if u.enabled})
    return ", ".join(uses) if uses else "absent"


def _wrap_text(w: Any) -> str:
    opts = ", ".join(f"{k}={_val(v)}" for k, v in sorted(w.options.items()))
    return f"{w.module}({opts})" if w.module else (opts or "on")
