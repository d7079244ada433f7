# One intra-op thread per worker (PyTorch's default); the cores stay with the training process.
import torch
from torch.utils.data import DataLoader


def worker_init(worker_id):
    torch.set_num_threads(1)


loader = DataLoader(dataset, batch_size=64, num_workers=4, pin_memory=True,
                    persistent_workers=True, worker_init_fn=worker_init)
for x, y in loader:
    loss = criterion(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
