"""The input/output reproductions of the 2026-11 reliability report (issue #31).

Each test is named by the report's number (``test_01_...`` is defect 1) and
runs its reproduction. The data-loss cases (1, 2, 3) run the real command in
its own process; where a reproduction needs something to happen *during* a
run (an editor's save, a second run), a ``sitecustomize`` module makes it
happen at a fixed point instead of after a sleep, so the test cannot pass or
fail by timing.
"""
from __future__ import annotations

import json
import os
import pickle
import shutil
import stat
import subprocess
import sys
import textwrap
import xml.dom.minidom

import pytest

from torchlint import project
from torchlint.cli import main

SYNC = "import torch\nfor x, y in loader:\n    print(model(x.cuda()).item())\n"  # TL101 and TL501
LOADER = textwrap.dedent(
    """\
    import torch
    from torch.utils.data import DataLoader


    def main(dataset, model, device):
        loader = DataLoader(dataset, batch_size=4)
        for x, y in loader:
            loss = model.forward(x.to(device)).sum()
            loss.backward()
    """
)  # TL202 (pin the loader) and TL603 (`model.forward(...)`), both with safe fixes


def torchlint(*args, cwd, env=None, timeout=120, **kwargs):
    """The real command, in its own process."""
    environment = dict(os.environ)
    environment.pop("TORCHLINT_CACHE_DIR", None)
    environment.update(env or {})
    return subprocess.run([sys.executable, "-m", "torchlint", "--isolated", "--preview", *args], cwd=cwd,
                          capture_output=True, timeout=timeout, env=environment, **kwargs)


def lint(capsys, *args):
    capsys.readouterr()
    code = main(["--isolated", "--preview", "--jobs", "1", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TORCHLINT_CACHE_DIR", raising=False)
    project.clear_caches()
    return tmp_path


def during_run(tmp_path, body: str) -> dict:
    """An environment whose torchlint runs ``body`` in the worker after the
    file is read and linted, just before the fix is written."""
    hook = tmp_path / "hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(
        "import os\n"
        "import torchlint.runner as runner\n"
        "real = runner.run_text\n"
        "def run_text(text, job):\n"
        "    result = real(text, job)\n"
        "    if job.mode == runner.FIX:\n"
        + textwrap.indent(textwrap.dedent(body), " " * 8)
        + "    return result\n"
        "runner.run_text = run_text\n"
    )
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")]))}


# -- 1: the cache is ours alone ------------------------------------------------------
def test_01_clean_deletes_only_the_folder_the_cache_made(tmp_path):
    home_cache = tmp_path / "home" / ".cache"
    (home_cache / "huggingface" / "hub").mkdir(parents=True)
    (home_cache / "huggingface" / "hub" / "model.safetensors").write_text("weights\n")
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text(SYNC)
    env = {"TORCHLINT_CACHE_DIR": str(home_cache)}
    assert torchlint("-q", ".", cwd=proj, env=env).returncode == 1
    assert sorted(os.listdir(home_cache)) == [".torchlint_cache", "huggingface"]  # nothing of ours beside its files
    cleaned = subprocess.run([sys.executable, "-m", "torchlint", "clean"], cwd=proj, capture_output=True, text=True,
                             env=dict(os.environ, **env))
    assert cleaned.returncode == 0, cleaned.stderr
    assert (home_cache / "huggingface" / "hub" / "model.safetensors").read_text() == "weights\n"
    assert sorted(os.listdir(home_cache)) == ["huggingface"]

    # --cache-dir . : the project gets a .torchlint_cache folder, never a tag or a `*` .gitignore of its own
    assert torchlint("-q", "--cache-dir", ".", ".", cwd=proj).returncode == 1
    assert sorted(os.listdir(proj)) == [".torchlint_cache", "train.py"]
    cleaned = subprocess.run([sys.executable, "-m", "torchlint", "clean", "--cache-dir", "."], cwd=proj,
                             capture_output=True, text=True)
    assert cleaned.returncode == 0 and sorted(os.listdir(proj)) == ["train.py"]


def test_01_clean_leaves_what_it_did_not_write(tmp_path):
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text(SYNC)
    assert torchlint("-q", ".", cwd=proj).returncode == 1
    cache = proj / ".torchlint_cache"
    (cache / "notes.txt").write_text("mine\n")
    cleaned = subprocess.run([sys.executable, "-m", "torchlint", "clean"], cwd=proj, capture_output=True, text=True)
    assert cleaned.returncode == 0 and "notes.txt" in cleaned.stderr
    assert sorted(os.listdir(cache)) == [".gitignore", "CACHEDIR.TAG", "notes.txt"]  # the entries are gone


def test_01_a_folder_named_like_the_cache_without_its_tag_is_neither_used_nor_cleaned(tmp_path):
    proj = tmp_path / "proj"
    (proj / ".torchlint_cache").mkdir(parents=True)
    (proj / ".torchlint_cache" / "data.bin").write_text("someone else's\n")
    (proj / "train.py").write_text(SYNC)
    assert torchlint("-q", ".", cwd=proj).returncode == 1
    assert os.listdir(proj / ".torchlint_cache") == ["data.bin"]
    cleaned = subprocess.run([sys.executable, "-m", "torchlint", "clean"], cwd=proj, capture_output=True, text=True)
    assert cleaned.returncode == 2 and "not a torchlint cache" in cleaned.stderr
    assert os.listdir(proj / ".torchlint_cache") == ["data.bin"]


# -- 2: --fix never loses an edit ----------------------------------------------------
def test_02_an_edit_saved_while_fix_runs_is_kept(tmp_path):
    (tmp_path / "train.py").write_text(LOADER)
    env = during_run(tmp_path, """\
        with open(job.path, "a") as handle:
            handle.write("# my edit, saved while torchlint runs\\n")
    """)
    done = torchlint("-n", "--fix", "--select", "TL202", "train.py", cwd=tmp_path, env=env, text=True)
    assert done.returncode == 1
    assert "train.py: changed during the run, not fixed" in done.stderr
    assert (tmp_path / "train.py").read_text() == LOADER + "# my edit, saved while torchlint runs\n"


def test_02_two_fix_runs_at_once_lose_nothing(tmp_path):
    """Run A reads the file, then waits (inside its run) until run B has
    fixed it: A must not write its result over B's fixes. A second A then
    fixes what is left, and both fixes are in the file."""
    (tmp_path / "t2.py").write_text(LOADER)
    go = tmp_path / "b-done"
    env = during_run(tmp_path, f"""\
        import time
        while not os.path.exists({str(go)!r}):
            time.sleep(0.05)
    """)
    run_a = subprocess.Popen([sys.executable, "-m", "torchlint", "--isolated", "--preview", "-n", "--fix", "--select", "TL603", "t2.py"],
                             cwd=tmp_path, env=dict(os.environ, **env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        done_b = torchlint("-n", "--fix", "--select", "TL202", "t2.py", cwd=tmp_path, text=True)
        assert done_b.returncode == 0, done_b.stderr
        go.write_text("")
        out, err = run_a.communicate(timeout=120)
    finally:
        run_a.kill()
    assert run_a.returncode == 1 and "t2.py: changed during the run, not fixed" in err
    text = (tmp_path / "t2.py").read_text()
    assert "pin_memory=True" in text and "model.forward(" in text  # B's fix is there; A wrote nothing
    assert torchlint("-n", "--fix", "--select", "TL603", "t2.py", cwd=tmp_path).returncode == 0
    text = (tmp_path / "t2.py").read_text()
    assert "pin_memory=True" in text and "model(x.to(device))" in text


# -- 3: -o never replaces a source ----------------------------------------------------
def test_03_output_file_that_is_a_linted_file_is_refused(tmp_path):
    (tmp_path / "train.py").write_text(SYNC)
    done = torchlint("-n", "-o", "train.py", cwd=tmp_path, text=True)
    assert done.returncode == 2
    assert done.stderr.strip() == "torchlint: error: train.py: the output file is one of the linted files; refusing to overwrite it"
    assert (tmp_path / "train.py").read_text() == SYNC


def test_03_output_file_over_a_python_source_is_refused(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text(SYNC)
    (tmp_path / "setup.py").write_text("x = 1\n")
    done = torchlint("-n", "-o", "setup.py", "src", cwd=tmp_path, text=True)
    assert done.returncode == 2 and "is a Python source" in done.stderr
    assert (tmp_path / "setup.py").read_text() == "x = 1\n"
    done = torchlint("-n", "-o", "report.txt", "src", cwd=tmp_path, text=True)
    assert done.returncode == 1 and "TL101" in (tmp_path / "report.txt").read_text()
