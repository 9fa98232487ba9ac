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
import time
import xml.dom.minidom

import pytest

from processes import group_alive  # a helper module beside the tests
from torchlint.cli import main

SYNC = "import torch\nfor x, y in loader:\n    print(model(x.cuda()).item())\n"  # TL101 (and TL501 where a CPU path shows)
LOADER = textwrap.dedent(
    """\
    import torch
    from torch.utils.data import DataLoader


    def main(dataset, model, device):
        loader = DataLoader(dataset, batch_size=4, num_workers=4)
        for x, y in loader:
            loss = model.forward(x.to(device)).sum()
            loss.backward()
    """
)  # TL202 (pin the loader) and TL603 (`model.forward(...)`), both with unsafe fixes (hence --unsafe-fixes)


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
        "def run_text(text, job, *args, **kwargs):\n"
        "    result = real(text, job, *args, **kwargs)\n"
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
    done = torchlint("-n", "--fix", "--unsafe-fixes", "--select", "TL202", "train.py", cwd=tmp_path, env=env, text=True)
    assert done.returncode == 1
    assert "train.py: changed during the run, not fixed" in done.stderr
    assert (tmp_path / "train.py").read_text() == LOADER + "# my edit, saved while torchlint runs\n"


def test_02_two_fix_runs_at_once_lose_nothing(tmp_path):
    """Run A reads the file, then waits (inside its run) until run B has
    fixed it: A must not write its result over B's fixes. A second A then
    fixes what is left, and both fixes are in the file."""
    (tmp_path / "t2.py").write_text(LOADER)
    read, go = tmp_path / "a-read", tmp_path / "b-done"
    env = during_run(tmp_path, f"""\
        import time
        open({str(read)!r}, "w").close()
        while not os.path.exists({str(go)!r}):
            time.sleep(0.05)
    """)
    environment = dict(os.environ, **env)
    environment.pop("TORCHLINT_CACHE_DIR", None)
    run_a = subprocess.Popen([sys.executable, "-m", "torchlint", "--isolated", "--preview", "-n", "--fix", "--unsafe-fixes", "--select", "TL603", "t2.py"],
                             cwd=tmp_path, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not read.exists() and run_a.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)  # B starts only once A has read the file (a loaded machine starts A slowly)
        assert read.exists(), run_a.stderr.read() if run_a.poll() is not None else "run A never read the file"
        done_b = torchlint("-n", "--fix", "--unsafe-fixes", "--select", "TL202", "t2.py", cwd=tmp_path, text=True)
        assert done_b.returncode == 0, done_b.stderr
        go.write_text("")
        out, err = run_a.communicate(timeout=120)
    finally:
        run_a.kill()
    assert run_a.returncode == 1 and "t2.py: changed during the run, not fixed" in err
    text = (tmp_path / "t2.py").read_text()
    assert "pin_memory=True" in text and "model.forward(" in text  # B's fix is there; A wrote nothing
    assert torchlint("-n", "--fix", "--unsafe-fixes", "--select", "TL603", "t2.py", cwd=tmp_path).returncode == 0
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


# -- 14, 23: cache entries -----------------------------------------------------------
def test_14_a_file_edited_during_the_run_is_not_cached_under_what_was_read_first(here, capsys, monkeypatch):
    from torchlint import runner

    (here / "train.py").write_text(SYNC)
    real = runner._run_all

    def edit_before_the_worker_reads(jobs, workers, *progress):
        (here / "train.py").write_text("import torch\nfor x, y in loader:\n    print(model(x))\n")  # no findings
        return real(jobs, workers, *progress)

    monkeypatch.setattr(runner, "_run_all", edit_before_the_worker_reads)
    assert lint(capsys, "-q", ".")[0] == 0  # the worker linted the edited file
    monkeypatch.setattr(runner, "_run_all", real)
    (here / "train.py").write_text(SYNC)  # the edit undone
    code, out, _ = lint(capsys, "-q", ".")
    assert code == 1 and "TL101" in out


def _entries(root):
    return [os.path.join(folder, name) for folder, _, names in os.walk(root / ".torchlint_cache")
            for name in names if len(name) == 62]


def test_23_wrongly_shaped_and_corrupted_entries_are_misses(here, capsys):
    (here / "m.py").write_text(SYNC)
    cold = lint(capsys, "-q", ".")
    assert cold[0] == 1 and _entries(here)
    for entry in _entries(here):
        with open(entry, "wb") as handle:
            pickle.dump((42, {}), handle)
    assert lint(capsys, "-q", ".") == cold
    size = os.path.getsize(_entries(here)[0])
    for offset in range(0, size, max(1, size // 40)):  # single-byte flips all through the entry
        entry = _entries(here)[0]
        data = bytearray(open(entry, "rb").read())
        data[offset] ^= 0x41
        open(entry, "wb").write(bytes(data))
        assert lint(capsys, "-q", ".") == cold, offset


# -- 15, 16, 20: what is read ----------------------------------------------------------
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_15_fifos_and_devices_are_refused_without_reading_them(tmp_path):
    (tmp_path / "ok.py").write_text(SYNC)
    os.mkfifo(tmp_path / "pipe.py")
    os.symlink("/dev/zero", tmp_path / "zero.py")
    for args in ([".",], ["pipe.py", "zero.py", "ok.py"]):
        done = torchlint("-n", "-q", *args, cwd=tmp_path, text=True, timeout=60)
        assert done.returncode == 1, done.stderr
        lines = done.stdout.splitlines()
        assert "pipe.py:1:1: TL000 not a regular file (a FIFO); not read" in lines
        assert "zero.py:1:1: TL000 not a regular file (a character device); not read" in lines
        assert any(line.startswith("ok.py:3:") and "TL101" in line for line in lines)


def test_16_a_tree_thousands_of_folders_deep_is_walked(here, capsys):
    (here / "top.py").write_text(SYNC)
    for _ in range(1100):  # one level at a time: pathlib and os.makedirs would recurse themselves
        os.mkdir("a")
        os.chdir("a")
    with open("x.py", "w") as handle:
        handle.write(SYNC)
    os.chdir(here)
    try:
        code, out, err = lint(capsys, "-n", "-q", "--select", "TL101", ".")
        assert code == 1 and err == ""
        assert [line.split(":")[0].count("/") for line in out.splitlines()] == [1100, 0]
    finally:
        remove_deep_tree(here / "a")


def remove_deep_tree(top) -> None:
    """Bottom up, one level at a time (pytest's own clean-up, shutil.rmtree, recurses)."""
    os.chdir(top)
    depth = 0
    while os.path.isdir("a"):
        os.chdir("a")
        depth += 1
    for name in os.listdir("."):
        os.unlink(name)
    for _ in range(depth):
        os.chdir("..")
        os.rmdir("a")
    os.chdir("..")
    os.rmdir(top)


def test_20_a_file_over_the_size_limit_is_one_line_and_the_limit_is_configurable(here, capsys):
    (here / "gen.py").write_text("import torch\nv = f(" + ",".join(["x.y"] * 300_000) + ")\n")  # 1.2 MB
    (here / "ok.py").write_text(SYNC)
    code, out, _ = lint(capsys, "-n", "-q", ".")
    assert out.splitlines()[0] == "gen.py:1:1: TL000 file is 1.1 MiB, over max-file-size (1.0 MiB); not linted"
    assert code == 1 and "ok.py:3:" in out
    code, out, _ = lint(capsys, "-n", "-q", "--max-file-size", "100KB", "ok.py")
    assert "TL101" in out
    code, out, _ = lint(capsys, "-n", "-q", "--max-file-size", "10B", "ok.py")
    assert out == "ok.py:1:1: TL000 file is 0.1 KiB, over max-file-size (0.0 KiB); not linted\n"
    (here / "pyproject.toml").write_text('[tool.torchlint]\nmax-file-size = "50B"\n')
    capsys.readouterr()
    code = main(["--preview", "-n", "-q", "ok.py"])
    assert "over max-file-size" in capsys.readouterr().out
    assert lint(capsys, "--max-file-size", "lots", "ok.py")[0] == 2


# -- 17, 30: file names in every format -------------------------------------------------
FORMATS = ["concise", "full", "json", "json-lines", "grouped", "github", "sarif", "junit", "pylint"]


@pytest.mark.skipif(sys.platform != "linux", reason="needs a file system that takes any bytes")
@pytest.mark.parametrize("output_format", FORMATS)
def test_17_a_name_that_is_not_utf8_is_escaped_in_every_format(tmp_path, output_format):
    (tmp_path / "ok.py").write_text(SYNC)
    with open(os.path.join(os.fsencode(tmp_path), b"bad\xffname.py"), "w") as handle:
        handle.write(SYNC)
    on_stdout = torchlint("-n", "--output-format", output_format, ".", cwd=tmp_path)
    assert on_stdout.returncode == 1, on_stdout.stderr
    written = torchlint("-n", "--output-format", output_format, "-o", "report.out", ".", cwd=tmp_path)
    assert written.returncode == 1, written.stderr
    report = (tmp_path / "report.out").read_bytes()
    assert report == on_stdout.stdout
    text = report.decode("utf-8")  # strict: the report is UTF-8
    if output_format == "sarif":
        uris = {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
                for r in json.loads(text)["runs"][0]["results"]}
        assert uris == {"ok.py", "bad%FFname.py"}
    elif output_format in ("json", "json-lines"):
        assert "bad\\udcffname.py" in text
    elif output_format == "junit":
        xml.dom.minidom.parseString(report)
        assert "bad\\xffname.py" in text
    else:
        assert "bad\\xffname.py" in text


@pytest.mark.skipif(sys.platform == "win32", reason="needs control characters in file names")
def test_30_control_characters_in_names_are_escaped(tmp_path):
    (tmp_path / "esc\x1b[2Jx.py").write_text(SYNC)
    (tmp_path / "new\nline.py").write_text(SYNC)
    junit = torchlint("-n", "--select", "TL101", "--output-format", "junit", ".", cwd=tmp_path)
    xml.dom.minidom.parseString(junit.stdout)
    concise = torchlint("-n", "-q", "--select", "TL101", ".", cwd=tmp_path, text=True)
    assert concise.stdout.splitlines() == [
        "esc\\x1b[2Jx.py:3:11: TL101 " + concise.stdout.splitlines()[0].split(" TL101 ", 1)[1],
        "new\\x0aline.py:3:11: TL101 " + concise.stdout.splitlines()[1].split(" TL101 ", 1)[1],
    ]
    assert "\x1b" not in concise.stdout
    pylint = torchlint("-n", "-q", "--select", "TL101", "--output-format", "pylint", ".", cwd=tmp_path, text=True)
    assert len(pylint.stdout.splitlines()) == 2


# -- 18, 29: coding cookies -------------------------------------------------------------
ROT13 = b"# -*- coding: rot13 -*-\nx = 1\n"


@pytest.mark.parametrize("codec", ["rot13", "hex", "base64", "zlib_codec"])
def test_18_a_cookie_that_names_no_text_encoding_is_one_line(here, capsys, codec):
    (here / "a.py").write_bytes(b"# -*- coding: %s -*-\nx = 1\n" % codec.encode())
    (here / "b.py").write_text(SYNC)
    code, out, err = lint(capsys, "-n", "-q", "a.py", "b.py")
    assert code == 1 and err == ""
    assert out.splitlines()[0] == f"a.py:1:1: TL000 cannot decode file: encoding problem: {codec} is not a text encoding"
    assert "b.py:3:" in out


def test_18_stdin_with_a_rot13_cookie_is_one_line_and_fix_keeps_the_buffer(tmp_path):
    checked = torchlint("-", "--stdin-filename", "a.py", cwd=tmp_path, input=ROT13)
    assert checked.returncode == 1 and b"Traceback" not in checked.stderr
    assert b"a.py:1:1: TL000 cannot decode stdin: encoding problem: rot13 is not a text encoding" in checked.stdout
    fixed = torchlint("--fix", "--unsafe-fixes", "-", "--stdin-filename", "a.py", cwd=tmp_path, input=ROT13)
    assert fixed.stdout == ROT13 and b"Traceback" not in fixed.stderr


def test_29_flake8_and_the_cli_agree_on_a_wrong_coding_cookie(tmp_path):
    flake8 = shutil.which("flake8", path=os.path.dirname(sys.executable))
    if flake8 is None:
        pytest.skip("needs flake8")
    (tmp_path / "wrongdecl.py").write_bytes(b"# -*- coding: ascii -*-\n# caf\xc3\xa9\n" + SYNC.encode())
    (tmp_path / "klingon.py").write_bytes(b"# -*- coding: klingon -*-\n" + SYNC.encode())
    done = subprocess.run([flake8, "--select", "TL", "--isolated", "."], cwd=tmp_path, capture_output=True, text=True)
    found = sorted(line.split(": ", 1)[1].split(" ")[0] + " " + line.split(":")[0] for line in done.stdout.splitlines())
    assert found == ["TL000 ./klingon.py", "TL000 ./wrongdecl.py"], done.stdout + done.stderr
    cli = torchlint("-n", "-q", "--select", "TL", ".", cwd=tmp_path, text=True)
    assert sorted(line.split(": ")[1].split(" ")[0] + " ./" + line.split(":")[0] for line in cli.stdout.splitlines()) == found


# -- 19: the report's own output ----------------------------------------------------------
def test_19_a_closed_pipe_ends_quietly(tmp_path):
    for index in range(300):
        (tmp_path / f"m{index}.py").write_text(SYNC)
    done = subprocess.run(f"{sys.executable} -m torchlint --isolated --preview -n . | head -1 > /dev/null; "
                          "echo ${PIPESTATUS[0]}", shell=True, executable="/bin/bash", cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == "0" and done.stderr == ""


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_19_a_full_disk_under_the_report_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "m.py").write_text(SYNC)
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "torchlint", "--isolated", "--preview", "-n", "."], cwd=tmp_path,
                              stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == "torchlint: error: cannot write the report: No space left on device"
    done = torchlint("-n", "-o", "/dev/full", ".", cwd=tmp_path, text=True)
    assert done.returncode == 2
    assert done.stderr.strip() == "torchlint: error: /dev/full: cannot write the report: No space left on device"


# -- 22, 28: configuration ------------------------------------------------------------------
def test_22_a_broken_nested_config_costs_its_subtree_only(here, capsys):
    (here / "src").mkdir()
    (here / "src" / "train.py").write_text(SYNC)
    broken = here / "tests" / "fixtures" / "broken"
    broken.mkdir(parents=True)
    (broken / "case.py").write_text("x = 1\n")
    (broken / "pyproject.toml").write_text('[project\nname = "x"\n')
    capsys.readouterr()
    code = main(["--preview", "-n", "-q", "--jobs", "1", "."])
    out, err = capsys.readouterr()
    assert code == 2
    assert "src/train.py:3:11: TL101" in out
    [line] = err.splitlines()
    assert line.startswith(f"torchlint: error: {broken / 'pyproject.toml'}: invalid TOML: ")
    assert line.endswith("(1 file under it not linted)")


@pytest.mark.parametrize("written", ["2.10", "1.10", "2"])
def test_28_target_torch_as_a_toml_number_is_a_clear_error(here, capsys, written):
    (here / "a.py").write_text("x = 1\n")
    (here / "pyproject.toml").write_text(f"[tool.torchlint]\ntarget-torch = {written}\n")
    capsys.readouterr()
    assert main(["--show-settings", "a.py"]) == 2
    err = capsys.readouterr().err
    number = str(float(written)) if "." in written else written  # what TOML made of it
    assert err.endswith(f'pyproject.toml: target-torch: {number} is a TOML number, which cannot tell 2.1 from 2.10; '
                        'write the version as a string, e.g. target-torch = "2.10"\n')
    (here / "pyproject.toml").write_text('[tool.torchlint]\ntarget-torch = "2.10"\n')
    assert main(["--show-settings", "a.py"]) == 0
    assert '">=2.10 (from target-torch)"' in capsys.readouterr().out


# -- 24, 25, 27: messages -------------------------------------------------------------------
@pytest.mark.parametrize("findings, reason", [
    ('[{"path": "m.py", "line": 3}]', 'finding 0: no "kind"'),
    ("[3]", "finding 0: not an object (int)"),
    ('[{"kind": "sync", "count": "many"}]', 'finding 0: "count" is \'many\', not a whole number'),
])
def test_24_an_incomplete_runtime_report_is_one_line_naming_it(here, capsys, findings, reason):
    (here / "m.py").write_text(SYNC)
    (here / "r.json").write_text('{"tool": "torchlint-sanitizer", "version": 1, "findings": %s}' % findings)
    code, out, err = lint(capsys, "-n", "--runtime-report", "r.json", "m.py")
    assert code == 2 and err == f"torchlint: error: r.json: {reason}\n"


def test_25_an_unwritable_report_path_never_costs_the_scripts_exit_code(tmp_path):
    """A path that cannot be written only once the script has run: the script's
    exit status stays, one line of error, no traceback, no stray temporary file."""
    (tmp_path / "train.py").write_text('import sys\nprint("training done")\nsys.exit(3)\n')
    sanitize = [sys.executable, "-m", "torchlint.sanitizer"]
    for flag in ("--report-json", "--report-html"):
        done = subprocess.run([*sanitize, flag, "/proc/report.out", "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert done.returncode == 3 and "Traceback" not in done.stderr, done.stderr
        assert "training done" in done.stdout
        assert "python -m torchlint.sanitizer: error: /proc/report.out: cannot write it: No such file or directory" in done.stderr
    done = subprocess.run([*sanitize, "--report-json", str(tmp_path), "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "is a directory" in done.stderr  # known before the run: refused, the script never ran
    assert "training done" not in done.stdout
    assert not [name for name in os.listdir(tmp_path.parent) if ".tmp" in name]
    done = subprocess.run([*sanitize, "--report-json", "r.json", "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 3 and (tmp_path / "r.json").is_file()


@pytest.mark.skipif(shutil.which("git") is None or shutil.which("patch") is None, reason="needs git and patch")
@pytest.mark.parametrize("target", [".", "m.py", "./m.py"])
def test_27_diff_applies_with_git_and_patch_without_a_final_newline(tmp_path, target):
    source = "import torch\n\n\ndef run(model, x):\n    return model.forward(x)"  # no final newline
    for side in ("a", "b", "c"):
        (tmp_path / side).mkdir()
        (tmp_path / side / "m.py").write_text(source)
    diff = torchlint("-n", "--diff", "--unsafe-fixes", target, cwd=tmp_path / "a", text=True)
    assert diff.returncode == 1
    assert diff.stdout.startswith("--- a/m.py\n+++ b/m.py\n")
    (tmp_path / "fix.diff").write_text(diff.stdout)
    subprocess.run(["patch", "-p1", "-i", str(tmp_path / "fix.diff")], cwd=tmp_path / "b", check=True, capture_output=True)
    subprocess.run(["git", "apply", "-p1", str(tmp_path / "fix.diff")], cwd=tmp_path / "c", check=True, capture_output=True)
    torchlint("-n", "--fix", "--unsafe-fixes", "m.py", cwd=tmp_path / "a")
    expected = (tmp_path / "a" / "m.py").read_text()
    assert expected.endswith("return model(x)")
    assert (tmp_path / "b" / "m.py").read_text() == expected == (tmp_path / "c" / "m.py").read_text()


def test_26_a_notebook_named_explicitly_is_linted_like_its_code(tmp_path):
    source = ["import torch\n", "for x, y in loader:\n", "    loss = model(x.cuda()).sum()\n", "    print(loss.item())\n"]
    notebook = {"cells": [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": source}],
                "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (tmp_path / "train.ipynb").write_text(json.dumps(notebook))
    (tmp_path / "train.py").write_text("".join(source))
    as_notebook = torchlint("-n", "-q", "--select", "TL101", "train.ipynb", cwd=tmp_path, text=True)
    as_script = torchlint("-n", "-q", "--select", "TL101", "train.py", cwd=tmp_path, text=True)
    assert as_notebook.returncode == as_script.returncode == 1
    # the same finding, placed by cell in the notebook: train.ipynb:cell 1:4:… and train.py:4:…
    assert [line.split(" TL101 ")[0] for line in as_notebook.stdout.splitlines()] == [
        "train.ipynb:cell 1:" + line.split(" TL101 ")[0].split(":", 1)[1] for line in as_script.stdout.splitlines()
    ]
    assert len(as_script.stdout.splitlines()) == 1


def test_32_messages_say_which_python_judged_and_where_a_table_belongs(tmp_path):
    (tmp_path / "a.py").write_text("type Point = tuple[float, float]\n")  # PEP 695: Python 3.12 and newer
    result = torchlint("-n", "-q", "a.py", cwd=tmp_path, text=True)
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if sys.version_info < (3, 12):
        assert result.stdout == f"a.py:1:6: TL000 SyntaxError: invalid syntax (as Python {version} reads it)\n"
    else:
        assert result.stdout == ""
    (tmp_path / "torchlint.toml").write_text('[tool.torchlint]\nselect = ["ALL"]\n')
    result = torchlint("-n", "--config", "torchlint.toml", "a.py", cwd=tmp_path, text=True)
    assert result.returncode == 2
    assert result.stderr == ("torchlint: error: torchlint.toml: `[tool.torchlint]` is a pyproject.toml table; in this "
                             "file, write its keys at the top level (or name a pyproject.toml with --config)\n")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_31_no_worker_outlives_a_killed_run_on_the_report_file(tmp_path):
    """The report's file: a 1 MB expression (just under the 1 MiB guard) that
    held a worker in libcst's parse for 8-11 s after its parent was killed.
    The run (two such files, two jobs) is killed a second in, while it
    parses; within 5 s no process of the run is left."""
    for name in ("g.py", "h.py"):
        (tmp_path / name).write_text("import torch\nfor x, y in loader:\n    v = f(" + ",".join(["x.item()"] * 116000) + ")\n")
    run = subprocess.Popen([sys.executable, "-m", "torchlint", "--isolated", "-n", "-j", "2", "-q", "g.py", "h.py"], cwd=tmp_path,
                           start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    if run.poll() is None:
        os.kill(run.pid, 9)
    run.wait(timeout=30)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and group_alive(run.pid):
        time.sleep(0.1)
    assert not group_alive(run.pid), "a worker outlived the killed run"

