# Printing a CUDA tensor copies it to the host and waits for the GPU.
import torch

device = torch.device("cuda")
for x, y in loader:
    logits = model(x.to(device))
    loss = criterion(logits, y.to(device))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"loss {loss:.4f}")
