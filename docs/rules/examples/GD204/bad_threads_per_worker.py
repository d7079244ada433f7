# Every worker is told to use all the cores for its own intra-op threads.
import os

import torch
from torch.utils.data import DataLoader


def worker_init(worker_id):
    torch.set_num_threads(os.cpu_count())


loader = DataLoader(dataset, batch_size=64, num_workers=4, pin_memory=True,
                    persistent_workers=True, worker_init_fn=worker_init)
for x, y in loader:
    loss = criterion(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
