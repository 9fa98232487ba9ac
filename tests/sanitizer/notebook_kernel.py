"""Run a notebook in a real Jupyter kernel (nbclient + ipykernel) in a child
process with a time limit, so a kernel that hangs fails its test instead of
hanging the suite. Used by test_san_jupyter.py and gpu/test_san_gpu_jupyter.py."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, List, Optional

import nbformat

KERNEL_TIMEOUT_S = 240

_EXECUTE = textwrap.dedent("""
    import sys
    import nbformat
    from nbclient import NotebookClient

    source, target, folder = sys.argv[1:4]
    notebook = nbformat.read(source, as_version=4)
    client = NotebookClient(notebook, timeout=180, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": folder}})
    try:
        client.execute()
    finally:
        nbformat.write(notebook, target)
""")


def run_notebook(folder: Path, cells: List[str], env: Optional[Dict[str, str]] = None) -> List[dict]:
    """Execute ``cells`` (code, in order) with ``folder`` as the kernel's working
    directory; returns each cell's outputs."""
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in cells])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    source, target = folder / "in.ipynb", folder / "out.ipynb"
    nbformat.write(notebook, source)
    environment = dict(os.environ if env is None else env)
    done = subprocess.run([sys.executable, "-c", _EXECUTE, str(source), str(target), str(folder)],
                          capture_output=True, text=True, timeout=KERNEL_TIMEOUT_S, env=environment)
    assert done.returncode == 0, done.stderr[-3000:]
    executed = nbformat.read(target, as_version=4)
    return [cell.get("outputs", []) for cell in executed.cells]


def text_of(outputs: List[dict]) -> str:
    """Every stream's text and every error, as one string."""
    parts = []
    for output in outputs:
        if output.get("output_type") == "stream":
            parts.append(output["text"])
        elif output.get("output_type") == "error":
            parts.append(f"{output['ename']}: {output['evalue']}")
    return "".join(parts)


def html_of(outputs: List[dict]) -> str:
    return "".join(output.get("data", {}).get("text/html", "") for output in outputs)
