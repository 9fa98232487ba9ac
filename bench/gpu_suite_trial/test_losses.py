"""Losses against their formulas, and their gradients."""
import pytest
import torch
from torch import nn
from torch.nn import functional as F

pytestmark = pytest.mark.gpu


def _logits(device):
    return torch.randn(32, 10, device=device, requires_grad=True), torch.randint(0, 10, (32,), device=device)


def test_cross_entropy_matches_log_softmax(device):
    logits, target = _logits(device)
    expected = -F.log_softmax(logits, -1).gather(1, target[:, None]).mean()
    torch.testing.assert_close(F.cross_entropy(logits, target), expected)


def test_cross_entropy_label_smoothing(device):
    logits, target = _logits(device)
    eps = 0.1
    log_p = F.log_softmax(logits, -1)
    expected = ((1 - eps) * -log_p.gather(1, target[:, None]).squeeze(1) - eps * log_p.mean(-1)).mean()
    torch.testing.assert_close(F.cross_entropy(logits, target, label_smoothing=eps), expected)


def test_nll_ignore_index(device):
    logits, target = _logits(device)
    target[:5] = -100
    log_p = F.log_softmax(logits, -1)
    keep = target != -100
    expected = -log_p[keep].gather(1, target[keep][:, None]).mean()
    torch.testing.assert_close(F.nll_loss(log_p, target), expected)


@pytest.mark.parametrize("loss, formula", [
    (nn.MSELoss(), lambda a, b: (a - b).square().mean()),
    (nn.L1Loss(), lambda a, b: (a - b).abs().mean()),
    (nn.SmoothL1Loss(beta=0.5), lambda a, b: torch.where((a - b).abs() < 0.5, 0.5 * (a - b) ** 2 / 0.5,
                                                          (a - b).abs() - 0.25).mean()),
    (nn.HuberLoss(delta=1.0), lambda a, b: torch.where((a - b).abs() < 1, 0.5 * (a - b) ** 2, (a - b).abs() - 0.5).mean()),
], ids=["mse", "l1", "smooth_l1", "huber"])
def test_regression_losses(loss, formula, device):
    a, b = torch.randn(64, 3, device=device), torch.randn(64, 3, device=device)
    torch.testing.assert_close(loss(a, b), formula(a, b))


def test_bce_with_logits_is_stable_for_large_logits(device):
    logits = torch.tensor([-200.0, -5.0, 0.0, 5.0, 200.0], device=device)
    target = torch.tensor([0.0, 0.0, 1.0, 1.0, 1.0], device=device)
    loss = F.binary_cross_entropy_with_logits(logits, target, reduction="none")
    assert torch.isfinite(loss).all()
    torch.testing.assert_close(loss[-1], torch.zeros((), device=device))


def test_kl_div_of_identical_distributions_is_zero(device):
    log_p = F.log_softmax(torch.randn(16, 10, device=device), -1)
    torch.testing.assert_close(F.kl_div(log_p, log_p, log_target=True, reduction="batchmean"),
                               torch.zeros((), device=device))


def test_triplet_margin_zero_when_separated(device):
    anchor = torch.zeros(8, 4, device=device)
    assert F.triplet_margin_loss(anchor, anchor + 0.01, anchor + 10.0, margin=1.0).item() == 0.0


def test_cosine_embedding_loss_bounds(device):
    a, b = torch.randn(32, 8, device=device), torch.randn(32, 8, device=device)
    y = torch.randint(0, 2, (32,), device=device) * 2 - 1
    loss = F.cosine_embedding_loss(a, b, y)
    assert 0.0 <= loss.item() <= 2.0


def test_loss_gradients_match_finite_differences(device):
    x = torch.randn(4, 3, device=device, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, 3, (4,), device=device)
    assert torch.autograd.gradcheck(lambda t: F.cross_entropy(t, target), (x,))
