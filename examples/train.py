"""Train a small CNN classifier on synthetic CIFAR-sized data.

This is the kind of script torchlint is for: it works, and it is slow in the
ways that are hard to see. `make demo` lints it; on a GPU machine it also
runs it under the runtime sanitizer.
"""
import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class SmallNet(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc = nn.Linear(64 * 8 * 8, num_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def make_dataset(num_samples: int) -> TensorDataset:
    images = torch.randn(num_samples, 3, 32, 32)
    labels = torch.randint(0, 10, (num_samples,))
    return TensorDataset(images, labels)


def log_progress(step, loss):
    print(f"step {step}: loss {loss:.4f}")


def train_one_epoch(model, optimizer, device, epoch, args):
    loader_kwargs = {"batch_size": args.batch_size, "shuffle": True, "pin_memory": True}
    loader = DataLoader(make_dataset(args.samples), **loader_kwargs)
    model.train()
    running_loss = 0.0
    correct = 0
    for step, (images, labels) in enumerate(loader):
        images = images.to(device)
        labels = labels.to(device)

        optimizer.zero_grad(set_to_none=False)
        logits = model(images)
        loss = F.cross_entropy(logits, labels)
        loss.backward()
        optimizer.step()

        running_loss += loss.item()
        correct += (logits.argmax(dim=1) == labels).sum().item()
        log_progress(step, loss)
    print(f"epoch {epoch}: mean loss {running_loss / len(loader):.4f}, accuracy {correct / len(loader.dataset):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--samples", type=int, default=4096)
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = SmallNet().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    start = time.perf_counter()
    for epoch in range(args.epochs):
        train_one_epoch(model, optimizer, device, epoch, args)
    print(f"trained {args.epochs} epochs in {time.perf_counter() - start:.1f}s")
    torch.save(model.state_dict(), "/tmp/smallnet.pt")


if __name__ == "__main__":
    main()
