"""Sets every setting gpudoctor records, each on a line tagged `# SITE:<name>` for the test.

Trains 3 steps on the CPU. Needs a writable folder in argv[1] (the DDP file store).
"""

import os
import sys
import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

warnings.simplefilter("ignore")  # CUDA-only APIs on a CPU machine warn; not under test here

torch.backends.cudnn.benchmark = True  # SITE:cudnn_benchmark
torch.backends.cudnn.deterministic = False  # SITE:cudnn_deterministic
torch.backends.cuda.matmul.allow_tf32 = True  # SITE:matmul_tf32
torch.backends.cudnn.allow_tf32 = True  # SITE:cudnn_tf32
torch.set_float32_matmul_precision("high")  # SITE:matmul_precision
torch.set_num_threads(1)  # SITE:num_threads


def make_loader():
    data = TensorDataset(torch.randn(32, 8), torch.randn(32, 1))
    return DataLoader(data, batch_size=4, shuffle=True, num_workers=0, pin_memory=False, drop_last=True)  # SITE:dataloader


def main():
    loader = make_loader()
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
    dp = nn.DataParallel(model)  # SITE:data_parallel
    dist.init_process_group("gloo", init_method=f"file://{os.path.join(sys.argv[1], 'store')}", rank=0, world_size=1)
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=10, find_unused_parameters=True, gradient_as_bucket_view=True, static_graph=False)  # SITE:ddp
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)  # SITE:compile
    del compiled, dp
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)  # SITE:adam
    sgd = torch.optim.SGD(model.parameters(), lr=1e-3, fused=True)  # SITE:sgd
    scaler = torch.amp.GradScaler("cpu")  # SITE:grad_scaler
    for x, y in loader:
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):  # SITE:autocast
            out = ddp(x)
        with torch.cpu.amp.autocast():  # SITE:autocast_deprecated
            pass
        with torch.cuda.amp.autocast(enabled=False):  # SITE:autocast_cuda_deprecated
            pass
        loss = nn.functional.mse_loss(out.float(), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        torch.cuda.empty_cache()  # SITE:empty_cache
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    del sgd
    dist.destroy_process_group()
    print("settings_zoo: done")


if __name__ == "__main__":
    main()
