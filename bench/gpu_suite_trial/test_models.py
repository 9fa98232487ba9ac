"""Small models: forward shapes, gradients, eval determinism, autocast, a training smoke test, state dicts."""
import io

import pytest
import torch
from torch import nn

pytestmark = pytest.mark.gpu


class BasicBlock(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + x)


class TinyResNet(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.blocks = nn.Sequential(BasicBlock(16), BasicBlock(16))
        self.head = nn.Linear(16, classes)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


class DepthwiseSeparable(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 3, 3, padding=1, groups=3), nn.Conv2d(3, 24, 1), nn.BatchNorm2d(24), nn.Hardswish(),
            nn.Conv2d(24, 24, 3, stride=2, padding=1, groups=24), nn.Conv2d(24, 32, 1), nn.ReLU6())
        self.head = nn.Linear(32, classes)

    def forward(self, x):
        return self.head(self.features(x).flatten(2).mean(-1))


class TinyViT(nn.Module):
    def __init__(self, classes=10, dim=32, patch=4):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.encoder = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(dim, 4, dim * 2, dropout=0.0, batch_first=True), num_layers=2)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        tokens = self.patch(x).flatten(2).transpose(1, 2)
        tokens = torch.cat([self.cls.expand(len(x), -1, -1), tokens], dim=1)
        return self.head(self.encoder(tokens)[:, 0])


class LSTMClassifier(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.embed = nn.Embedding(100, 16)
        self.rnn = nn.LSTM(16, 32, batch_first=True)
        self.head = nn.Linear(32, classes)

    def forward(self, tokens):
        out, _ = self.rnn(self.embed(tokens))
        return self.head(out[:, -1])


class GRUClassifier(LSTMClassifier):
    def __init__(self, classes=10):
        super().__init__(classes)
        self.rnn = nn.GRU(16, 32, batch_first=True)


class MLPMixerBlock(nn.Module):
    def __init__(self, classes=10, tokens=16, dim=24):
        super().__init__()
        self.embed = nn.Linear(12, dim)
        self.token_mix = nn.Sequential(nn.LayerNorm(tokens), nn.Linear(tokens, tokens), nn.GELU())
        self.channel_mix = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim * 2), nn.GELU(), nn.Linear(dim * 2, dim))
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.embed(x.reshape(len(x), 3, 4, 4, 4, 4).permute(0, 2, 4, 1, 3, 5).reshape(len(x), 16, 48)[..., :12])
        x = x + self.token_mix(x.transpose(1, 2)).transpose(1, 2)
        x = x + self.channel_mix(x)
        return self.head(x.mean(1))


class EmbeddingBagModel(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.bag = nn.EmbeddingBag(100, 32, mode="mean")
        self.head = nn.Linear(32, classes)

    def forward(self, tokens):
        return self.head(self.bag(tokens))


MODELS = {
    "tiny_resnet": (TinyResNet, "image"),
    "depthwise_separable": (DepthwiseSeparable, "image"),
    "tiny_vit": (TinyViT, "image"),
    "mlp_mixer": (MLPMixerBlock, "image"),
    "lstm": (LSTMClassifier, "tokens"),
    "gru": (GRUClassifier, "tokens"),
    "embedding_bag": (EmbeddingBagModel, "tokens"),
    "mlp": (lambda: nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 64), nn.ReLU(), nn.Linear(64, 10)), "image"),
}


def _inputs(kind, device, batch=8):
    if kind == "image":
        return torch.randn(batch, 3, 16, 16, device=device)
    return torch.randint(0, 100, (batch, 12), device=device)


def _model(name, device):
    factory, kind = MODELS[name]
    return factory().to(device), kind


@pytest.mark.parametrize("name", sorted(MODELS))
def test_forward_shape(name, device):
    model, kind = _model(name, device)
    out = model(_inputs(kind, device))
    assert out.shape == (8, 10)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_backward_reaches_every_parameter(name, device):
    model, kind = _model(name, device)
    model(_inputs(kind, device)).logsumexp(-1).mean().backward()
    for pname, param in model.named_parameters():
        assert param.grad is not None, pname
        assert torch.isfinite(param.grad).all(), pname


def _eval_model(name, device):
    model, kind = _model(name, device)
    return model.eval(), _inputs(kind, device)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_eval_is_deterministic_and_batch_independent(name, device):
    model, x = _eval_model(name, device)
    with torch.no_grad():
        full = model(x)
        halves = torch.cat([model(x[:4]), model(x[4:])])
    torch.testing.assert_close(full, halves, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_training_smoke_loss_decreases(name, device):
    # The usual smoke test: a few steps on one batch, logging the loss every iteration.
    model, kind = _model(name, device)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    x, target = _inputs(kind, device), torch.randint(0, 10, (8,), device=device)
    losses = []
    for _ in range(12):
        loss = nn.functional.cross_entropy(model(x), target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("name", ["tiny_resnet", "tiny_vit", "mlp"])
def test_autocast_bf16_close_to_fp32(name, device):
    model, x = _eval_model(name, device)
    with torch.no_grad():
        reference = model(x)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            low = model(x)
    torch.testing.assert_close(low.float(), reference, rtol=0.1, atol=0.1)


@pytest.mark.parametrize("name", ["tiny_resnet", "lstm", "tiny_vit"])
def test_state_dict_round_trip(name, device):
    model, kind = _model(name, device)
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    clone, _ = _model(name, device)
    clone.load_state_dict(torch.load(buffer, map_location=device))
    model.eval(), clone.eval()
    x = _inputs(kind, device)
    with torch.no_grad():
        torch.testing.assert_close(clone(x), model(x))
