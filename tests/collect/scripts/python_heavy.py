"""A training loop whose steps make many short Python calls (a hashing tokenizer in the loop).

--calls N    Python calls per step, about (default 120000: more than a window's budget of
             400000 allows for 5 steps, so gpudoctor records fewer of them with stacks)
--steps S    steps (default 16)
"""

import argparse
import zlib

import torch
from torch import nn


def tokenize(words, vocab):
    ids = [vocab.get(w, 1) for w in words]  # one dict.get (a C call) per word
    return [i + zlib.crc32(w.encode()) % 97 for i, w in zip(ids, words, strict=True)]  # crc32 + encode per word


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=120_000)
    p.add_argument("--steps", type=int, default=16)
    args = p.parse_args()
    torch.manual_seed(0)
    words = [f"w{i % 5000}" for i in range(max(1, args.calls // 3))]
    vocab = {f"w{i}": i for i in range(2500)}
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(args.steps):
        tokens = tokenize(words, vocab)
        x = torch.tensor(tokens[:64 * 8], dtype=torch.float32).reshape(8, 64) / 1000.0
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
