"""The result cache: warm runs lint nothing, edits re-lint only what depends
on them, entries are written atomically and parallel runs agree."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from torchlint import runner
from torchlint.cli import main

AMP = "import torch\nscaler = torch.cuda.amp.GradScaler()\n"
SYNC = "import torch\nfor batch in loader:\n    loss = model(batch.cuda())\n    print(loss.item())\n"


@pytest.fixture
def tree(tmp_path, monkeypatch):
    root = tmp_path / "proj"
    (root / ".git").mkdir(parents=True)
    (root / "a.py").write_text(SYNC)
    (root / "b.py").write_text(AMP)
    (root / "c.py").write_text("x = 1\n")
    monkeypatch.setenv("TORCHLINT_CACHE_DIR", str(tmp_path / "cache"))
    return root


def lint(root: pathlib.Path, capsys, *extra: str):
    capsys.readouterr()
    code = main(["check", "--isolated", "--preview", "--jobs", "1", "--select", "TL101,TL402", "--output-format", "json", *extra, str(root)])
    return code, sorted((os.path.basename(d["filename"]), d["code"], d["location"]["row"]) for d in json.loads(capsys.readouterr().out))


@pytest.fixture
def linted(monkeypatch):
    """The files each run actually lints (not served from the cache)."""
    seen = []
    real = runner._run_all

    def spy(jobs, workers, *progress):
        seen.append(sorted(os.path.basename(job.path) for job in jobs))
        return real(jobs, workers, *progress)

    monkeypatch.setattr(runner, "_run_all", spy)
    return seen


def test_warm_run_lints_nothing_and_reports_the_same(tree, capsys, linted):
    cold = lint(tree, capsys)
    warm = lint(tree, capsys)
    assert cold == warm and cold[1] == [("a.py", "TL101", 4)]
    assert linted == [["a.py", "b.py", "c.py"], []]
    assert (tree.parent / "cache" / ".torchlint_cache" / "CACHEDIR.TAG").is_file()


def test_an_edit_relints_only_that_file(tree, capsys, linted):
    lint(tree, capsys)
    (tree / "c.py").write_text("import torch\nfor batch in loader:\n    print(model(batch.cuda()).item())\n")
    code, found = lint(tree, capsys)
    assert linted[-1] == ["c.py"]
    assert ("c.py", "TL101", 3) in found


def test_a_project_fact_relints_the_files_that_depend_on_it(tree, capsys, linted):
    assert lint(tree, capsys)[1] == [("a.py", "TL101", 4)]
    (tree / "requirements.txt").write_text("torch>=2.4\n")
    code, found = lint(tree, capsys)
    assert linted[-1] == ["a.py", "b.py", "c.py"]
    assert ("b.py", "TL402", 2) in found


def test_editing_a_file_whose_facts_another_file_used_relints_that_file(tmp_path, monkeypatch, capsys, linted):
    # main.py builds a pinned loader and passes it to engine.py, whose blocking copy is TL201
    # only because the loader is pinned: engine.py's result depends on main.py.
    root = tmp_path / "proj"
    (root / ".git").mkdir(parents=True)
    package = pathlib.Path(__file__).parent.parent / "fixtures" / "packages" / "TL201_loader_across_files"
    for name in ("main.py", "engine.py"):
        (root / name).write_text((package / name).read_text())
    (root / "c.py").write_text("x = 1\n")
    monkeypatch.setenv("TORCHLINT_CACHE_DIR", str(tmp_path / "cache"))

    def run():
        capsys.readouterr()
        main(["check", "--isolated", "--preview", "--jobs", "1", "--select", "TL201", "--output-format", "json", str(root)])
        return sorted((os.path.basename(d["filename"]), d["code"]) for d in json.loads(capsys.readouterr().out))

    assert run() == [("engine.py", "TL201")]
    assert run() == [("engine.py", "TL201")] and linted[-1] == []
    from torchlint.cache import ResultCache

    assert ResultCache(str(tmp_path / "cache")).consulted_roots()[str(root)] >= 1  # engine.py's result
    main_py = root / "main.py"
    main_py.write_text(main_py.read_text().replace("pin_memory=True", "pin_memory=False"))
    assert run() == []  # served from the cache, engine.py would still say TL201
    assert "engine.py" in linted[-1] and "main.py" in linted[-1]
    assert "c.py" not in linted[-1]  # it consulted no other file


def test_settings_are_part_of_the_key(tree, capsys, linted):
    lint(tree, capsys)
    code, found = lint(tree, capsys, "--select", "TL402", "--target-torch", "2.4")
    assert linted[-1] == ["a.py", "b.py", "c.py"]
    assert found == [("b.py", "TL402", 2)]


def test_no_cache_neither_reads_nor_writes(tree, capsys, linted):
    lint(tree, capsys, "--no-cache")
    lint(tree, capsys, "--no-cache")
    assert linted == [["a.py", "b.py", "c.py"]] * 2
    assert not (tree.parent / "cache").exists()


def test_fixing_never_uses_the_cache(tree, capsys, linted):
    lint(tree, capsys)
    main(["check", "--isolated", "--preview", "--jobs", "1", "--diff", str(tree)])
    assert linted[-1] == ["a.py", "b.py", "c.py"]


def test_a_damaged_entry_is_a_miss(tree, capsys, linted):
    before = lint(tree, capsys)
    for entry in (tree.parent / "cache").rglob("*"):
        if entry.is_file() and entry.parent != tree.parent / "cache":
            entry.write_bytes(b"\x80garbage")
    assert lint(tree, capsys) == before
    assert linted[-1] == ["a.py", "b.py", "c.py"]


def test_parallel_runs_share_one_cache(tmp_path):
    root = tmp_path / "proj"
    (root / ".git").mkdir(parents=True)
    for index in range(40):
        (root / f"m{index}.py").write_text(SYNC if index % 2 else AMP)
    env = {**os.environ, "TORCHLINT_CACHE_DIR": str(tmp_path / "cache")}
    command = [sys.executable, "-m", "torchlint", "check", "--isolated", "--preview", "--jobs", "2", "--select", "TL101", "--output-format", "json", str(root)]
    runs = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env) for _ in range(3)]
    outputs = [sorted((d["filename"], d["code"]) for d in json.loads(run.communicate()[0])) for run in runs]
    assert outputs[0] == outputs[1] == outputs[2] and len(outputs[0]) == 20
    leftovers = [p for p in (tmp_path / "cache").rglob(".torchlint-*")]
    assert leftovers == []
    warm = subprocess.run(command, capture_output=True, text=True, env=env)
    assert sorted((d["filename"], d["code"]) for d in json.loads(warm.stdout)) == outputs[0]


def test_cache_dir_flag_short_no_cache_and_clean(tree, capsys, linted, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    lint(tree, capsys, "--cache-dir", str(elsewhere))
    lint(tree, capsys, "--cache-dir", str(elsewhere))
    assert linted == [["a.py", "b.py", "c.py"], []]
    owned = elsewhere / ".torchlint_cache"  # --cache-dir names where the cache's own folder lives
    assert (owned / "CACHEDIR.TAG").is_file() and (owned / ".gitignore").read_text().endswith("*\n")
    assert os.listdir(elsewhere) == [".torchlint_cache"]
    assert any((owned / __import__("torchlint").__version__).iterdir())
    lint(tree, capsys, "-n", "--cache-dir", str(elsewhere))
    assert linted[-1] == ["a.py", "b.py", "c.py"]
    assert main(["clean", "--cache-dir", str(elsewhere)]) == 0
    assert os.listdir(elsewhere) == []


def test_clean_leaves_a_directory_that_is_not_a_cache(tmp_path, capsys):
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "notes.txt").write_text("keep")
    assert main(["clean", "--cache-dir", str(tmp_path / "precious")]) == 0  # no cache there: nothing to do
    assert (tmp_path / "precious" / "notes.txt").exists()
    (tmp_path / "precious" / ".torchlint_cache").mkdir()  # named like the cache, not tagged by it
    assert main(["clean", "--cache-dir", str(tmp_path / "precious")]) == 2
    assert (tmp_path / "precious" / "notes.txt").exists() and (tmp_path / "precious" / ".torchlint_cache").exists()
