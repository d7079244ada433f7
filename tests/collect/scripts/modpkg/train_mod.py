"""Run with -m modpkg.train_mod (a namespace package: no __init__.py)."""

import json
import sys

import torch

if __name__ == "__main__":
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(4):
        opt.zero_grad()
        model(torch.ones(3, 2)).sum().backward()
        opt.step()
    with open(sys.argv[1], "w") as f:
        json.dump({"name": __name__, "argv": sys.argv, "path0": sys.path[0], "spec": __spec__.name}, f)
