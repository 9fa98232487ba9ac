"""Train a small patch-based vision classifier with label smoothing, skipping
unlabeled samples, on synthetic CIFAR-sized data.

Run: python examples/vision_train.py --epochs 1
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

IGNORE_INDEX = -100


class PatchClassifier(nn.Module):
    def __init__(self, num_classes: int = 10, patch: int = 8, dim: int = 64) -> None:
        super().__init__()
        self.embed = nn.Conv2d(3, dim, patch, stride=patch)
        self.mixer = nn.TransformerEncoderLayer(dim, nhead=4, batch_first=True)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, images):
        tokens = self.embed(images).flatten(2).transpose(1, 2)
        positions = torch.arange(tokens.size(1)).to(tokens.device)
        tokens = tokens + positions[None, :, None] / tokens.size(1)
        return self.head(self.mixer(tokens).mean(1))


def make_dataset(num_samples: int) -> TensorDataset:
    images = torch.randn(num_samples, 3, 32, 32)
    labels = torch.randint(0, 10, (num_samples,))
    labels[::7] = IGNORE_INDEX  # unlabeled samples
    return TensorDataset(images, labels)


def train_one_epoch(model, loader, optimizer, device):
    model.train()
    seen = 0
    for images, labels in loader:
        model.to(device)
        images = images.to(device)
        labels.to(device)
        logits = model(images)
        labeled = labels != IGNORE_INDEX
        loss = F.cross_entropy(logits[labeled], labels[labeled], label_smoothing=0.1)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        seen += images.size(0)
    return seen


@torch.no_grad()
def class_histogram(model, loader, device):
    model.eval()
    counts = torch.zeros(10, dtype=torch.long, device=device)
    for images, _ in loader:
        preds = model(images.to(device)).argmax(-1)
        counts += torch.bincount(preds, minlength=10)
    host_counts = counts.to("cpu", non_blocking=True)
    return host_counts.tolist()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    loader = DataLoader(make_dataset(2048), batch_size=args.batch_size, shuffle=True, num_workers=2)
    model = PatchClassifier().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for epoch in range(args.epochs):
        seen = train_one_epoch(model, loader, optimizer, device)
        print(f"epoch {epoch}: {seen} samples, histogram {class_histogram(model, loader, device)}")


if __name__ == "__main__":
    main()
