"""Loops of every shape for the step-marker tests; deterministic, tiny, CPU.

--shape manual    an LSTM language model on a token tensor, batches sliced from it,
                  parameters updated by hand after loss.backward() (no optimizer, no DataLoader)
--shape eval      an evaluation loop over a list of tensors without torch.no_grad();
                  the model's __init__ calls a submodule once to infer a size
--shape accum     gradient accumulation (--accum K micro-batches per optimizer step) over a
                  DataLoader whose collate_fn sleeps --collate-ms
--shape eval_seq  the same evaluation loop with an nn.Sequential model (torch's own class:
                  its calls are watched by hooks on the instance, not by a wrapped forward)
--shape data      DataLoader batches only, no model
--shape lbfgs     LBFGS, whose step(closure) runs the forward and backward(): phases inside
                  the optimizer's; the forward and the backward each sleep --phase-ms
--shape tensors   bare tensor arithmetic for --seconds, nothing torch would call a step
--shape scaler    a GradScaler (CPU) over a DataLoader; the loss is infinite at every
                  --inf-every'th iteration, so the scaler skips that optimizer step
--shape amp       training under torch.autocast (bfloat16) at every step; from iteration
                  --eval-from on, each step also evaluates under an autocast of its own line
--shape gan       a DCGAN-shaped loop over a DataLoader: each iteration steps the
                  discriminator's optimizer (two backward() calls: real and fake) and then
                  the generator's (one backward()); one step per iteration, no accumulation
--shape word_lm   pytorch/examples' word_language_model: per epoch (--epochs), train() over --iters
                  batches under model.train() with manual updates after loss.backward(), then
                  evaluate() over --eval-batches batches under model.eval() and torch.no_grad()
                  (with --eval-grad: without it); the model saved with torch.save and loaded back
                  (a new object) for a last evaluate() of the test set
--shape train_eval  training epochs (--epochs) of a classifier over a DataLoader, then an
                  evaluation pass over --eval-batches batches in model.eval() mode, without
                  torch.no_grad() (with --eval-no-grad: under torch.no_grad())

--iters N         loop iterations (batches); --raise-in forward|backward --raise-at K raises
                  inside that call at iteration K; --print-losses prints every loss (the
                  outputs-unchanged test compares them with and without gpudoctor);
                  --save FILE torch.save()s the model at the end, loads it back and prints
                  the forward hooks of both; --break-tracking K breaks gpudoctor's step tracking on purpose
                  at step K (its step boundaries raise from there on), and the script then prints how
                  many iterations it began (manual, eval, data, scaler), however it ends
"""

import argparse
import contextlib
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

ARGS = None
ITERS = 0  # iterations begun (manual, eval, data, scaler)


class Planted(Exception):
    pass


def maybe_raise(where, i):
    if ARGS.raise_in == where and i == ARGS.raise_at:
        raise Planted(f"planted failure in {where} at iteration {i}")


class LM(nn.Module):
    """embedding -> LSTM -> linear decoder, as word_language_model's RNNModel."""

    def __init__(self, vocab=50, dim=16):
        super().__init__()
        self.encoder = nn.Embedding(vocab, dim)
        self.rnn = nn.LSTM(dim, dim)
        self.decoder = nn.Linear(dim, vocab)
        self.step = 0

    def forward(self, x, hidden):
        maybe_raise("forward", self.step)
        self.step += 1
        out, hidden = self.rnn(self.encoder(x), hidden)
        return self.decoder(out), hidden


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU())
        with torch.no_grad():  # a shape probe in __init__: a submodule called alone, once
            width = self.features(torch.zeros(1, 8)).shape[1]
        self.head = nn.Linear(width, 3)

    def forward(self, x):
        return self.head(self.features(x))


class Rows(Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(n, 8, generator=g)
        self.y = torch.randint(0, 3, (n,), generator=g)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def slow_collate(items):
    time.sleep(ARGS.collate_ms / 1000)
    return torch.stack([x for x, _ in items]), torch.stack([y for _, y in items])


def manual():
    torch.manual_seed(0)
    corpus = torch.randint(0, 50, (ARGS.iters * 5 + 1, 4))  # (tokens, batch columns)
    model = LM()
    lr = 0.5
    hidden = None
    global ITERS
    for i in range(ARGS.iters):
        ITERS += 1
        data, target = corpus[i * 5 : i * 5 + 5], corpus[i * 5 + 1 : i * 5 + 6]
        if hidden is not None:
            hidden = tuple(h.detach() for h in hidden)
        model.zero_grad()
        out, hidden = model(data, hidden)
        loss = nn.functional.cross_entropy(out.view(-1, 50), target.reshape(-1))
        if ARGS.raise_in == "backward" and i == ARGS.raise_at:
            loss.register_hook(lambda g, at=i: maybe_raise("backward", at))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
        if ARGS.print_losses:
            print(f"loss {i} {loss.item():.10f}")
    return model


def evaluate():
    torch.manual_seed(0)
    model = Classifier()
    model.eval()
    batches = [torch.randn(16, 8) for _ in range(ARGS.iters)]
    total = 0.0
    global ITERS
    for x in batches:  # no torch.no_grad(): autograd records every op
        ITERS += 1
        total += model(x).softmax(1).max(1).values.sum().item()  # SITE:eval_loop
    print(f"eval score {total:.6f}")
    return model


def evaluate_sequential():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    model.eval()
    batches = [torch.randn(16, 8) for _ in range(ARGS.iters)]
    total = 0.0
    global ITERS
    for x in batches:
        ITERS += 1
        total += model(x).sum().item()
    print(f"eval score {total:.6f}")
    return model


def accum():
    torch.manual_seed(0)
    model = Classifier()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(Rows(ARGS.iters * 4), batch_size=4, collate_fn=slow_collate)
    for i, (x, y) in enumerate(loader):
        loss = nn.functional.cross_entropy(model(x), y) / ARGS.accum
        loss.backward()
        if (i + 1) % ARGS.accum == 0:
            opt.step()
            opt.zero_grad()
        if ARGS.print_losses:
            print(f"loss {i} {loss.item():.10f}")
    return model


class Sleepy(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        time.sleep(ARGS.phase_ms / 1000)
        return self.fc(x)


def lbfgs():
    torch.manual_seed(0)
    model = Sleepy()
    opt = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=1)
    x, y = torch.randn(16, 8), torch.randint(0, 3, (16,))

    def closure():
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.register_hook(lambda g: time.sleep(ARGS.phase_ms / 1000) or g)  # runs inside backward()
        loss.backward()
        return loss

    for _ in range(ARGS.iters):
        opt.step(closure)
    return model


def scaler():
    torch.manual_seed(0)
    model = Classifier()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    amp_scaler = torch.amp.GradScaler("cpu")
    loader = DataLoader(Rows(ARGS.iters * 4), batch_size=4)
    skipped = 0
    global ITERS
    for i, (x, y) in enumerate(loader):
        ITERS += 1
        loss = nn.functional.cross_entropy(model(x), y)
        if ARGS.inf_every and i % ARGS.inf_every == ARGS.inf_every - 1:
            loss = loss * float("inf")
        before = amp_scaler.get_scale()
        amp_scaler.scale(loss).backward()
        amp_scaler.step(opt)
        amp_scaler.update()
        skipped += amp_scaler.get_scale() < before
        opt.zero_grad()
    print(f"scaler skipped {skipped}")
    return model


def amp():
    torch.manual_seed(0)
    model = Classifier()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(16, 8), torch.randint(0, 3, (16,))
    for i in range(ARGS.iters):
        with torch.autocast("cpu", dtype=torch.bfloat16):  # SITE:train_autocast
            loss = nn.functional.cross_entropy(model(x).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if i >= ARGS.eval_from:
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):  # SITE:eval_autocast
                model(x)
    return model


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8))

    def forward(self, z):
        return self.net(z)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))

    def forward(self, x):
        return self.net(x).view(-1)


def gan():
    """As pytorch/examples' dcgan: optimizerD steps, then optimizerG, in every iteration."""
    torch.manual_seed(0)
    net_g, net_d = Generator(), Discriminator()
    opt_d = torch.optim.Adam(net_d.parameters(), lr=2e-4, betas=(0.5, 0.999))
    opt_g = torch.optim.Adam(net_g.parameters(), lr=2e-4, betas=(0.5, 0.999))
    bce = nn.BCEWithLogitsLoss()
    loader = DataLoader(Rows(ARGS.iters * 4), batch_size=4)
    for x, _ in loader:
        n = x.shape[0]
        net_d.zero_grad()
        err_real = bce(net_d(x), torch.ones(n))
        err_real.backward()
        fake = net_g(torch.randn(n, 4))
        err_fake = bce(net_d(fake.detach()), torch.zeros(n))
        err_fake.backward()
        opt_d.step()
        net_g.zero_grad()
        err_g = bce(net_d(fake), torch.ones(n))
        err_g.backward()
        opt_g.step()
        if ARGS.print_losses:
            print(f"loss {(err_real + err_fake).item():.10f} {err_g.item():.10f}")
    return net_g


def word_lm():
    torch.manual_seed(0)
    bptt, vocab = 5, 50
    train_data = torch.randint(0, vocab, (ARGS.iters * bptt + 1, 4))
    valid_data = torch.randint(0, vocab, (ARGS.eval_batches * bptt + 1, 4))
    model = LM(vocab)

    def evaluate(source):
        model.eval()
        total, hidden = 0.0, None
        with contextlib.nullcontext() if ARGS.eval_grad else torch.no_grad():
            for i in range(0, source.size(0) - 1, bptt):
                data, target = source[i : i + bptt], source[i + 1 : i + 1 + bptt]
                out, hidden = model(data, hidden)  # SITE:word_lm_eval
                hidden = tuple(h.detach() for h in hidden)
                total += nn.functional.cross_entropy(out.view(-1, vocab), target.reshape(-1)).item()
        return total

    def train():
        model.train()
        hidden = None
        for i in range(0, train_data.size(0) - 1, bptt):
            data, target = train_data[i : i + bptt], train_data[i + 1 : i + 1 + bptt]
            if hidden is not None:
                hidden = tuple(h.detach() for h in hidden)
            model.zero_grad()
            out, hidden = model(data, hidden)
            nn.functional.cross_entropy(out.view(-1, vocab), target.reshape(-1)).backward()
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-0.5)

    for _ in range(ARGS.epochs):
        train()
        print(f"valid loss {evaluate(valid_data):.4f}")
    torch.save(model, "best.pt")
    model = torch.load("best.pt", weights_only=False)
    print(f"test loss {evaluate(valid_data):.4f}")
    return None


def train_eval():
    """Training epochs, then an evaluation pass (the model in eval mode) after training."""
    torch.manual_seed(0)
    model = Classifier()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(Rows(ARGS.iters * 4), batch_size=4)
    for _ in range(ARGS.epochs):
        model.train()
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    correct = 0
    with torch.no_grad() if ARGS.eval_no_grad else contextlib.nullcontext():
        for x, y in list(loader)[: ARGS.eval_batches]:
            out = model(x)  # SITE:eval_call
            correct += int((out.argmax(1) == y).sum())
    print(f"eval correct {correct}")
    return model


def data_only():
    loader = DataLoader(Rows(ARGS.iters * 4), batch_size=4)
    total = 0.0
    global ITERS
    for x, _ in loader:
        ITERS += 1
        total += float(x.sum())
    print(f"data sum {total:.4f}")


def tensors():
    a = torch.randn(64, 64)
    n = 0
    end = time.monotonic() + ARGS.seconds
    while time.monotonic() < end:
        a = torch.tanh(a @ a.T / 64)
        n += 1
    print(f"tensor loops {n > 0}")


def break_tracking(at):
    """Make gpudoctor's step boundaries raise from step ``at`` on (its step tracking then stops)."""
    from gpudoctor.collect.steps import tracker  # noqa: PLC0415 - only under gpudoctor profile

    orig = tracker.StepTracker._open

    def broken(self, now_ns, ru=None):
        if self.index >= at:
            raise RuntimeError("broken on purpose by the test script")
        return orig(self, now_ns, ru)

    tracker.StepTracker._open = broken


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--shape", required=True, choices=["manual", "eval", "eval_seq", "accum", "data", "tensors", "lbfgs", "scaler", "amp",
                                                      "gan", "train_eval", "word_lm"])
    p.add_argument("--iters", type=int, default=12)
    p.add_argument("--accum", type=int, default=4)
    p.add_argument("--collate-ms", type=float, default=0.0)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--phase-ms", type=float, default=0.0)
    p.add_argument("--inf-every", type=int, default=0)
    p.add_argument("--eval-from", type=int, default=0)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--eval-batches", type=int, default=6)
    p.add_argument("--eval-no-grad", action="store_true")
    p.add_argument("--eval-grad", action="store_true")
    p.add_argument("--raise-in", choices=["forward", "backward"])
    p.add_argument("--raise-at", type=int, default=-1)
    p.add_argument("--print-losses", action="store_true")
    p.add_argument("--save")
    p.add_argument("--break-tracking", type=int, default=None)
    ARGS = p.parse_args()
    torch.set_num_threads(1)
    shapes = {"manual": manual, "eval": evaluate, "eval_seq": evaluate_sequential, "accum": accum, "data": data_only, "tensors": tensors, "lbfgs": lbfgs,
              "scaler": scaler, "amp": amp, "gan": gan, "train_eval": train_eval, "word_lm": word_lm}
    if ARGS.break_tracking is not None:
        break_tracking(ARGS.break_tracking)
        try:
            shapes[ARGS.shape]()
        finally:
            print(f"loops: {ITERS} iterations begun")
        return
    model = shapes[ARGS.shape]()
    if ARGS.save and model is not None:
        torch.save(model, ARGS.save)  # pickles the whole module, hooks and all
        loaded = torch.load(ARGS.save, weights_only=False)
        live = len(model._forward_hooks) + len(model._forward_pre_hooks)
        saved = len(loaded._forward_hooks) + len(loaded._forward_pre_hooks)
        wrapped = hasattr(type(model).forward, "__wrapped__")  # the class's forward, timed by gpudoctor
        same = bool(torch.equal(loaded.decoder.weight, model.decoder.weight)) if hasattr(model, "decoder") else True
        print(f"hooks: live {live}, saved {saved}, class forward wrapped {wrapped}, loaded same {same}")
    print("loops: done")


if __name__ == "__main__":
    main()
