"""`torchlint --watch`: a change to a file is linted again; bounded by the output, not by sleeps."""

import os
import queue
import subprocess
import sys
import textwrap
import threading

import pytest

from torchlint.watch import is_watched, poll_changes

CLEAN = "import torch\n"
SYNCING = textwrap.dedent(
    """\
    import torch
    from torch.utils.data import DataLoader


    def train(model, dataset, device):
        for images, labels in DataLoader(dataset, pin_memory=True):
            images = images.to(device)
            print(model(images).sum().item())
    """
)
EVENT_TIMEOUT_S = 120


class Lines:
    """A process's stdout, line by line, waited on with a timeout."""

    def __init__(self, stream) -> None:
        self.lines: "queue.Queue[str]" = queue.Queue()
        threading.Thread(target=lambda: [self.lines.put(line) for line in stream], daemon=True).start()

    def until(self, marker: str, timeout: float = EVENT_TIMEOUT_S) -> str:
        seen = []
        while True:
            line = self.lines.get(timeout=timeout)
            seen.append(line)
            if marker in line:
                return "".join(seen)


@pytest.fixture
def watched(tmp_path):
    target = tmp_path / "train.py"
    target.write_text(CLEAN)
    env = {**os.environ, "TORCHLINT_CACHE_DIR": str(tmp_path / "cache"), "NO_COLOR": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "torchlint", "--watch", "--preview", "--jobs", "1", "."],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    yield target, Lines(process.stdout)
    process.terminate()
    process.wait(timeout=EVENT_TIMEOUT_S)


def test_a_changed_file_is_linted_again(watched):
    target, output = watched
    first = output.until("Watching for file changes.")
    assert "Starting linter in watch mode" in first and "All checks passed!" in first
    # The watcher starts once the first lint is done: write until it reports the change.
    for attempt in range(20):
        target.write_text(SYNCING + f"# edit {attempt}\n")
        try:
            changed = output.until("File change detected", timeout=5)
            break
        except queue.Empty:
            continue
    else:
        pytest.fail("the change was never detected")
    assert "train.py" in changed
    relinted = output.until("Watching for file changes.")
    assert "train.py:8:" in relinted and "TL101" in relinted
    target.write_text(CLEAN)
    output.until("File change detected")
    assert "All checks passed!" in output.until("Watching for file changes.")


def test_watch_refuses_stdin_and_fixes(tmp_path):
    for args in (["-"], ["--fix", "."], ["missing.py"]):
        result = subprocess.run(
            [sys.executable, "-m", "torchlint", "--watch", *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
        )
        assert result.returncode == 2 and ("--watch" in result.stderr or "missing.py: no such file" in result.stderr)


def test_polling_reports_a_changed_file_and_ignores_others(tmp_path):
    (tmp_path / "model.py").write_text("x = 1\n")
    (tmp_path / "notes.txt").write_text("a\n")
    stop = threading.Event()
    batches = poll_changes([str(tmp_path)], stop, interval=0.05)
    found: "queue.Queue[set]" = queue.Queue()
    threading.Thread(target=lambda: found.put(next(batches)), daemon=True).start()
    (tmp_path / "notes.txt").write_text("b\n")
    (tmp_path / "model.py").write_text("x = 22\n")
    try:
        assert found.get(timeout=EVENT_TIMEOUT_S) == {str(tmp_path / "model.py")}
    finally:
        stop.set()


def test_which_files_are_watched():
    assert is_watched("a/b.py") and is_watched("n.ipynb") and is_watched("x/pyproject.toml")
    assert not is_watched("README.md") and not is_watched("x.pyc")
