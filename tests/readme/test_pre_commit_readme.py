"""The README's pre-commit snippet, exactly as shown, run by a real pre-commit against a new git repository.

The one change is where the repository lives: this checkout's path instead of its public URL.
pre-commit then clones it at the README's `rev`, builds the hooks' own environment with pip
(so it needs a package index) and runs both hooks; `pre-commit autoupdate` then moves `rev`
to this checkout's HEAD, whose hooks run too.
"""
import os
import re
import shutil
import sys
import textwrap
from pathlib import Path

import pytest
from user_env import REPO, explain, run

PUBLIC_URL = "https://github.com/torchlint/torchlint"
PRE_COMMIT = Path(sys.executable).parent / "pre-commit"

# TL201 (a safe fix: non_blocking=True) and TL101 (no fix), so both hooks have work.
USER_CODE = textwrap.dedent(
    """\
    import torch
    from torch.utils.data import DataLoader

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    loader = DataLoader(dataset, batch_size=64, pin_memory=True)
    for x, y in loader:
        x = x.to(device)
        print(model(x).sum().item())
    """
)


def readme_pre_commit_config() -> str:
    """The README's ```yaml block that names this repository."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    blocks = [block for block in re.findall(r"```yaml\n(.*?)```", readme, re.DOTALL) if f"repo: {PUBLIC_URL}\n" in block]
    assert len(blocks) == 1, f"expected one pre-commit snippet naming {PUBLIC_URL} in README.md, found {len(blocks)}"
    return blocks[0]


def git(*args, cwd=REPO):
    return run(["git", *args], cwd=cwd)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
@pytest.mark.skipif(not PRE_COMMIT.exists(), reason="needs pre-commit (the dev extra)")
def test_the_readme_pre_commit_snippet_fixes_then_fails_on_what_is_left(package_index, tmp_path):
    config = readme_pre_commit_config()
    pinned = re.search(r"^\s*rev:\s*(\S+)", config, re.MULTILINE).group(1)
    if git("rev-parse", "--git-dir").returncode != 0:
        pytest.skip(f"{REPO} is not a git repository: pre-commit needs one to clone")
    if git("cat-file", "-e", f"{pinned}^{{commit}}").returncode != 0:
        shallow = git("rev-parse", "--is-shallow-repository").stdout.strip() == "true"
        if shallow:
            pytest.skip(f"this shallow clone lacks the README's pinned commit {pinned}")
        pytest.fail(f"the README pins rev {pinned}, which is not a commit of this repository")

    user = tmp_path / "user-repo"
    user.mkdir()
    (user / "train.py").write_text(USER_CODE)
    # The README's configuration line that runs the rules still in preview.
    (user / "pyproject.toml").write_text("[tool.torchlint]\npreview = true\n")
    (user / ".pre-commit-config.yaml").write_text(config.replace(PUBLIC_URL, str(REPO)))
    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home")}
    assert git("init", "-q", cwd=user).returncode == 0

    def pre_commit(*args):
        assert git("add", ".", cwd=user).returncode == 0
        return run([PRE_COMMIT, *args], cwd=user, env=env)

    first = pre_commit("run", "--all-files")
    # The fix hook changes the file (and so fails, as pre-commit hooks that modify files do);
    # the check hook fails on what has no fix.
    assert first.returncode == 1, explain(first)
    assert re.search(r"torchlint \(fix\)\.+Failed\n- hook id: torchlint-fix\n(- exit code: 1\n)?"
                     r"- files were modified by this hook", first.stdout), explain(first)
    assert re.search(r"^torchlint\.+Failed$", first.stdout, re.MULTILINE), explain(first)
    assert "train.py:8:11: TL101 " in first.stdout, explain(first)
    assert "x = x.to(device, non_blocking=True)" in (user / "train.py").read_text()

    # `pre-commit autoupdate`, as the README advises: with no tags, rev becomes the newest commit.
    updated = pre_commit("autoupdate")
    assert updated.returncode == 0, explain(updated)
    head = git("rev-parse", "HEAD").stdout.strip()
    assert re.search(rf"^\s*rev:\s*{head}\b", (user / ".pre-commit-config.yaml").read_text(), re.MULTILINE), \
        explain(updated)
    fixed = (user / "train.py").read_text()
    again = pre_commit("run", "--all-files")
    # Nothing left to fix; both hooks still fail on the TL101 that has no fix.
    assert again.returncode == 1, explain(again)
    assert "files were modified" not in again.stdout and (user / "train.py").read_text() == fixed, explain(again)
    assert again.stdout.count("train.py:8:11: TL101 ") == 2, explain(again)
