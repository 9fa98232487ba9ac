"""The script runner: __main__ semantics, exit codes, --strict, the report; no CUDA needed."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from san_sync_helpers import write_distribution

pytest.importorskip("torch")


def run(args, cwd, force=False):
    env = dict(os.environ)
    env.pop("TORCHLINT_SANITIZER_FORCE", None)
    if force:
        env["TORCHLINT_SANITIZER_FORCE"] = "1"
    return subprocess.run([sys.executable, "-m", "torchlint.sanitizer", *args], capture_output=True, text=True,
                          cwd=cwd, env=env)


@pytest.fixture
def scripts(tmp_path):
    (tmp_path / "helper.py").write_text("VALUE = 42\n")
    write_distribution(tmp_path / "site-packages", "fakecuda")  # installed: metadata, not the folder name
    (tmp_path / "show.py").write_text(textwrap.dedent("""
        import json, sys
        import helper
        print(json.dumps({"argv": sys.argv, "name": __name__, "path0": sys.path[0], "value": helper.VALUE}))
        if __name__ == "__main__":
            sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 0)
    """))
    (tmp_path / "boom.py").write_text("def inner():\n    raise ValueError('kaboom')\n\ninner()\n")
    (tmp_path / "message.py").write_text("import sys\nsys.exit('bad input')\n")
    (tmp_path / "syncing.py").write_text(textwrap.dedent("""
        import os, sys
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "site-packages"))
        import fakecuda
        for _ in range(6):  # a repeated site (a one-off sync is info only)
            fakecuda.read_back(1)  # SYNC
    """))
    return tmp_path


def test_script_runs_as_main_with_its_argv_and_folder(scripts):
    done = run(["show.py", "x", "--flag", "-v"], cwd=scripts)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout.splitlines()[0])
    assert data == {"argv": ["show.py", "x", "--flag", "-v"], "name": "__main__", "path0": str(scripts), "value": 42}
    assert "no CUDA device: GPU sanitizer inactive" in done.stderr


def test_runner_options_before_the_script_are_the_runner_s(scripts):
    done = run(["--checks", "sync", "--warmup-steps", "0", str(scripts / "show.py"), "--checks", "x"], cwd="/")
    data = json.loads(done.stdout.splitlines()[0])
    assert data["argv"][1:] == ["--checks", "x"] and data["path0"] == str(scripts)


def test_exit_codes_are_the_script_s(scripts):
    assert run(["show.py", "7"], cwd=scripts).returncode == 7
    boom = run(["boom.py"], cwd=scripts)
    assert boom.returncode == 1
    assert "ValueError: kaboom" in boom.stderr and 'boom.py", line 2, in inner' in boom.stderr
    assert "runpy" not in boom.stderr  # the traceback starts at the script, as under python script.py
    message = run(["message.py"], cwd=scripts)
    assert message.returncode == 1 and "bad input" in message.stderr


def test_strict_exits_3_on_failing_findings_and_writes_the_report(scripts):
    done = run(["--checks", "sync", "--strict", "--report-json", "out/r.json", "syncing.py"], cwd=scripts, force=True)
    assert done.returncode == 3, done.stderr
    assert "syncing.py:6: sync other x6, stall not timed" in done.stderr
    report = json.loads((scripts / "out" / "r.json").read_text())
    assert report["version"] == 1 and report["steps"]["source"] == "none"
    [finding] = report["findings"]
    assert finding["line"] == 6 and finding["count"] == 6 and finding["file"].endswith("syncing.py")


def test_without_strict_findings_do_not_change_the_exit_code(scripts):
    assert run(["--checks", "sync", "syncing.py"], cwd=scripts, force=True).returncode == 0
    narrowed = run(["--checks", "sync", "--strict", "--fail-on", "race", "syncing.py"], cwd=scripts, force=True)
    assert narrowed.returncode == 0


def test_strict_keeps_a_failing_script_s_own_code(scripts):
    assert run(["--checks", "sync", "--strict", "show.py", "5"], cwd=scripts, force=True).returncode == 5


def test_usage_errors_exit_2(scripts):
    bad_checks = run(["--checks", "speed", "show.py"], cwd=scripts)
    assert bad_checks.returncode == 2 and "valid checks: sync, memory, race" in bad_checks.stderr
    missing = run(["nope.py"], cwd=scripts)
    assert missing.returncode == 2 and "nope.py: no such file" in missing.stderr


def test_console_script_is_the_same_runner(scripts):
    exe = os.path.join(os.path.dirname(sys.executable), "torchlint-sanitize")
    if not os.path.exists(exe):
        pytest.skip("console script not installed")
    done = subprocess.run([exe, "show.py", "4"], capture_output=True, text=True, cwd=scripts)
    assert done.returncode == 4 and "torchlint-sanitize: no CUDA device" in done.stderr


@pytest.mark.parametrize("ending", ["", "raise SystemExit(4)", "raise ValueError('late')"])
def test_the_program_end_hook_sees_the_scripts_objects_alive(tmp_path, ending):
    """The runner looks at live state before the script's globals are torn down, however it ends."""
    import gc

    from torchlint.sanitizer.runner import run_script

    (tmp_path / "keeps.py").write_text(
        "class Held:\n    pass\n\nheld = Held()\nimport builtins\nbuiltins._torchlint_probe = __import__('weakref').ref(held)\n"
        + ending + "\n"
    )
    import builtins

    seen = []

    def at_end():
        gc.collect()
        seen.append(builtins._torchlint_probe() is not None)

    try:
        code = run_script(str(tmp_path / "keeps.py"), [], at_end=at_end)
        gc.collect()
        alive_after = builtins._torchlint_probe() is not None
    finally:
        del builtins._torchlint_probe
    assert seen == [True]
    assert code == {"": 0, "raise SystemExit(4)": 4, "raise ValueError('late')": 1}[ending]
    assert not alive_after


def test_a_top_level_loop_of_synchronize_is_found_with_every_check_on(tmp_path):
    """Module-level code, no function, no optimizer: the way tutorials and notebooks are written.

    The race check wraps torch.cuda.synchronize after the sync check (it records
    host syncs before it activates); its wrapper once made every explicit
    synchronize look like torchlint's own, and the run reported nothing.
    """
    (tmp_path / "loop.py").write_text(textwrap.dedent("""
        import torch
        x = torch.ones(4)
        for i in range(40):
            y = x * 2
            torch.cuda.synchronize()  # SYNC
        print("done")
    """))
    # No GPU here: torch.cuda.synchronize becomes a no-op before the checks wrap it.
    launcher = ("import sys, torch\n"
                "torch.cuda.synchronize = lambda *args, **kwargs: None\n"
                "from torchlint.sanitizer.runner import main\n"
                "sys.exit(main(sys.argv[1:]))\n")
    env = dict(os.environ, TORCHLINT_SANITIZER_FORCE="1")
    done = subprocess.run([sys.executable, "-c", launcher, "--report-json", "r.json", "loop.py"],
                          capture_output=True, text=True, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["checks"] == ["memory", "race", "sync"]
    [finding] = [f for f in report["findings"] if f["kind"] == "sync"]
    assert (finding["line"], finding["count"], finding["rule"]) == (6, 40, "TL102")
    assert finding["details"]["sync_kind"] == "synchronize" and finding["severity"] == "warning"
    assert "internal error" not in done.stderr


def test_without_cuda_every_report_says_nothing_was_checked(scripts):
    """One clear line, never "no findings"; --report-json, --report-html and --trace still written."""
    done = run(["--report-json", "r.json", "--report-html", "r.html", "--trace", "t.json", "show.py", "3"],
               cwd=scripts)
    assert done.returncode == 3
    inactive = [line for line in done.stderr.splitlines() if "no CUDA device" in line]
    assert inactive == ["python -m torchlint.sanitizer: no CUDA device: GPU sanitizer inactive: nothing is checked; "
                        "the script runs as it would without it"]
    assert "no findings" not in done.stderr
    report = json.loads((scripts / "r.json").read_text())
    assert report["inactive"] == "no CUDA device" and report["findings"] == []
    page = (scripts / "r.html").read_text()
    assert "Nothing was checked: the GPU sanitizer was inactive (no CUDA device)" in page
    assert ">no findings<" not in page
    trace = json.loads((scripts / "t.json").read_text())
    assert any("nothing was checked" in event["name"] for event in trace["traceEvents"])


def test_a_report_path_that_cannot_be_written_is_refused_before_the_script_runs(scripts):
    (scripts / "folder").mkdir()
    done = run(["--report-json", "folder", "show.py", "3"], cwd=scripts)
    assert done.returncode == 2 and done.stdout == ""  # the script never ran
    assert done.stderr.strip().splitlines()[-1] == "python -m torchlint.sanitizer: error: --report-json folder: is a directory"
    (scripts / "blocker").write_text("a file where a folder should be\n")
    done = run(["--report-html", "blocker/r.html", "show.py"], cwd=scripts)
    assert done.returncode == 2 and "--report-html blocker/r.html: " in done.stderr and "is not a directory" in done.stderr


def test_a_report_that_fails_to_write_after_the_run_keeps_the_scripts_exit_code_and_leaves_no_temporary(
        scripts, monkeypatch):
    """The folder is taken away while the script runs: one line of error, exit 3 stays, no PATH.tmpPID."""
    (scripts / "out").mkdir()
    (scripts / "vanish.py").write_text("import shutil, sys\nshutil.rmtree('out')\nopen('out', 'w').close()\nsys.exit(3)\n")
    done = run(["--report-json", "out/r.json", "--report-html", "out/r.html", "vanish.py"], cwd=scripts)
    assert done.returncode == 3
    errors = [line for line in done.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 2 and all("cannot write it" in line for line in errors), done.stderr
    assert "Traceback" not in done.stderr
    assert not [path for path in os.listdir(scripts) if ".tmp" in path]
