"""Files are treated as users expect: links, read-only files, failed writes,
the output file, stdin, and a worker that crashes or is orphaned."""
from __future__ import annotations

import faulthandler
import os
import signal
import stat
import subprocess
import sys
import time

import pytest

from processes import group_alive  # a helper module beside the tests
from torchlint import linter
from torchlint.cli import main

# TL204 fires where the copy runs per batch: the samples sit in a batch loop.
BEFORE = "import torch\nfor batch in loader:\n    x = torch.ones(3).cuda()\n"
AFTER = 'import torch\nfor batch in loader:\n    x = torch.ones(3, device="cuda")\n'
TORCHLINT = os.path.join(os.path.dirname(sys.executable), "torchlint")


@pytest.fixture
def tree(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def fix(capsys, *args):
    code = main(["--isolated", "--preview", "--jobs", "1", "--fix", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_read_only_file_is_left_alone_and_said_so(tree, capsys):
    path = tree / "ro.py"
    path.write_text(BEFORE)
    path.chmod(0o444)
    code, out, err = fix(capsys, ".")
    assert path.read_text() == BEFORE
    assert stat.S_IMODE(path.stat().st_mode) == 0o444
    assert "ro.py: file is read-only; not fixed" in err
    assert "ro.py:3:9: TL204" in out  # its findings are still reported
    assert code == 1


def test_symlink_is_fixed_through_the_link(tree, capsys):
    (tree / "target.py").write_text(BEFORE)
    os.symlink("target.py", tree / "link.py")
    fix(capsys, "link.py")
    assert os.path.islink(tree / "link.py") and os.readlink(tree / "link.py") == "target.py"
    assert (tree / "target.py").read_text() == AFTER


def test_hard_link_is_kept(tree, capsys):
    (tree / "a.py").write_text(BEFORE)
    os.link(tree / "a.py", tree / "b.py")
    fix(capsys, "a.py")
    assert os.stat(tree / "a.py").st_ino == os.stat(tree / "b.py").st_ino
    assert (tree / "b.py").read_text() == AFTER


def test_findings_are_reported_when_the_fixed_file_cannot_be_written(tree, capsys, monkeypatch):
    (tree / "a.py").write_text(BEFORE)

    def no_space(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    code, out, err = fix(capsys, "a.py")
    assert (tree / "a.py").read_text() == BEFORE
    assert "a.py: cannot write fixed file: No space left on device" in err
    assert "a.py:3:9: TL204" in out and "fixed" not in out
    assert code == 1


def test_bad_output_path_fails_before_any_file_is_written(tree, capsys):
    (tree / "a.py").write_text(BEFORE)
    code, _, err = fix(capsys, "-o", str(tree / "missing" / "out.json"), ".")
    assert code == 2 and "Traceback" not in err and "cannot write the output file" in err
    assert len(err.strip().splitlines()) == 1
    assert (tree / "a.py").read_text() == BEFORE


def _stdin_fix(data: bytes, *args) -> subprocess.CompletedProcess:
    return subprocess.run([TORCHLINT, "--isolated", "--preview", "--fix", *args, "-"], input=data, capture_output=True, timeout=60)


@pytest.mark.parametrize(
    "data",
    [
        b"x = (\n",  # TL000
        b"x = '\xff\xfe'\n",  # does not decode
        "import torch\n\u00e9 = 1\nfor batch in loader:\n    x = torch.ones(3).cuda()\n".encode("utf-8"),
    ],
)
def test_stdin_fix_prints_only_source(data):
    result = _stdin_fix(data)
    if b"cuda" in data:
        assert result.stdout == AFTER.replace("import torch\n", "import torch\n\u00e9 = 1\n").encode()
        assert b"1 fixed" in result.stderr  # the report goes to stderr, never into the buffer
    else:
        assert result.stdout == data  # unchanged: an editor buffer must survive
        assert b"TL000" in result.stderr


def test_stdin_fix_keeps_declared_encoding_and_bom():
    latin = "# -*- coding: latin-1 -*-\ns = '\u00e9'\n" + BEFORE
    assert _stdin_fix(latin.encode("latin-1")).stdout == ("# -*- coding: latin-1 -*-\ns = '\u00e9'\n" + AFTER).encode("latin-1")
    bom = b"\xef\xbb\xbf" + BEFORE.encode()
    assert _stdin_fix(bom).stdout == b"\xef\xbb\xbf" + AFTER.encode()


def test_stdin_fix_with_output_file_still_prints_source(tree):
    result = _stdin_fix(BEFORE.encode(), "-o", str(tree / "r.json"), "--output-format", "json")
    assert result.stdout == AFTER.encode()
    assert (tree / "r.json").read_text().startswith("[")


def test_a_crashing_worker_costs_one_file(tree, capsys, monkeypatch):
    """A native parser crash (libcst segfaults on some inputs) kills only the
    worker holding that file; the other results are kept, in order."""
    for i in range(6):
        (tree / f"m{i}.py").write_text("import torch\nfor b in loader:\n    b.cuda().item()\n")
    real = linter._lint_module

    def segfault_on_m3(text, path, *args):
        if path.endswith("m3.py"):
            faulthandler.disable()  # pytest's; it would print this worker's stack
            os.kill(os.getpid(), signal.SIGSEGV)
        return real(text, path, *args)

    monkeypatch.setattr(linter, "_lint_module", segfault_on_m3)
    for jobs in ("1", "2"):
        code = main(["--isolated", "--preview", "--jobs", jobs, "."])
        out, err = capsys.readouterr()
        assert code == 2
        assert [line.split(":")[0] for line in out.splitlines() if "TL101" in line] == [f"m{i}.py" for i in (0, 1, 2, 4, 5)]
        assert "m3.py: internal error in rule engine" in err and "SIGSEGV" in err
        assert "All checks passed" not in out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_killed_fix_leaves_every_file_whole_and_no_process_behind(tree, sig):
    """Kill the main process mid-fix: every file is either its original or
    fully fixed (never half-written), and no worker lives on."""
    originals = {}
    fixed = {}
    for i in range(400):
        lines = ["import torch\n", "for batch in loader:\n"] + [f"    x{j} = torch.ones({i}).cuda()\n" for j in range(40)]
        originals[f"f{i:03d}.py"] = "".join(lines)
        fixed[f"f{i:03d}.py"] = "".join(lines).replace(".cuda()", "").replace(f"torch.ones({i})", f'torch.ones({i}, device="cuda")')
        (tree / f"f{i:03d}.py").write_text(originals[f"f{i:03d}.py"])
    # After its tenth file, each process takes 2 s a file: the run cannot end before the
    # kill however fast the machine is, and a job in flight still ends soon after it.
    hook = tree.parent / f"{tree.name}-hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import time\n"
        "import torchlint.runner as runner\n"
        "real, done = runner.run_text, []\n"
        "def run_text(*args, **kwargs):\n"
        "    done.append(1)\n"
        "    if len(done) > 10:\n"
        "        time.sleep(2)\n"
        "    return real(*args, **kwargs)\n"
        "runner.run_text = run_text\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")])))
    process = subprocess.Popen(
        [TORCHLINT, "--isolated", "--preview", "--fix", "--jobs", "2", "-s", "."], cwd=tree, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
        # A run started in the background inherits an ignored SIGINT (as a shell's `cmd &` does, and as
        # CI's runner may): give it the default, as a terminal's Ctrl-C would find it.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # wait until some files are fixed, not all
        if sum((tree / name).read_text() == fixed[name] for name in list(fixed)[:200]) >= 3:
            break
        time.sleep(0.05)
    os.kill(process.pid, sig)
    process.wait(timeout=30)
    deadline = time.monotonic() + 10
    while group_alive(process.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not group_alive(process.pid), "a worker outlived the killed run"
    states = {"original": 0, "fixed": 0}
    for name in originals:
        text = (tree / name).read_text()
        assert text in (originals[name], fixed[name]), f"{name} is neither original nor fully fixed"
        states["original" if text == originals[name] else "fixed"] += 1
    assert states["fixed"] >= 3 and states["original"] >= 1, states
    assert not [p for p in os.listdir(tree) if p.startswith(".torchlint-")]


@pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="POSIX signals")
def test_a_signal_in_the_middle_of_a_hard_link_overwrite_waits_until_the_file_is_whole(tmp_path, monkeypatch):
    # Another thread that does not block SIGTERM can take it; CPython then runs
    # the Python handler on the main thread, in the middle of the write.
    import threading

    from torchlint import source

    path = tmp_path / "a.py"
    path.write_bytes(b"x" * 100)
    release = threading.Event()
    bystander = threading.Thread(target=release.wait)
    bystander.start()
    real_open = open

    class SignalledMidWrite:
        def __init__(self, handle):
            self.handle = handle

        def __enter__(self):
            return self

        def __exit__(self, *exc_info):
            return self.handle.__exit__(*exc_info)

        def write(self, data):
            written = self.handle.write(data)
            os.kill(os.getpid(), signal.SIGTERM)  # before truncate: the old file's tail is still there
            time.sleep(0.05)  # time for the bystander to take it; the handler is due when this returns
            return written

        def __getattr__(self, name):
            return getattr(self.handle, name)

    def end_like_a_worker(signum, frame):
        raise SystemExit(128 + signum)

    monkeypatch.setattr(source, "open", lambda *args: SignalledMidWrite(real_open(*args)), raising=False)
    previous = signal.signal(signal.SIGTERM, end_like_a_worker)
    try:
        with pytest.raises(SystemExit):
            source._overwrite(str(path), b"short\n")
    finally:
        signal.signal(signal.SIGTERM, previous)
        release.set()
        bystander.join()
    assert path.read_bytes() == b"short\n"  # truncated and synced before the handler ran
