"""How `gpudoctor check` reads code: training steps, argparse defaults, calls across files."""

from __future__ import annotations

import textwrap
from pathlib import Path

from gpudoctor.config import Config
from gpudoctor.model.findings import Severity
from gpudoctor.static import check_paths
from gpudoctor.static.symbolic import POSITIVE_VALUE, ArgDef, Resolver, const


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    return path


def _found(path_or_paths, **config) -> set[tuple[str, str, int]]:
    paths = path_or_paths if isinstance(path_or_paths, list) else [path_or_paths]
    report = check_paths(paths, Config(**config))
    assert report.errors == ()
    return {(f.code, Path(f.location.file).name, f.location.line) for f in report.findings}


def _codes(path, **config) -> set[str]:
    return {c for c, _f, _l in _found(path, **config)}


LOOP = """
import torch
device = torch.device("cuda")
for step, (x, y) in enumerate(loader):
    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    loss = criterion(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
{body}
"""


def _loop(tmp_path: Path, body: str) -> Path:
    return _write(tmp_path, "t.py", LOOP.format(body=textwrap.indent(textwrap.dedent(body), "    ")))


def test_every_n_steps_is_not_per_step_but_its_else_branch_is(tmp_path):
    path = _loop(
        tmp_path,
        """
        if step % 100 == 0:
            print(loss.item())
        else:
            total = loss.item()
        if step == 0:
            first = loss.item()
        """,
    )
    assert _found(path) == {("GD102", "t.py", 13), ("GD401", "t.py", 3)}


def test_code_after_the_step_loop_is_not_per_step(tmp_path):
    path = _write(
        tmp_path,
        "t.py",
        """
        import torch
        for epoch in range(10):
            total = torch.zeros((), device="cuda")
            for x, y in loader:
                loss = criterion(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))
                loss.backward()
                optimizer.step()
                total += loss.detach()
            print(f"epoch {epoch}: {total.item():.3f} {loss}")
            history.append(loss.cpu())
        """,
    )
    assert "GD102" not in _codes(path) and "GD303" not in _codes(path)


def test_which_patterns_get_which_code(tmp_path):
    path = _loop(
        tmp_path,
        """
        a = loss.item()
        b = float(loss)
        print(loss)
        logger.info(f"{loss:.3f}")
        c = model(x).argmax(1).cpu()
        d = y.tolist()
        e = x.numpy()
        f = x.detach().to("cpu")
        g = batch_idx.tolist()
        """,
    )
    found = _found(path)
    by_line = {line: code for code, _f, line in found}
    assert by_line[10] == by_line[11] == by_line[12] == by_line[13] == "GD102"
    assert by_line[14] == by_line[15] == by_line[16] == by_line[17] == "GD303"
    assert 18 not in by_line  # an unknown value's .tolist() is not assumed to be a tensor


def test_batches_straight_from_the_loader_are_host_tensors(tmp_path):
    path = _write(
        tmp_path,
        "t.py",
        """
        import torch
        for x, y in loader:
            n = y.numpy().sum()
            labels = y.tolist()
            loss = criterion(model(x.cuda()), y.cuda())
            loss.backward()
            optimizer.step()
        """,
    )
    assert "GD303" not in _codes(path)


def test_per_step_function_in_another_file(tmp_path):
    _write(
        tmp_path,
        "steps.py",
        """
        def train_step(model, batch, optimizer, scaler):
            x, y = batch
            loss = model(x.cuda(), y.cuda())
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            return loss.item()
        """,
    )
    train = _write(
        tmp_path,
        "train.py",
        """
        import torch
        from steps import train_step
        def main():
            for epoch in range(3):
                for batch in loader:
                    train_step(model, batch, optimizer, scaler)
        main()
        """,
    )
    report = check_paths([train], Config())
    sync = [f for f in report.findings if f.code == "GD102"]
    assert len(sync) == 1
    assert sync[0].location.file.endswith("steps.py") and sync[0].location.line == 6
    assert "`train_step()`, which runs once per training step" in sync[0].message
    assert sync[0].location.function == "train_step"


def test_lightning_training_step_is_per_step(tmp_path):
    path = _write(
        tmp_path,
        "lit.py",
        """
        import lightning as L
        class Model(L.LightningModule):
            def training_step(self, batch, batch_idx):
                x, y = batch
                loss = self.loss_fn(self.net(x), y)
                self.log("loss", loss.item())
                return loss
        trainer = L.Trainer(accelerator="gpu")
        """,
    )
    assert ("GD102", "lit.py", 6) in _found(path)


def test_code_under_a_flag_that_is_off_by_default_does_not_run(tmp_path):
    path = _write(
        tmp_path,
        "t.py",
        """
        import argparse
        import torch
        from torch.utils.data import DataLoader
        p = argparse.ArgumentParser()
        p.add_argument("--fixed", action="store_true")
        p.add_argument("--workers", type=int, default="4")
        args = p.parse_args()
        if args.fixed:
            loader = DataLoader(ds, num_workers=0, pin_memory=True)
        else:
            loader = DataLoader(ds, num_workers=args.workers, pin_memory=True, persistent_workers=True)
        torch.backends.cudnn.benchmark = args.fixed
        for x in loader:
            model(x.cuda(non_blocking=True)).sum().backward()
        """,
    )
    # the num_workers=0 loader is under --fixed (default False); "4" becomes 4 through type=int
    assert "GD201" not in _codes(path)


def test_set_defaults_and_dest(tmp_path):
    path = _write(
        tmp_path,
        "t.py",
        """
        import argparse
        from torch.utils.data import DataLoader
        p = argparse.ArgumentParser()
        p.add_argument("-j", dest="n_jobs", type=int, default=8)
        p.set_defaults(n_jobs=0)
        opt = p.parse_args()
        loader = DataLoader(ds, num_workers=opt.n_jobs)
        """,
    )
    report = check_paths([path], Config())
    msg = next(f.message for f in report.findings if f.code == "GD201")
    assert "`-j` (default 0)" in msg


def test_kwargs_dicts_are_followed_and_unknown_ones_stay_silent(tmp_path):
    path = _write(
        tmp_path,
        "t.py",
        """
        import os
        import torch
        train_kwargs = {"batch_size": 64}
        cuda_kwargs = {"num_workers": 1, "pin_memory": True, "shuffle": True}
        if torch.cuda.is_available():
            train_kwargs.update(cuda_kwargs)
        loader = torch.utils.data.DataLoader(ds, **train_kwargs)
        cpu_kwargs = {"batch_size": 64}
        if not torch.cuda.is_available():
            cpu_kwargs.update({"num_workers": 2})
        cpu_loader = torch.utils.data.DataLoader(ds, **cpu_kwargs)
        configured = torch.utils.data.DataLoader(ds, **load_config("data.yaml"))
        workers = torch.utils.data.DataLoader(ds, num_workers=os.cpu_count(), pin_memory=True)
        """,
    )
    # train_kwargs gets the CUDA settings (the judged machine has CUDA); cpu_kwargs does not;
    # load_config(...) cannot be read statically, so nothing is claimed about it
    assert _found(path) == {("GD201", "t.py", 11)}


def test_eval_loop_guarded_by_its_callers_or_set_grad_enabled(tmp_path):
    path = _write(
        tmp_path,
        "t.py",
        """
        import torch
        def evaluate(model, loader):
            model.eval()
            return sum(model(x.cuda()).sum() for x in loader) + sum(model(x.cuda()) for x in [loader][0])

        def validate(model, loader):
            model.eval()
            for x, y in loader:
                out = model(x.cuda())

        def run(model, loaders):
            for phase in ["train", "val"]:
                model.train() if phase == "train" else model.eval()
                for x, y in loaders[phase]:
                    with torch.set_grad_enabled(phase == "train"):
                        loss = criterion(model(x.cuda()), y.cuda())
                        if phase == "train":
                            loss.backward()
                            optimizer.step()

        with torch.no_grad():
            validate(model, val_loader)
        """,
    )
    assert "GD701" not in _codes(path)


def test_eval_loop_called_without_no_grad(tmp_path):
    path = _write(
        tmp_path,
        "t.py",
        """
        import torch
        def predict(net, loader):
            preds = []
            for batch in loader:
                preds.append(net(batch.cuda()).argmax(1))
            return preds

        def test_shapes():
            for x in inputs:
                assert model(x).shape == (1, 10)

        predict(model, loader)
        """,
    )
    found = _found(path)
    assert ("GD701", "t.py", 4) in found
    assert not any(code == "GD701" and line == 9 for code, _f, line in found)  # a unit test


def test_returned_loaders_bind_to_the_callers_names(tmp_path):
    path = _write(
        tmp_path,
        "t.py",
        """
        import torch
        from torch.utils.data import DataLoader
        def loaders():
            return DataLoader(a, num_workers=4, pin_memory=True), DataLoader(b, num_workers=4, pin_memory=True)
        def fit(model, loader):
            for x in loader:
                model(x.cuda(non_blocking=True)).sum().backward()
        train_loader, test_loader = loaders()
        for epoch in range(5):
            fit(model, train_loader)
        final = [model(x) for x in test_loader]
        """,
    )
    found = _found(path)
    assert [c for c in found if c[0] == "GD202"] == [("GD202", "t.py", 4)]
    report = check_paths([path], Config())
    restart = next(f for f in report.findings if f.code == "GD202")
    assert restart.severity is Severity.INFO and "t.py:9" in restart.message


def test_optimizer_flags(tmp_path):
    path = _write(
        tmp_path,
        "t.py",
        """
        import torch
        from torch.optim import SGD, LBFGS
        model = model.cuda()
        a = torch.optim.AdamW(model.parameters(), foreach=False)
        b = torch.optim.Adam(model.parameters(), fused=True)
        c = SGD(model.parameters(), lr=0.1)
        d = LBFGS(model.parameters())
        e = torch.optim.RMSprop(model.parameters())
        f = torch.optim.Adam(model.parameters(), **opt_kwargs)
        """,
    )
    report = check_paths([path], Config())
    got = {(f.location.line, f.severity) for f in report.findings if f.code == "GD404"}
    assert got == {(4, Severity.WARNING), (6, Severity.INFO)}


def test_cpu_only_script_is_not_told_about_gpu_costs(tmp_path):
    path = _write(
        tmp_path,
        "t.py",
        """
        import torch
        from torch import nn
        from torch.utils.data import DataLoader
        model = nn.Conv2d(3, 8, 3)
        optimizer = torch.optim.Adam(model.parameters())
        for x, y in DataLoader(ds, batch_size=8):
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            print(loss.item())
        """,
    )
    assert _codes(path) == {"GD201"}


def test_empty_cache_in_a_non_step_loop_is_info(tmp_path):
    path = _write(
        tmp_path,
        "t.py",
        """
        import torch
        for epoch in range(3):
            for x in loader:
                model(x.cuda(non_blocking=True)).sum().backward()
                optimizer.step()
            torch.cuda.empty_cache()
        """,
    )
    report = check_paths([path], Config())
    flush = [f for f in report.findings if f.code == "GD502"]
    assert [(f.location.line, f.severity) for f in flush] == [(6, Severity.INFO)]


def test_resolver_values():
    args = {"workers": [ArgDef("workers", "--workers", const(0), "a.py", 3)], "fast": [ArgDef("fast", "--fast", const(False), "a.py", 4)]}
    r = Resolver(args)
    assert r.resolve(("arg", "workers"), "a.py").value == 0
    assert r.resolve(("arg", "workers"), "a.py").origins == ["`--workers` (default 0)"]
    assert r.resolve(("if", ("arg", "fast"), const(8), const(0)), "a.py").value == 0
    assert r.resolve(("if", ("cuda",), const("cuda"), const("cpu")), "a.py").value == "cuda"
    assert r.resolve(("call", "min", (const(8), ("pos",))), "a.py").value is POSITIVE_VALUE
    assert r.resolve(("call", "max", (const(1), ("?",))), "a.py").value is POSITIVE_VALUE
    assert r.resolve(("cmp", ("==",), (("devtype", const("cuda:0")), const("cuda"))), "a.py").value is True
    assert r.resolve(("bin", "//", ("pos",), const(2)), "a.py").known is False
    assert r.resolve(("arg", "missing"), "a.py").known is False


def test_mixed_precision_through_accelerate_counts_as_autocast(tmp_path):
    text = """
        import torch
        from accelerate import Accelerator
        accelerator = Accelerator(mixed_precision={mp!r})
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        for x, y in loader:
            loss = criterion(model(x.cuda()), y)
            accelerator.backward(loss)
            optimizer.step()
        """
    on = _write(tmp_path, "on.py", text.format(mp="bf16"))
    off = _write(tmp_path, "off.py", text.format(mp="no"))
    assert "GD401" not in _codes(on)
    assert "GD401" in _codes(off)


def test_blocking_copy_only_from_the_pinned_loader(tmp_path):
    path = _write(
        tmp_path,
        "t.py",
        """
        import torch
        from torch.utils.data import DataLoader
        pinned = DataLoader(a, num_workers=2, pin_memory=True, persistent_workers=True)
        pageable = DataLoader(b, num_workers=2, persistent_workers=True)
        for x in pinned:
            model(x.cuda()).sum().backward()
        for x in pageable:
            model(x.cuda()).sum().backward()
        """,
    )
    found = _found(path)
    assert ("GD302", "t.py", 6) in found
    assert ("GD302", "t.py", 8) not in found
    assert ("GD301", "t.py", 8) in found  # at the copy of the pageable loader's batch; its fix on line 4


def test_a_parameter_passed_down_a_chain_of_helpers_is_resolved_once_per_level():
    # 30 levels of helpers, each called from 3 sites that pass their own parameter on: without
    # remembering what a level resolved to, that is 3**30 evaluations (torch.distributed.optim's shape)
    calls = []

    def sites(sym):
        calls.append(sym)
        level = sym[1]
        if level == 30:
            return [(const(4), "f.py")] * 3
        return [(("param", level + 1, "x", 0, None), "f.py")] * 3

    r = Resolver({}, param=sites)
    assert r.resolve(("param", 0, "x", 0, None), "f.py").value == 4
    assert len(calls) == 31
    # a parameter that comes back to itself is unknown, not a hang
    loop = Resolver({}, param=lambda sym: [(("param", 1 - sym[1], "x", 0, None), "f.py")])
    assert loop.resolve(("param", 0, "x", 0, None), "f.py").value != 4
