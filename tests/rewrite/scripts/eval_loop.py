"""An evaluation pass in the style of pytorch/examples' test(): the loop runs with autograd on."""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def test(model, device, test_loader):
    model.eval()
    test_loss = 0
    correct = 0
    # sum up the batch losses and count the right answers
    for data, target in test_loader:
        data, target = data.to(device), target.to(device)
        output = model(data)
        test_loss += F.nll_loss(output, target, reduction="sum").item()
        pred = output.argmax(dim=1, keepdim=True)
        correct += pred.eq(target.view_as(pred)).sum().item()
    test_loss /= len(test_loader.dataset)
    print(f"Test set: Average loss: {test_loss:.4f}, Accuracy: {correct}/{len(test_loader.dataset)}")


def main():
    device = torch.device("cpu")
    dataset = TensorDataset(torch.randn(256, 20), torch.randint(0, 4, (256,)))
    loader = DataLoader(dataset, batch_size=64, num_workers=2, persistent_workers=True)
    model = nn.Sequential(nn.Linear(20, 4), nn.LogSoftmax(dim=1))
    test(model, device, loader)


if __name__ == "__main__":
    main()
