"""Mixed-precision training of a small ResNet-style classifier with an auxiliary head."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class AuxNet(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )
        self.head = nn.Linear(64, num_classes)
        self.aux_head = nn.Linear(64, num_classes)

    def forward(self, x):
        h = self.features(x)
        return self.head(h), self.aux_head(h)


def make_loader(n=2048, batch_size=64):
    images = torch.randn(n, 3, 32, 32)
    labels = torch.randint(0, 10, (n,))
    return DataLoader(TensorDataset(images, labels), batch_size=batch_size, shuffle=True, pin_memory=True, num_workers=2)


def train_epoch(model, loader, optimizer, scaler, device, aux_weight=0.4):
    model.train()
    total_loss = 0.0
    for images, labels in loader:
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        with torch.cuda.amp.autocast(dtype=torch.bfloat16):
            logits, aux_logits = model(images)
            loss = F.cross_entropy(logits, labels)
            aux_loss = aux_weight * F.cross_entropy(aux_logits, labels)
            scaler.scale(loss).backward(retain_graph=True)
        aux_loss.backward()
        scaler.step(optimizer)
        scaler.update()
        total_loss += loss
        torch.cuda.empty_cache()
    return total_loss.item() / len(loader)


def finetune_head(model, loader, device, lr=1e-3):
    """Second stage: train only the classifier head on frozen features."""
    optimizer = torch.optim.SGD(model.head.parameters(), lr=lr, momentum=0.9)
    optimizer.zero_grad()
    for images, labels in loader:
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        with torch.no_grad():
            features = model.features(images)
        loss = F.cross_entropy(model.head(features), labels)
        loss.backward()
        optimizer.step()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = AuxNet().to(device)
    loader = make_loader()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    scaler = torch.cuda.amp.GradScaler()
    for epoch in range(args.epochs):
        avg = train_epoch(model, loader, optimizer, scaler, device)
        print(f"epoch {epoch}: loss {avg:.4f}")
    finetune_head(model, loader, device)


if __name__ == "__main__":
    main()
