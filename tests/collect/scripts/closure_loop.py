"""A training loop whose forward and backward run inside ``optimizer.step(closure)`` (``closure``, the
default; ``lbfgs``: LBFGS, which calls its closure several times per step), or outside it (``plain``:
``backward()`` before ``step()``): the same model, data and optimizer work."""

from __future__ import annotations

import sys

import torch


def main(mode: str = "closure", steps: int = 30) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    if mode == "lbfgs":
        opt: torch.optim.Optimizer = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=3)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, foreach=False)
    x = torch.randn(512, 512)
    y = torch.randint(0, 10, (512,))

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        return loss

    for _ in range(steps):
        if mode == "plain":
            closure()
            opt.step()
        else:
            opt.step(closure)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "closure")
