"""Preview rules, as in ruff: a rule runs without ``--preview`` only once
measurement made it stable (``torchlint/stable_rules.json``).

Most tests here fix the stable list themselves (TL101 stable and on by
default, TL802 stable and opt-in, every other rule in preview), so they hold
whatever the measured list says today.
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from torchlint import docs, lifecycle
from torchlint.cli import main
from torchlint.flake8_plugin import TorchlintChecker
from torchlint.registry import all_rules
from torchlint.reporters import ReportContext
from torchlint.reporters.ci import sarif_document
from torchlint.selection import Layer, preview_selections, resolve

SOURCE = """\
import torch
from torch.utils.data import DataLoader

loader = DataLoader(dataset, batch_size=32, pin_memory=True)
for x in loader:
    x = x.to("cuda")
    loss = model(x)
    loss.backward()
    print(loss.item())
fallback_device = "cpu"
"""
PREVIEW_WARNING = "torchlint: warning: Selection `TL201` has no effect because preview is not enabled."
NOTHING_ENABLED = "No rule is enabled: the selected rules are all in preview."


@pytest.fixture
def measured(monkeypatch):
    """TL101 (on by default) and TL802 (opt-in) stable; every other rule in preview."""
    stable = {"TL101": {"since": "0.2.0"}, "TL802": {"since": "0.2.0"}}
    monkeypatch.setattr(lifecycle, "stable_rules", lambda path=None: stable)
    return stable


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(SOURCE)
    return tmp_path


def _lint(capsys, *args):
    code = main(["--jobs", "1", "--no-cache", "--output-format", "json", *args, "train.py"])
    out, err = capsys.readouterr()
    return code, sorted({d["code"] for d in json.loads(out)}), err


def test_the_default_set_is_the_stable_rules_that_are_not_opt_in(measured):
    rules = all_rules()
    assert resolve([], rules) == {"TL000", "TL101"}
    with_preview = resolve([], rules, preview=True)
    assert {"TL101", "TL201", "TL501"} <= with_preview and "TL802" not in with_preview  # opt-in stays opt-in


def test_selectors_reach_preview_rules_only_with_preview(measured):
    rules = all_rules()
    assert resolve([Layer(select=["ALL"])], rules) == {"TL000", "TL101", "TL802"}
    assert resolve([Layer(select=["TL1"])], rules) == {"TL000", "TL101"}
    assert resolve([Layer(select=["TL201"])], rules) == {"TL000"}
    assert {"TL102", "TL103"} <= resolve([Layer(select=["TL1"])], rules, preview=True)
    assert resolve([Layer(extend_select=["TL802"])], rules) == {"TL000", "TL101", "TL802"}  # stable opt-in: no preview needed


def test_only_exact_codes_of_preview_rules_are_said_to_have_no_effect(measured):
    rules = all_rules()
    layers = [Layer(select=["TL2", "TL201", "TL101"], extend_select=["TL501"], ignore=["TL202"])]
    assert preview_selections(layers, rules) == ["TL201", "TL501"]


def test_command_line_warns_like_ruff_and_preview_turns_the_rule_on(measured, project, capsys):
    code, found, err = _lint(capsys, "--select", "TL201")
    assert (code, found) == (0, []) and PREVIEW_WARNING in err.splitlines()
    assert NOTHING_ENABLED in err
    code, found, err = _lint(capsys, "--preview", "--select", "TL201")
    assert (code, found, err) == (1, ["TL201"], "")


def test_a_prefix_is_narrowed_silently_and_the_default_run_says_nothing(measured, project, capsys):
    code, found, err = _lint(capsys, "--select", "TL2")
    assert found == [] and "Selection" not in err and NOTHING_ENABLED in err
    code, found, err = _lint(capsys)
    assert (code, found, err) == (1, ["TL101"], "")
    code, found, err = _lint(capsys, "--preview")
    assert {"TL101", "TL201", "TL501"} <= set(found)


def test_quiet_and_silent_drop_the_warnings(measured, project, capsys):
    for flag in ("-q", "-s"):
        code = main(["--jobs", "1", "--no-cache", flag, "--select", "TL201", "train.py"])
        assert code == 0 and capsys.readouterr().err == ""


def test_config_preview_and_the_command_line_override(measured, project, capsys):
    (project / "pyproject.toml").write_text('[tool.torchlint]\npreview = true\nselect = ["TL201"]\n')
    assert _lint(capsys)[1] == ["TL201"]
    code, found, err = _lint(capsys, "--no-preview")
    assert found == [] and PREVIEW_WARNING in err
    assert main(["--show-settings", "train.py"]) == 0
    assert json.loads(capsys.readouterr().out)["preview"] is True
    (project / "pyproject.toml").write_text("[tool.torchlint]\npreview = 1\n")
    assert main(["--no-cache", "train.py"]) == 2
    assert "pyproject.toml: preview: expected true or false, got 1" in capsys.readouterr().err


def test_rule_listing_and_json_mark_the_status(measured, capsys):
    assert main(["rule", "--all"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert not lines["TL101"].endswith(")")  # stable and on by default: no mark
    assert lines["TL201"].endswith("(preview)") and lines["TL802"].endswith("(opt-in)") and lines["TL801"].endswith("(preview, opt-in)")
    assert main(["rule", "--all", "--output-format", "json"]) == 0
    by_code = {entry["code"]: entry for entry in json.loads(capsys.readouterr().out)}
    assert by_code["TL101"]["preview"] is False and by_code["TL101"]["status"] == {"Stable": {"since": "0.2.0"}}
    assert by_code["TL201"]["preview"] is True and by_code["TL201"]["status"] == {"Preview": {"since": "0.1.0"}}
    assert by_code["TL101"]["default"] is True and by_code["TL802"]["default"] is False and by_code["TL201"]["default"] is False
    assert main(["rule", "TL201"]) == 0
    assert "This rule is in preview and is not stable. The `--preview` flag is required for use." in capsys.readouterr().out


def test_docs_table_and_pages_show_the_status(measured):
    rules = all_rules()
    table = docs.rule_table(rules.values())
    row = {line.split("|")[1].strip().split("]")[0].lstrip("["): line for line in table.splitlines()[2:]}
    assert "| on |" in row["TL101"] and "| preview |" in row["TL201"] and "| opt-in |" in row["TL802"]
    assert "| preview, opt-in |" in row["TL801"]
    assert "Stable since v0.2.0, on by default." in docs.render_markdown(rules["TL101"])
    assert "Added in v0.1.0. Preview." in docs.render_markdown(rules["TL201"])


def test_sarif_rules_are_enabled_by_default_only_in_the_default_set(measured):
    driver = sarif_document([], ReportContext())["runs"][0]["tool"]["driver"]
    enabled = {rule["id"]: rule["defaultConfiguration"]["enabled"] for rule in driver["rules"]}
    assert enabled["TL101"] and enabled["TL000"] and not enabled["TL201"] and not enabled["TL802"]
    status = {rule["id"]: rule["properties"]["status"] for rule in driver["rules"]}
    assert status["TL101"] == "stable" and status["TL201"] == "preview"


def test_flake8_default_ignores_preview_and_opt_in_codes(measured):
    class OptionManager:
        ignored = None

        def add_option(self, *args, **kwargs):
            pass

        def extend_default_ignore(self, codes):
            OptionManager.ignored = sorted(codes)

    TorchlintChecker.add_options(OptionManager())
    expected = sorted(code for code in all_rules() if code not in ("TL000", "TL101"))
    assert OptionManager.ignored == expected


def test_flake8_runs_a_preview_rule_only_when_named(tmp_path):
    preview = [code for code, rule in all_rules().items() if lifecycle.is_preview(rule)]
    if "TL101" not in preview:
        pytest.skip("TL101 is stable: nothing to opt into")
    source = tmp_path / "m.py"
    source.write_text(SOURCE)
    flake8 = os.path.join(os.path.dirname(sys.executable), "flake8")
    default = subprocess.run([flake8, str(source)], capture_output=True, text=True)
    assert "TL101" not in default.stdout
    named = subprocess.run([flake8, "--extend-select", "TL101", str(source)], capture_output=True, text=True)
    assert ":9:11: TL101 " in named.stdout


def test_the_stable_list_is_written_by_measurement(tmp_path):
    """Every rule in the shipped list carries the measure that put it there, at the bar."""
    for code, record in lifecycle.stable_rules().items():
        assert code in all_rules(), f"{code}: not a rule"
        assert record["judged"] >= 20 and record["precision"] >= 0.90 and record["projects"] >= 5 and record["commit"], code
    path = tmp_path / "stable.json"
    lifecycle.write_stable_rules({"TL101": {"since": "0.2.0", "judged": 21}}, str(path))
    assert lifecycle.stable_rules(str(path)) == {"TL101": {"since": "0.2.0", "judged": 21}}
    path.write_text('{"stable": [1]}')
    lifecycle.stable_rules.cache_clear()
    with pytest.raises(RuntimeError, match="stable.json"):
        lifecycle.stable_rules(str(path))
    lifecycle.stable_rules.cache_clear()


def test_shipped_list_is_package_data():
    text = (pathlib.Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert '"torchlint" = ["stable_rules.json"]' in text
