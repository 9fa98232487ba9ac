"""The engine's one answer to "does this name say a network / an optimizer?" (TL101, TL205,
TL206, TL301, TL603 and the per-batch analysis all ask it)."""
from __future__ import annotations

import libcst as cst
import pytest

from torchlint.tensors import names_a_module
from torchlint.vocabulary import names_an_optimizer, optimizer_receiver


@pytest.mark.parametrize("name", ["model", "ema_model", "autoencoder", "text_encoder", "self_model", "resnet",
                                  "layer1", "conv2", "head", "lm_head", "mlp", "teacher", "unets", "backbone"])
def test_names_that_say_a_network(name):
    assert names_a_module(name)


@pytest.mark.parametrize("name", ["overhead", "schema", "loss", "batch", "images", "magnetism", "blocking", "", None])
def test_names_that_do_not(name):
    assert not names_a_module(name)


@pytest.mark.parametrize("source, expected", [
    ("optimizer", True), ("self.opt", True), ("optimizers[0]", True), ("d_optim", True),
    ("lr_scheduler", False), ("optimizer_scheduler", False), ("scaler", False), ("model", False),
])
def test_optimizer_receivers(source, expected):
    assert optimizer_receiver(cst.parse_expression(source)) is expected
    assert names_an_optimizer(source.split(".")[-1].split("[")[0]) is expected
