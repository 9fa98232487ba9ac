"""torchlint and pytest installed with ``pip install --target`` into a folder not named
site-packages: the finding still lands on the test's own line.

On CPU the syncs come from the sanitizer's CPU-testable paths: a library
installed in the same folder raises torch's sync warning (what the warning
hook sees on a GPU), and ``torch.cuda.empty_cache()`` goes through its real
timed wrapper. The GPU variant (tests/sanitizer/gpu/test_san_gpu_sync.py)
does the same with real ``.item()`` reads.
"""
import json
import sys
import textwrap

import pytest

pytest.importorskip("torch")

from san_sync_helpers import line_of, write_distribution  # noqa: E402
from target_install import install_target, run_pytest_from  # noqa: E402

TEST_SOURCE = textwrap.dedent("""
    import sys
    import _pytest
    import fakecuda
    import torch
    import torchlint

    def test_where_things_come_from():
        print("IMPORTED", _pytest.__file__, torchlint.__file__)

    def test_syncs_in_a_loop():
        for _ in range(6):
            fakecuda.read_back(1)  # LIBRARY_SYNC
        for _ in range(6):
            torch.cuda.empty_cache()  # EMPTY_CACHE
""")


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("target-install")


@pytest.mark.parametrize("inside_project", [True, False], ids=["target-in-project", "target-elsewhere"])
def test_a_target_install_attributes_to_the_test_line(scratch, tmp_path, inside_project):
    project = tmp_path / "project"
    project.mkdir()
    (project / "pytest.ini").write_text("[pytest]\n")
    target = install_target((project if inside_project else tmp_path) / "_vendor", scratch)
    assert target.name != "site-packages" and not (target / "site-packages").exists()
    write_distribution(target, "fakecuda")
    test_file = project / "test_target.py"
    test_file.write_text(TEST_SOURCE)
    done = run_pytest_from(target, project, "-s", "--gpu-sanitize", "--gpu-sanitize-checks=sync",
                           "--gpu-sanitize-report=run.json", "test_target.py")
    assert done.returncode == 0, done.stdout + done.stderr
    [imported] = [line.split("IMPORTED ")[1].split()[:2] for line in done.stdout.splitlines() if "IMPORTED " in line]
    assert all(path.startswith(str(target)) for path in imported), imported  # pytest and torchlint: the target's
    report = json.loads((project / "run.json").read_text())
    sites = {(f["file"], f["line"]): f for f in report["findings"]}
    for marker, kind, rule in (("# LIBRARY_SYNC", "other", None), ("# EMPTY_CACHE", "empty-cache", "TL303")):
        finding = sites.pop((str(test_file), line_of(test_file, marker)))
        assert finding["details"]["sync_kind"] == kind and finding["rule"] == rule
        assert finding["count"] == 6 and finding["details"]["repeated"] is True
        assert finding["details"]["user_frame"] is True and finding["function"] == "test_syncs_in_a_loop"
    assert sites == {}  # nothing landed on pytest's or torchlint's frames
    assert "_pytest" not in done.stdout.split("= gpu-sanitize =")[1]
    assert sys.modules.get("_pytest")  # (this process's pytest is untouched)
