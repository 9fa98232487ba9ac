"""Project facts (torchlint.project): the torch versions a project supports,
read from small temporary project trees, and what version-dependent rules do
with them, through the CLI and through flake8."""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import textwrap

import pytest

from torchlint import project
from torchlint.cli import main
from torchlint.linter import FileOptions, lint_text
from torchlint.registry import all_rules

BIN = pathlib.Path(sys.executable).parent
AMP_SCRIPT = "import torch\nscaler = torch.cuda.amp.GradScaler()\nwith torch.cuda.amp.autocast():\n    out = model(x)\n"


def make_tree(root: pathlib.Path, files: dict) -> pathlib.Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    return root


def project_facts(path: str, read_config: bool = True) -> project.ProjectFacts:
    """The facts of the project ``path`` belongs to, as a fresh run finds them."""
    return project.Projects().for_path(path).facts(read_config)


def facts(root: pathlib.Path, files: dict) -> project.TorchRange:
    make_tree(root, files)
    return project_facts(str(root / "train.py")).torch


@pytest.mark.parametrize(
    "spec, bounds",
    [
        (">=1.8", ((1, 8), None)),
        (">=1.8,<2.2", ((1, 8), (2, 1))),
        ("<2.2.1,>=2.0", ((2, 0), (2, 2))),
        ("==2.1.0", ((2, 1), (2, 1))),
        ("==2.1.*", ((2, 1), (2, 1))),
        ("~=2.1.0", ((2, 1), (2, 1))),
        ("~=2.1", ((2, 1), (2, 999))),
        ("<=1.13", (None, (1, 13))),
        ("<2", (None, (1, 999))),
        ("!=2.0.0", None),
        ("", None),
    ],
)
def test_specifiers(spec, bounds):
    assert project.parse_specifier(spec) == bounds


@pytest.mark.parametrize("line", ["torchvision>=0.15", "torch-geometric>=2.0", "pytorch-lightning>=2.0", "torchaudio==2.1"])
def test_other_packages_are_not_torch(line):
    assert project.requirement_range(line) is None


def test_requirement_with_local_version_and_marker():
    assert project.requirement_range("torch==2.1.0+cu118; platform_system == 'Linux'") == ((2, 1), (2, 1))


def test_pyproject(tmp_path):
    torch = facts(tmp_path, {"pyproject.toml": '[project]\nname = "x"\ndependencies = ["numpy", "torch>=1.13,<3"]\n'})
    assert (torch.lower, torch.upper) == ((1, 13), (2, 999))
    assert torch.sources == ("pyproject.toml",)


def test_pyproject_poetry(tmp_path):
    torch = facts(tmp_path, {"pyproject.toml": '[tool.poetry.dependencies]\npython = "^3.10"\ntorch = "^2.1"\n'})
    assert (torch.lower, torch.upper) == ((2, 1), (2, 999))


def test_pyproject_explicit_target_torch_wins(tmp_path):
    torch = facts(tmp_path, {
        "pyproject.toml": '[project]\nname = "x"\ndependencies = ["torch>=1.8"]\n[tool.torchlint]\ntarget-torch = "2.4"\n',
        "requirements.txt": "torch==1.9\n",
    })
    assert (torch.lower, torch.upper, torch.sources) == ((2, 4), None, ("target-torch",))
    isolated = project_facts(str(tmp_path / "train.py"), read_config=False).torch  # --isolated
    assert (isolated.lower, isolated.upper) == ((1, 8), None)


def test_setup_py_and_its_cuda_extensions(tmp_path):
    make_tree(tmp_path, {"setup.py": """
        from setuptools import setup
        from torch.utils.cpp_extension import CUDAExtension
        setup(
            name="x",
            install_requires=["numpy", "torch>=1.8.0,<2.2"],
            ext_modules=[CUDAExtension("fused_ops_cuda", ["a.cu"]), CUDAExtension(name="pkg._C", sources=[])],
        )
    """})
    found = project_facts(str(tmp_path / "train.py"))
    assert (found.torch.lower, found.torch.upper) == ((1, 8), (2, 1))
    assert found.cuda_extensions == ("fused_ops_cuda", "pkg._C")


def test_setup_cfg(tmp_path):
    torch = facts(tmp_path, {"setup.cfg": "[metadata]\nname = x\n[options]\ninstall_requires =\n    numpy\n    torch>=2.0\n"})
    assert torch.lower == (2, 0)


def test_requirements_files(tmp_path):
    torch = facts(tmp_path, {
        "setup.py": "from setuptools import setup\nsetup(name='x')\n",
        "requirements/base.txt": "-r other.txt\n# torch>=9.9 in a comment\ntorch==1.12.1  # pinned\n",
    })
    assert (torch.lower, torch.upper) == ((1, 12), (1, 12))


def test_environment_yml(tmp_path):
    torch = facts(tmp_path, {".git/HEAD": "", "environment.yml": """
        name: x
        dependencies:
          - python=3.9
          - pytorch::pytorch=1.13.1
          - torchvision
    """})
    assert (torch.lower, torch.upper) == ((1, 13), (1, 13))


@pytest.mark.parametrize(
    "image, version",
    [("nvcr.io/nvidia/pytorch:23.10-py3", (2, 1)), ("nvcr.io/nvidia/pytorch:24.01-py3", (2, 2)),
     ("nvcr.io/nvidia/pytorch:22.12-py3", (2, 0)), ("pytorch/pytorch:2.4.1-cuda12.1-cudnn9-runtime", (2, 4))],
)
def test_dockerfile_base_image(tmp_path, image, version):
    torch = facts(tmp_path, {".git/HEAD": "", "Dockerfile": f"FROM {image} AS base\nRUN pip install -r requirements.txt\n"})
    assert (torch.lower, torch.upper) == (version, version)


def test_dockerfile_pip_install(tmp_path):
    torch = facts(tmp_path, {".git/HEAD": "", "docker/Dockerfile": "FROM ubuntu:22.04\nRUN pip install torch==2.3.1 torchvision\n"})
    assert (torch.lower, torch.upper) == ((2, 3), (2, 3))


def test_sources_conflict_union(tmp_path):
    """A library that declares torch>=1.13 and develops in a 24.01 container
    supports every version either admits."""
    torch = facts(tmp_path, {
        "pyproject.toml": '[project]\nname = "x"\ndependencies = ["torch>=1.13"]\n',
        "Dockerfile": "FROM nvcr.io/nvidia/pytorch:24.01-py3\n",
    })
    assert (torch.lower, torch.upper) == ((1, 13), None)
    assert set(torch.sources) == {"pyproject.toml", "Dockerfile"}


def test_pinned_sources_conflict_union(tmp_path):
    torch = facts(tmp_path, {"setup.py": "setup(install_requires=['torch==1.8.1'])", "requirements.txt": "torch==2.1.0\n"})
    assert (torch.lower, torch.upper) == ((1, 8), (2, 1))


def test_project_api_use_sets_the_floor_when_nothing_is_declared(tmp_path):
    torch = facts(tmp_path, {
        ".git/HEAD": "",
        "pkg/train.py": "import torch\nmodel = torch.compile(model)\n",
        "pkg/data.py": "import torch\n",
    })
    assert torch.lower == (2, 0)
    assert torch.sources[-1] == "torch.compile in pkg/train.py"


def test_a_declared_floor_stands_for_the_package_and_a_file_raises_its_own(tmp_path):
    """An example that uses torch.compile needs 2.0; the package still supports 1.8."""
    example = "import torch\nmodel = torch.compile(model)\n"
    torch = facts(tmp_path, {"requirements.txt": "torch>=1.8\n", ".git/HEAD": "", "examples/fast.py": example})
    assert torch.lower == (1, 8)
    raised = project.for_file(project_facts(str(tmp_path / "examples" / "fast.py")), example)
    assert raised.lower == (2, 0) and raised.sources[-1] == "torch.compile"


def test_accelerator_beats_a_pin_below_it(tmp_path):
    source = "import torch\ntorch.accelerator.synchronize()\n"
    facts(tmp_path, {"requirements.txt": "torch==2.1\n", ".git/HEAD": "", "a.py": source})
    torch = project.for_file(project_facts(str(tmp_path / "a.py")), source)
    assert (torch.lower, torch.upper) == ((2, 6), None)


def test_probed_api_use_does_not_count(tmp_path):
    source = "import torch\nif hasattr(torch, 'compile'):\n    model = torch.compile(model)\n"
    torch = facts(tmp_path, {"requirements.txt": "torch>=1.8\n", ".git/HEAD": "", "a.py": source})
    assert torch.lower == (1, 8)


def test_no_root_no_facts(tmp_path, monkeypatch):
    monkeypatch.setattr(project, "find_root", lambda directory: None)
    (tmp_path / "requirements.txt").write_text("torch>=2.1\n")
    found = project.Projects().for_path(str(tmp_path / "x.py"))
    assert not found.marked and found.root == str(tmp_path)  # a folder of scripts: a project for the analysis
    assert found.facts() == project.ProjectFacts()  # that declares nothing


def test_file_api_use_applies_without_manifests():
    rule = all_rules()["TL402"]
    plain = lint_text(AMP_SCRIPT, "x.py", FileOptions(rules=[rule]))
    compiled = lint_text("import torch\nmodel = torch.compile(model)\n" + AMP_SCRIPT, "x.py", FileOptions(rules=[rule]))
    assert plain.diagnostics == []
    # torch >= 2.0: autocast's new spelling exists; GradScaler's (2.3) may not.
    assert [(d.code, d.row) for d in compiled.diagnostics] == [("TL402", 5)]


# -- through the CLI and flake8 ----------------------------------------------------
def _cli_findings(path: pathlib.Path, capsys, *extra: str):
    capsys.readouterr()
    main(["check", "--isolated", "--preview", "--select", "TL402,TL301", "--output-format", "json", "--exit-zero", *extra, str(path)])
    return sorted((d["code"], d["location"]["row"]) for d in json.loads(capsys.readouterr().out))


def _flake8_findings(path: pathlib.Path):
    out = subprocess.run([str(BIN / "flake8"), "--select", "TL402,TL301", str(path)], capture_output=True, text=True)
    return sorted((line.split(": ")[1].split()[0], int(line.split(":")[1])) for line in out.stdout.splitlines())


@pytest.mark.parametrize(
    "manifests, expected",
    [
        ({"requirements.txt": "torch>=1.8,<2.2\n"}, []),  # pinned 1.8-2.1: the new API may not exist
        ({"setup.py": "setup(install_requires=['torch>=2.4'])"}, [("TL402", 2), ("TL402", 3)]),
        ({"Dockerfile": "FROM nvcr.io/nvidia/pytorch:23.10-py3\n"}, []),  # 2.1: nothing deprecated yet
        ({"Dockerfile": "FROM nvcr.io/nvidia/pytorch:24.08-py3\n"}, [("TL402", 2), ("TL402", 3)]),
        ({"environment.yml": "dependencies:\n  - pytorch>=2.3,<2.4\n"}, [("TL402", 2)]),  # autocast: deprecated from 2.4
        ({}, []),
    ],
)
def test_cli_and_flake8_see_the_same_project_facts(tmp_path, capsys, manifests, expected):
    make_tree(tmp_path, {".git/HEAD": "", "src/train.py": AMP_SCRIPT, **manifests})
    script = tmp_path / "src" / "train.py"
    assert _cli_findings(script, capsys) == expected
    assert _flake8_findings(script) == expected


def test_command_line_target_beats_manifests(tmp_path, capsys):
    make_tree(tmp_path, {".git/HEAD": "", "train.py": AMP_SCRIPT, "requirements.txt": "torch==1.9\n"})
    assert _cli_findings(tmp_path / "train.py", capsys, "--target-torch", "2.5") == [("TL402", 2), ("TL402", 3)]


def test_show_settings_names_the_sources(tmp_path, capsys, monkeypatch):
    make_tree(tmp_path, {"setup.py": "setup(install_requires=['torch>=1.13'])", "train.py": AMP_SCRIPT})
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    main(["check", "--isolated", "--preview", "--show-settings", "train.py"])
    settings = json.loads(capsys.readouterr().out)
    assert settings["target-torch"] == ">=1.13 (from setup.py)"


def test_a_module_named_setup_is_not_a_project_root(tmp_path):
    make_tree(tmp_path, {
        "setup.py": "from setuptools import setup\nsetup(name='x', install_requires=['torch>=2.1'])\n",
        "pkg/eval/setup.py": "def setup(args):\n    return args\n",
    })
    found = project_facts(str(tmp_path / "pkg" / "eval" / "linear.py"))
    assert found.root == str(tmp_path)
    assert found.torch.lower == (2, 1)


def test_an_api_named_in_a_string_or_comment_does_not_count():
    assert project.api_floor('import torch\n"""Call torch.compile(model) first."""\n# torch.accelerator too\n') is None
    assert project.api_floor("import torch\nfast = torch.compile(model)\n") == ((2, 0), "torch.compile")
    assert project.api_floor("import torch\ntorch.accelerator.current_accelerator()\n") == ((2, 6), "torch.accelerator")


def test_guarded_removed_module_is_no_ceiling():
    source = "try:\n    from torch._six import inf\nexcept ImportError:\n    from math import inf\n"
    assert project.api_ceiling(source) is None
    assert project.api_ceiling("from torch._six import inf\n") == ((1, project._NO_MINOR_LIMIT), project.REMOVED_MODULES[0][2])


def test_a_ceiling_never_contradicts_a_declared_floor():
    declared = project.TorchRange((2, 1), None, ("requirements.txt",))
    assert project.lower_ceiling(declared, ((1, project._NO_MINOR_LIMIT), "torch._six")) == declared
    open_range = project.TorchRange()
    bounded = project.lower_ceiling(open_range, ((1, project._NO_MINOR_LIMIT), "torch._six in utils.py"))
    assert bounded.upper == (1, project._NO_MINOR_LIMIT) and bounded.describe() == "<=1.x"


ZERO_GRAD_LOOP = "import torch\nfor x in loader:\n    opt.zero_grad()\n    model(x).sum().backward()\n    opt.step()\n"


@pytest.mark.parametrize(
    "files, expected",
    [
        ({"requirements.txt": "torch>=1.13\n"}, []),  # an open floor: installs get torch 2.x, where None is the default
        ({"requirements.txt": "torch>=1.10,<2.0\n"}, [("TL301", 3)]),  # every supported torch zeroes
        ({"utils.py": "from torch._six import inf\n", "train.py": "import utils\n" + ZERO_GRAD_LOOP}, [("TL301", 4)]),
    ],
)
def test_plain_zero_grad_needs_torch_1_only(tmp_path, capsys, files, expected):
    make_tree(tmp_path, {".git/HEAD": "", "train.py": ZERO_GRAD_LOOP, **files})
    assert _cli_findings(tmp_path / "train.py", capsys) == expected
