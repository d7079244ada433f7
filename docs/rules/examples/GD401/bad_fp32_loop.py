# A CUDA training loop entirely in FP32.
import torch

model = model.to("cuda")
for x, y in loader:
    x, y = x.to("cuda", non_blocking=True), y.to("cuda", non_blocking=True)
    loss = criterion(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
