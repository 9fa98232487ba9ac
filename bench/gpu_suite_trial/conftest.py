"""A GPU test suite written in the style of torchvision's and timm's model, optimizer and loss tests.

It is the workload of ``bench/gpu_suite_trial.py`` (``pytest --gpu-sanitize``
over 100+ GPU tests), kept under bench/ so that CI never collects it. Every
test ends the way real GPU tests do: an ``assert`` on a read value, a
``torch.testing.assert_close``, a ``.cpu()`` of a result; some log a loss
with ``.item()`` on every iteration, as training smoke tests often do.
"""
import pytest
import torch


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)
    yield


@pytest.fixture
def device():
    return torch.device("cuda")
