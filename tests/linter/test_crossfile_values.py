"""Values that cross files: config defaults, returned loaders, the project root
of a package without a root marker."""
from __future__ import annotations

import libcst as cst
from ruletest import lint

from torchlint.crossfile import ProjectAnalysis
from torchlint.linter import parse_for_analysis
from torchlint.project import Projects


def config_default(path: str, expr: cst.Attribute):
    projects = Projects()
    return ProjectAnalysis(projects, projects.for_path(path), parse_for_analysis).config_default(expr)


def _attribute(code: str) -> cst.Attribute:
    node = cst.parse_expression(code)
    assert isinstance(node, cst.Attribute)
    return node


def _project(tmp_path, files):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


CONFIG = """from yacs.config import CfgNode as CN
_C = CN()
_C.DATA = CN()
_C.DATA.PIN_MEMORY = True
_C.DATA.NUM_WORKERS = 8
_C.TRAIN = CN()
_C.TRAIN.AMP = False
"""


def test_config_default_reads_the_yacs_module(tmp_path):
    root = _project(tmp_path, {"config.py": CONFIG, "main.py": ""})
    value = config_default(str(root / "main.py"), _attribute("config.DATA.PIN_MEMORY"))
    assert isinstance(value, cst.Name) and value.value == "True"
    workers = config_default(str(root / "main.py"), _attribute("cfg.DATA.NUM_WORKERS"))
    assert isinstance(workers, cst.Integer) and workers.value == "8"


def test_config_default_unknown_when_two_modules_disagree(tmp_path):
    other = CONFIG.replace("_C.DATA.PIN_MEMORY = True", "_C.DATA.PIN_MEMORY = False")
    root = _project(tmp_path, {"config.py": CONFIG, "configs/small.py": other, "main.py": ""})
    assert config_default(str(root / "main.py"), _attribute("config.DATA.PIN_MEMORY")) is None
    assert config_default(str(root / "main.py"), _attribute("config.DATA.NUM_WORKERS")) is not None


def test_config_default_needs_upper_case_keys_and_a_config_module(tmp_path):
    plain = "class Settings:\n    pass\nsettings = Settings()\nsettings.DATA.PIN_MEMORY = True\n"
    root = _project(tmp_path, {"settings.py": plain, "config.py": CONFIG, "main.py": ""})
    assert config_default(str(root / "main.py"), _attribute("args.data.pin_memory")) is None
    assert config_default(str(root / "main.py"), _attribute("args.PIN_MEMORY")) is None  # one level: an option, not a config tree
    root2 = _project(tmp_path / "second", {"settings.py": plain, "main.py": ""})
    assert config_default(str(root2 / "main.py"), _attribute("settings.DATA.PIN_MEMORY")) is None


def test_project_root_without_marker_is_the_folder_above_the_package(tmp_path):
    (tmp_path / "repo" / "data").mkdir(parents=True)
    (tmp_path / "repo" / "data" / "__init__.py").write_text("")
    (tmp_path / "repo" / "data" / "build.py").write_text("")
    (tmp_path / "repo" / "main.py").write_text("")
    assert Projects().for_path(str(tmp_path / "repo" / "data" / "build.py")).root == str(tmp_path / "repo")
    assert Projects().for_path(str(tmp_path / "repo" / "main.py")).root == str(tmp_path / "repo")


BUILD = """import torch

def build_loader(config):
    train = torch.utils.data.DataLoader(make(config), pin_memory=config.DATA.PIN_MEMORY)
    val = torch.utils.data.DataLoader(make(config), pin_memory=False)
    return train, val
"""
MAIN = """from data.build import build_loader

def train(loader, model, device):
    for x, y in loader:
        x = x.to(device)
        model(x).sum().backward()

def main(config, model, device):
    train_loader, val_loader = build_loader(config)
    train(train_loader, model, device)
    train(val_loader, model, device)
"""


def test_loader_returned_from_another_file_is_pinned_by_the_config(tmp_path):
    root = _project(tmp_path, {"config.py": CONFIG, "data/__init__.py": "", "data/build.py": BUILD, "main.py": MAIN})
    found = lint("TL201", MAIN, path=str(root / "main.py"))
    assert [(d.row, d.code) for d in found] == [(5, "TL201")]
    assert "data/build.py:4" in found[0].message


def test_unpinned_returned_loader_is_not_a_blocking_copy(tmp_path):
    main = MAIN.replace("    train(train_loader, model, device)\n", "")
    root = _project(tmp_path, {"config.py": CONFIG, "data/__init__.py": "", "data/build.py": BUILD, "main.py": main})
    assert lint("TL201", main, path=str(root / "main.py")) == []
