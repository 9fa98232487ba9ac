"""Colour on and off (--color, NO_COLOR, FORCE_COLOR, a terminal) and the concise line's width."""

import io
import os
import textwrap

import pytest

from torchlint.cli import main
from torchlint.color import use_color
from torchlint.reporters.concise_message import LINE_WIDTH, MIN_MESSAGE_WIDTH, shorten

ANSI = "\x1b["


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    "choice, environ, stream, expected",
    [
        ("always", {"NO_COLOR": "1"}, io.StringIO(), True),  # the flag wins over the environment
        ("never", {"FORCE_COLOR": "1"}, Terminal(), False),
        ("auto", {}, Terminal(), True),
        ("auto", {}, io.StringIO(), False),  # a pipe or a file
        ("auto", {"NO_COLOR": "1"}, Terminal(), False),
        ("auto", {"NO_COLOR": ""}, Terminal(), True),  # empty means unset (no-color.org)
        ("auto", {"FORCE_COLOR": "1"}, io.StringIO(), True),
        ("auto", {"NO_COLOR": "1", "FORCE_COLOR": "1"}, io.StringIO(), False),
        ("auto", {"TERM": "dumb"}, Terminal(), False),
    ],
)
def test_when_colour_is_used(choice, environ, stream, expected):
    assert use_color(choice, stream, environ) is expected


TRAIN = textwrap.dedent(
    """\
    import torch
    from torch.utils.data import DataLoader


    def train(model, optimizer, dataset, device):
        loader = DataLoader(dataset, batch_size=32, pin_memory=True)
        for step, (images, labels, weights) in enumerate(loader):
            images = images.to(device)
            optimizer.zero_grad(set_to_none=False)
            loss = model(images).sum()
            loss.backward()
            optimizer.step()
            print(f"{loss.item()} {int(loss)}")
    """
)


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "recipes" / "classification").mkdir(parents=True)
    (tmp_path / "recipes" / "classification" / "train.py").write_text(TRAIN)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    return tmp_path


def lint(capsys, *args):
    code = main(["--jobs", "1", "--no-cache", "--preview", "--select", "ALL", *args, "."])
    return code, capsys.readouterr().out


def test_output_is_plain_when_not_a_terminal_and_coloured_when_forced(project, capsys, monkeypatch):
    _, plain = lint(capsys)
    assert ANSI not in plain
    _, always = lint(capsys, "--color", "always")
    assert f"{ANSI}1;31mTL201{ANSI}0m" in always
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert ANSI in lint(capsys)[1]
    assert ANSI not in lint(capsys, "--color", "never")[1]
    assert ANSI not in lint(capsys, "--output-format", "json")[1]  # data is never coloured


def test_concise_lines_fit_in_100_columns_and_full_keeps_the_detail(project, capsys):
    _, concise = lint(capsys)
    findings = [line for line in concise.splitlines() if ": TL" in line]
    assert len(findings) >= 3
    assert all(len(line) <= LINE_WIDTH for line in findings), [line for line in findings if len(line) > LINE_WIDTH]
    assert any(line.endswith("…") or len(line) < LINE_WIDTH for line in findings)
    _, full = lint(capsys, "--output-format", "full")
    assert "  help: " in full and "  note: " in full
    long_messages = [line for line in full.splitlines() if ": TL" in line and len(line) > LINE_WIDTH]
    assert long_messages  # the whole message is kept for full


def test_an_error_keeps_its_whole_reason_on_the_concise_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "broken.py").write_text("def f(:\n" + "    pass\n")
    (tmp_path / "n.ipynb").write_text("{ not json")
    _, out = lint(capsys)
    assert "n.ipynb:1:1: TL000 not a notebook: invalid JSON" in out
    assert any(line.startswith("broken.py:") and "TL000" in line and not line.endswith("…") for line in out.splitlines())


def test_a_short_message_is_kept_whole():
    assert shorten("`model.eval()` is followed by a forward pass", 60) == "`model.eval()` is followed by a forward pass"


def test_shortening_keeps_the_first_clause_then_whole_parts_then_the_summary():
    message = "`.cuda()` hardcodes the CUDA device, so this code fails on a machine without one; use `device`"
    assert shorten(message, 85) == "`.cuda()` hardcodes the CUDA device, so this code fails on a machine without one"
    assert shorten(message, 50) == "`.cuda()` hardcodes the CUDA device"
    no_commas = "`.item()` forces a host-device sync on every iteration of `for step, (x, y) in enumerate(loader)`"
    assert shorten(no_commas, 60, summary="A sync runs on every iteration") == "A sync runs on every iteration"
    cut = shorten(no_commas, 45)
    assert len(cut) <= 45 and cut.endswith("…") and cut.count("`") % 2 == 0


def test_code_spans_lose_their_arguments_first():
    message = "`optimizer.zero_grad(set_to_none=False)` writes zeros into every gradient"
    assert shorten(message, 60) == "`optimizer.zero_grad(…)` writes zeros into every gradient"


def test_a_very_long_path_still_leaves_the_message_its_minimum():
    message = "word " * 40
    assert MIN_MESSAGE_WIDTH - 6 <= len(shorten(message, 5)) <= MIN_MESSAGE_WIDTH


def test_color_flag_rejects_unknown_values(project, capsys):
    with pytest.raises(SystemExit):
        main(["--color", "sometimes", "."])
    assert "invalid choice" in capsys.readouterr().err
    assert os.getcwd() == str(project)
