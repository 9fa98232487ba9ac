"""One project per root: the root finder, nested projects, per-run Projects,
and each other file's summary built once through the linter's parse path."""
from __future__ import annotations

import json
import pathlib
import textwrap

from torchlint import crossfile
from torchlint.cli import main
from torchlint.crossfile import ProjectAnalysis
from torchlint.linter import parse_for_analysis
from torchlint.project import Projects, find_root

AMP_SCRIPT = "import torch\nscaler = torch.cuda.amp.GradScaler()\nwith torch.cuda.amp.autocast():\n    out = model(x)\n"
NEW_API = "import torch\ndevice = torch.accelerator.current_accelerator()\n"  # torch >= 2.6


def make_tree(root: pathlib.Path, files: dict) -> pathlib.Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    return root


def test_a_packaging_marker_beats_a_nearer_git_folder(tmp_path):
    make_tree(tmp_path, {"pyproject.toml": "[project]\nname='x'\n", "vendor/lib/.git/HEAD": "", "vendor/lib/x.py": ""})
    assert find_root(str(tmp_path / "vendor" / "lib" / "x.py")) == str(tmp_path)


def test_git_is_the_root_without_a_packaging_marker(tmp_path):
    make_tree(tmp_path, {".git/HEAD": "", "src/a/x.py": ""})
    assert find_root(str(tmp_path / "src" / "a" / "x.py")) == str(tmp_path)
    assert find_root(str(tmp_path / "src")) == str(tmp_path)


def test_the_nearest_packaging_marker_wins(tmp_path):
    make_tree(tmp_path, {".git/HEAD": "", "a/setup.cfg": "[metadata]\nname = a\n", "a/pkg/x.py": "", "b/y.py": ""})
    assert find_root(str(tmp_path / "a" / "pkg" / "x.py")) == str(tmp_path / "a")
    assert find_root(str(tmp_path / "b" / "y.py")) == str(tmp_path)


def test_one_projects_api_use_does_not_set_the_torch_of_another(tmp_path, capsys):
    # One git root holds a script and a project of its own that needs torch 2.6.
    make_tree(tmp_path, {
        ".git/HEAD": "",
        "train.py": AMP_SCRIPT,
        "newer/pyproject.toml": "[project]\nname='newer'\n",
        "newer/uses_accelerator.py": NEW_API,
    })
    projects = Projects()
    outer = projects.for_path(str(tmp_path / "train.py"))
    inner = projects.for_path(str(tmp_path / "newer" / "uses_accelerator.py"))
    assert outer.root == str(tmp_path) and inner.root == str(tmp_path / "newer")
    assert str(tmp_path / "newer" / "uses_accelerator.py") not in outer.files()
    assert outer.facts().torch.lower is None  # the nested project's torch.accelerator does not count here
    assert inner.facts().torch.lower == (2, 6)
    capsys.readouterr()
    main(["check", "--isolated", "--preview", "--select", "TL402", "--output-format", "json", "--exit-zero", str(tmp_path / "train.py")])
    assert json.loads(capsys.readouterr().out) == []  # no torch version shown to have the new AMP API


def test_a_nested_project_does_not_see_the_loaders_of_the_project_around_it(tmp_path):
    make_tree(tmp_path, {
        "pyproject.toml": "[project]\nname='outer'\n",
        "main.py": """
            from torch.utils.data import DataLoader
            from inner.engine import train
            loader = DataLoader(data, pin_memory=True)
            train(loader)
        """,
        "inner/pyproject.toml": "[project]\nname='inner'\n",
        "inner/engine.py": "def train(loader):\n    for x in loader:\n        x = x.cuda()\n",
    })
    projects = Projects()
    engine = str(tmp_path / "inner" / "engine.py")
    analysis = ProjectAnalysis(projects, projects.for_path(engine), parse_for_analysis)
    assert analysis.project.root == str(tmp_path / "inner")
    assert analysis.index().passed == {}
    outer = projects.for_path(str(tmp_path / "main.py"))
    assert engine not in outer.files()


def test_each_files_summary_is_built_once_through_the_parse_path(tmp_path):
    make_tree(tmp_path, {
        "pyproject.toml": "[project]\nname='x'\n",
        "engine.py": "def train(loader, device):\n    for x in loader:\n        x = x.to(device)\n",
        "data.py": "from torch.utils.data import DataLoader\ndef build():\n    return DataLoader(d, pin_memory=True)\n",
    })
    parsed = []

    def counting_parse(text, path):
        parsed.append(path)
        return parse_for_analysis(text, path)

    projects = Projects()
    engine = str(tmp_path / "engine.py")
    analysis = ProjectAnalysis(projects, projects.for_path(engine), counting_parse)
    copies, params = analysis.copies_in(engine)
    assert copies == {("train", "loader")} and params["train"] == ["loader", "device"]
    analysis.summary(engine)
    again = ProjectAnalysis(projects, projects.for_path(str(tmp_path / "data.py")), counting_parse)
    again.summary(engine)  # another lint of the same run: the project keeps it
    assert parsed == [engine]


def test_an_unparsable_file_has_no_summary(tmp_path):
    make_tree(tmp_path, {"pyproject.toml": "", "bad.py": "def f(:\n"})
    projects = Projects()
    path = str(tmp_path / "bad.py")
    assert ProjectAnalysis(projects, projects.for_path(path), parse_for_analysis).summary(path) is None


def test_consulted_projects_are_recorded_per_lint(tmp_path):
    make_tree(tmp_path, {"pyproject.toml": "", "a.py": ""})
    projects = Projects()
    analysis = ProjectAnalysis(projects, projects.for_path(str(tmp_path / "a.py")), parse_for_analysis)
    projects.record_consulted()
    analysis.index()
    assert projects.consulted() == [str(tmp_path)]
    projects.record_consulted()
    assert projects.consulted() == []


def test_crossfile_keeps_no_module_global_state():
    mutable = [name for name, value in vars(crossfile).items() if isinstance(value, (dict, list, set)) and not name.startswith("__")]
    assert mutable == []


# -- the model: answers that hold after the walk -------------------------------------
def _walked(source: str):
    import libcst as cst

    from torchlint.collector import Collector
    from torchlint.model import FileModel
    from torchlint.walker import Walker

    module = cst.parse_module(textwrap.dedent(source))
    model = FileModel("x.py", textwrap.dedent(source), module)
    sites = []

    class SiteTaker:
        def visit_Call(self, node):
            sites.append((model.code_for(node), model.site()))

    taker = SiteTaker()
    Walker(Collector(model), {cst.Call: [taker.visit_Call]}, {}, lambda method, exc: None).walk(module)
    return model, dict(sites)


def test_a_site_knows_the_bindings_of_its_scope_after_the_walk():
    model, sites = _walked("""
        def train(loader):
            x = make()
            use(x)
            x = x.cuda()
            later(x)

        def other():
            x = elsewhere()
            use(x)
    """)
    code_of = model.code_for
    assert code_of(sites["use(x)"].value_of("x")) == "elsewhere()"  # the last use(x) seen: other()'s scope
    assert code_of(sites["later(x)"].value_of("x")) == "x.cuda()"
    # inside ``x = x.cuda()``'s own value, the binding before it holds
    assert code_of(sites["x.cuda()"].value_of("x")) == "make()"
    assert sites["make()"].value_of("x") is None
    assert model.values == {}  # the walk's view is gone; the sites' answers are not
