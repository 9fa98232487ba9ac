"""Optimizers: convergence on a quadratic, foreach against for-loop, and a checkpoint resume."""
import io

import pytest
import torch

pytestmark = pytest.mark.gpu

OPTIMIZERS = {
    "sgd": (torch.optim.SGD, {"lr": 0.1}),
    "sgd_nesterov": (torch.optim.SGD, {"lr": 0.05, "momentum": 0.9, "nesterov": True}),
    "adam": (torch.optim.Adam, {"lr": 0.1}),
    "adamw": (torch.optim.AdamW, {"lr": 0.1, "weight_decay": 0.01}),
    "rmsprop": (torch.optim.RMSprop, {"lr": 0.01}),
    "adagrad": (torch.optim.Adagrad, {"lr": 0.5}),
    "adamax": (torch.optim.Adamax, {"lr": 0.1}),
    "nadam": (torch.optim.NAdam, {"lr": 0.1}),
    "radam": (torch.optim.RAdam, {"lr": 0.1}),
}


def _problem(device):
    target = torch.randn(64, device=device)
    weight = torch.zeros(64, device=device, requires_grad=True)
    return weight, target


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_converges_on_a_quadratic(name, device):
    cls, kwargs = OPTIMIZERS[name]
    weight, target = _problem(device)
    optimizer = cls([weight], **kwargs)
    start = (weight - target).square().sum().item()
    for step in range(60):
        optimizer.zero_grad()
        loss = (weight - target).square().sum()
        loss.backward()
        optimizer.step()
        assert torch.isfinite(loss), step  # checked on every step, as many optimizer tests do
    assert (weight - target).square().sum().item() < 0.5 * start


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_foreach_matches_for_loop(name, device):
    cls, kwargs = OPTIMIZERS[name]
    results = []
    for foreach in (False, True):
        torch.manual_seed(1)
        params = [torch.randn(17, 5, device=device, requires_grad=True), torch.randn(9, device=device, requires_grad=True)]
        optimizer = cls(params, foreach=foreach, **kwargs)
        for _ in range(5):
            optimizer.zero_grad()
            sum((p.sin() * p).sum() for p in params).backward()
            optimizer.step()
        results.append([p.detach().clone() for p in params])
    for loop_param, foreach_param in zip(*results):
        torch.testing.assert_close(foreach_param, loop_param, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["adam", "adamw", "sgd_nesterov"])
def test_resume_from_state_dict(name, device):
    cls, kwargs = OPTIMIZERS[name]
    weight, target = _problem(device)
    optimizer = cls([weight], **kwargs)

    def run(opt, w, steps):
        for _ in range(steps):
            opt.zero_grad()
            (w - target).square().sum().backward()
            opt.step()

    run(optimizer, weight, 3)
    clone = weight.detach().clone().requires_grad_()
    resumed = cls([clone], **kwargs)
    checkpoint = io.BytesIO()
    torch.save(optimizer.state_dict(), checkpoint)  # a real copy: state_dict() shares the moment buffers
    checkpoint.seek(0)
    resumed.load_state_dict(torch.load(checkpoint, map_location=device))
    run(optimizer, weight, 3)
    run(resumed, clone, 3)
    torch.testing.assert_close(clone, weight)
