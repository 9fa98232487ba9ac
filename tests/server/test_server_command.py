"""`torchlint server` as a command: no torch, and a clear message without its extra."""

import subprocess
import sys
import textwrap

TRAIN = textwrap.dedent(
    """\
    import torch
    from torch.utils.data import DataLoader


    def train(model, dataset, device):
        for images, labels in DataLoader(dataset, pin_memory=True):
            images = images.to(device)
            print(model(images).sum().item())
    """
)


def test_the_server_does_not_import_torch(tmp_path):
    script = textwrap.dedent(
        f"""
        import sys
        from torchlint.linter import lint_text
        from torchlint.cli import settings_from
        from torchlint.server import build_server
        server = build_server(["--preview"], settings_from)
        path = {str(tmp_path / "train.py")!r}
        output = lint_text({TRAIN!r}, path, server.settings.file_options(path))
        assert output.diagnostics, "nothing was linted"
        assert "torch" not in sys.modules, "the server imported torch"
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, cwd=tmp_path)


def test_without_the_extra_the_command_says_which_to_install(tmp_path):
    blocker = tmp_path / "pygls.py"
    blocker.write_text("raise ImportError('no pygls here', name='pygls')\n")
    result = subprocess.run(
        [sys.executable, "-m", "torchlint", "server"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 2
    assert "pip install 'torchlint[server]'" in result.stderr
