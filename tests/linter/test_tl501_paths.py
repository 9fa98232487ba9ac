"""TL501 skips test modules and CUDA-only toolkits unless told otherwise."""
import pytest

from torchlint.linter import FileOptions, lint_text
from torchlint.registry import all_rules

SOURCE = "import torch\n\ndef make():\n    return torch.zeros(3).cuda()\n"


def _codes(path, source=SOURCE, **options):
    rule = all_rules()["TL501"]
    out = lint_text(source, path, FileOptions(rules=[rule], rule_options={"TL501": options}))
    return [d.code for d in out.diagnostics]


@pytest.mark.parametrize("path", ["tests/test_model.py", "pkg/testing/_internal/distributed_test.py", "conftest.py", "test/utils.py"])
def test_test_modules_are_skipped_unless_asked(path):
    assert _codes(path) == []
    assert _codes(path, **{"check-tests": True}) == ["TL501"]


@pytest.mark.parametrize("path", ["src/model.py", "contest.py", "latest.py", "attestation/x.py"])
def test_other_modules_are_checked(path):
    assert _codes(path) == ["TL501"]


@pytest.mark.parametrize("module", ["cutlass", "cuda.bindings.driver", "tensorrt"])
def test_cuda_toolkit_modules_are_cuda_only(module):
    assert _codes("src/kernels.py", f"import {module}\n" + SOURCE) == []


EVAL_SOURCE = "import torch\n\ndef check(model, x):\n    model.eval()\n    return model(x)\n"
FORWARD_SOURCE = "import torch\n\nmodel = torch.nn.Linear(2, 2)\ny = model.forward(torch.ones(2))\n"


@pytest.mark.parametrize("code, source", [("TL601", EVAL_SOURCE), ("TL603", FORWARD_SOURCE)])
def test_tl601_and_tl603_skip_test_modules_unless_asked(code, source):
    rule = all_rules()[code]

    def codes(path, **options):
        out = lint_text(source, path, FileOptions(rules=[rule], rule_options={code: options}))
        return [d.code for d in out.diagnostics]

    assert codes("tests/models/test_encoder.py") == []
    assert codes("tests/models/test_encoder.py", **{"check-tests": True}) == [code]
    assert codes("src/evaluate.py") == [code]
