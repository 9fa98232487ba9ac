"""Helpers for installing torchlint as a user does: fresh virtual environments, commands, a sample file."""
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# A per-batch .item(): TL101 at line 7, column 17.
SAMPLE = textwrap.dedent(
    """\
    import torch

    def train(model, loader, optimizer):
        for images, labels in loader:
            loss = torch.nn.functional.cross_entropy(model(images), labels)
            loss.backward()
            total = loss.item()
            optimizer.step()
    """
)
SAMPLE_FINDING = "train.py:7:17: TL101 "


def run(command, **kwargs) -> subprocess.CompletedProcess:
    """Run a command, capturing its output; the caller checks the outcome."""
    return subprocess.run([str(part) for part in command], capture_output=True, text=True, **kwargs)


def explain(result: subprocess.CompletedProcess) -> str:
    return f"exit {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"


def fresh_venv(folder: Path) -> Path:
    """A new virtual environment with nothing but pip (no torch, whatever this one has); its bin folder."""
    created = run([sys.executable, "-m", "venv", folder])
    assert created.returncode == 0, explain(created)
    return folder / "bin"
