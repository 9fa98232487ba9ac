"""Where users run torchlint: flake8, pre-commit, GitHub, SARIF, generated docs."""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import jsonschema
import pytest

from torchlint import docs
from torchlint.cli import main
from torchlint.registry import all_rules
from torchlint.reporters import ReportContext
from torchlint.reporters.ci import escape_data, escape_property, github, sarif_document
from torchlint.rule import Diagnostic

REPO = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(sys.executable).parent
SCHEMA = json.loads((REPO / "tests" / "data" / "sarif-schema-2.1.0.json").read_text())


def _lint_json(*args: str, cwd=REPO):
    out = subprocess.run([str(BIN / "torchlint"), "--output-format", "json", *args], capture_output=True, text=True, cwd=cwd)
    assert out.returncode in (0, 1), out.stderr
    return json.loads(out.stdout)


def test_sarif_validates_against_schema_and_github_limits(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    code = main(["--jobs", "1", "--output-format", "sarif", "--preview", "--select", "ALL", "examples", "tests/fixtures"])
    document = json.loads(capsys.readouterr()[0])
    assert code == 1
    jsonschema.validate(document, SCHEMA)
    run = document["runs"][0]
    driver = run["tool"]["driver"]
    assert driver["name"] == "torchlint" and driver["semanticVersion"]
    ids = [rule["id"] for rule in driver["rules"]]
    assert ids == list(all_rules())
    for rule in driver["rules"]:
        assert rule["shortDescription"]["text"] and rule["fullDescription"]["text"] and rule["help"]["text"]
        assert len(rule["fullDescription"]["text"]) <= 1024
        assert rule["help"]["markdown"].startswith("# ") and rule["helpUri"].endswith("#" + rule["id"].lower())
    assert run["results"]
    for result in run["results"]:
        location = result["locations"][0]["physicalLocation"]
        uri = location["artifactLocation"]["uri"]
        assert not uri.startswith("/") and (REPO / uri).is_file()
        region = location["region"]
        assert region["startLine"] >= 1 and region["startColumn"] >= 1
        assert result["partialFingerprints"] and driver["rules"][result["ruleIndex"]]["id"] == result["ruleId"]


def test_github_annotations_escape_messages_and_properties():
    assert escape_data("50%\r\nnext") == "50%25%0D%0Anext"
    assert escape_property("a:b,c%") == "a%3Ab%2Cc%25"
    d = Diagnostic("TL101", "host-sync-in-loop", "100% sync: a,b\nsecond", "dir,x/a:b.py", 3, 5, 3, 9)
    import io

    out = io.StringIO()
    github([d], ReportContext(cwd="/"), out)
    line = out.getvalue().strip()
    assert line == (
        "::error file=dir%2Cx/a%3Ab.py,line=3,col=5,endLine=3,endColumn=9,"
        "title=TL101 host-sync-in-loop::TL101 100%25 sync: a,b%0Asecond"
    )


def _flake8_findings(paths):
    out = subprocess.run(
        [str(BIN / "flake8"), "--select", "TL", "--format", "%(path)s:%(row)d:%(col)d:%(code)s", *paths],
        capture_output=True, text=True, cwd=REPO,
    )
    assert out.returncode in (0, 1), out.stderr
    found = set()
    for line in out.stdout.splitlines():
        path, row, col, code = line.rsplit(":", 3)
        found.add((os.path.normpath(path), int(row), int(col), code))
    return found


def test_flake8_reports_the_same_findings_as_torchlint():
    # The same selection on both sides: `--select TL` names every torchlint
    # rule, opt-in ones included, in flake8 and in torchlint alike (flake8 has
    # no preview mode: an explicit select beats its default ignore list).
    paths = ["examples", "tests/fixtures"]
    ours = {
        (os.path.relpath(d["filename"], REPO), d["location"]["row"], d["location"]["column"], d["code"])
        for d in _lint_json("--ignore-noqa", "--preview", "--select", "TL", *paths)
    }
    theirs = _flake8_findings(paths)
    # flake8 applies noqa itself (by prefix); compare on lines without one.
    def has_noqa(item):
        line = (REPO / item[0]).read_text(encoding="utf-8").splitlines()[item[1] - 1]
        return "noqa" in line.lower()

    # flake8 reads no notebooks: their findings are torchlint's alone.
    ours = {f for f in ours if not f[0].endswith(".ipynb") and not has_noqa(f) and f[3] != "TL000"}
    theirs = {f for f in theirs if not has_noqa(f)}
    assert ours, "the fixtures should produce findings"
    assert sorted(ours - theirs) == [] and sorted(theirs - ours) == []


def test_flake8_plugin_options_and_opt_in_rules(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("import torch\nfor batch in loader:\n    loss = model(batch.cuda())\n    print(loss.item())\n")
    base = [str(BIN / "flake8"), "--select", "TL", str(source)]
    out = subprocess.run(base, capture_output=True, text=True)
    assert ":4:11: TL101 " in out.stdout
    out = subprocess.run(base + ["--torchlint-target-torch", "1.13"], capture_output=True, text=True)
    assert out.returncode == 1
    out = subprocess.run(base + ["--torchlint-rule-option", "TL999.x=1"], capture_output=True, text=True)
    assert out.returncode != 0


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_pre_commit_hooks_check_and_fix(tmp_path):
    repo = tmp_path / "user-repo"
    repo.mkdir()
    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "cache"), "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    bad = textwrap.dedent(
        """\
        import torch
        from torch.utils.data import DataLoader

        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        loader = DataLoader(dataset, batch_size=64, pin_memory=True)
        for x, y in loader:
            x = x.to(device)
        """
    )
    (repo / "train.py").write_text(bad)
    (repo / "pyproject.toml").write_text("[tool.torchlint]\npreview = true\n")  # every rule is in preview for now
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True, env=env)
    subprocess.run(["git", "add", "."], cwd=repo, check=True, env=env)
    pre_commit = [str(BIN / "pre-commit"), "try-repo", str(REPO)]

    check = subprocess.run(pre_commit + ["torchlint", "--all-files"], cwd=repo, capture_output=True, text=True, env=env)
    assert check.returncode == 1, check.stdout + check.stderr
    assert "TL201" in check.stdout

    fix = subprocess.run(pre_commit + ["torchlint-fix", "--all-files"], cwd=repo, capture_output=True, text=True, env=env)
    assert fix.returncode == 1 and "files were modified by this hook" in fix.stdout, fix.stdout + fix.stderr
    assert "x = x.to(device, non_blocking=True)" in (repo / "train.py").read_text()

    again = subprocess.run(pre_commit + ["torchlint-fix", "--all-files"], cwd=repo, capture_output=True, text=True, env=env)
    assert again.returncode == 0, again.stdout + again.stderr


def test_docs_rules_md_is_up_to_date():
    expected = docs.render_all_markdown(all_rules().values())
    committed = (REPO / "docs" / "rules.md").read_text(encoding="utf-8")
    assert committed == expected, "docs/rules.md is stale: run `make docs`"


def test_readme_rule_table_is_up_to_date():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert docs.rule_table(all_rules().values()) in readme, "README rule table is stale: run `make docs`"


def test_every_finding_url_points_at_its_docs_section():
    rendered = (REPO / "docs" / "rules.md").read_text(encoding="utf-8")
    for code in all_rules():
        assert f'<a id="{code.lower()}"></a>' in rendered
