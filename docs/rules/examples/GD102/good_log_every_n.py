# The loss is summed on the device and read every 100 steps and once per epoch.
import torch

model = model.cuda()
running_loss = torch.zeros((), device="cuda")
for step, (x, y) in enumerate(loader):
    x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
    loss = criterion(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    running_loss += loss.detach()
    if step % 100 == 0:
        print(f"step {step}: loss {loss.item():.4f}")
print(f"epoch loss {running_loss.item() / len(loader):.4f}")
