"""``pytest -n 2 --gpu-sanitize`` on a machine with two GPUs: each xdist worker runs on its own GPU."""
import textwrap

import pytest

torch = pytest.importorskip("torch")

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.gpu


def test_each_xdist_worker_runs_on_its_own_real_gpu(pytester):
    pytest.importorskip("xdist")
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    pytester.makepyfile(test_where=textwrap.dedent("""
        import os, time, torch, pytest

        @pytest.mark.parametrize("n", range(8))
        def test_where(n):
            time.sleep(0.2)  # both workers get tests
            torch.ones(1 << 20, device="cuda").sum().item()
            props = torch.cuda.get_device_properties(torch.cuda.current_device())
            identity = str(getattr(props, "uuid", "") or getattr(props, "pci_bus_id", ""))
            with open(f"seen-{os.environ['PYTEST_XDIST_WORKER']}.txt", "w") as handle:
                handle.write(f"{torch.cuda.device_count()} {identity}")
    """))
    result = pytester.runpytest_subprocess("-n", "2", "--gpu-sanitize", "--gpu-sanitize-checks=sync,memory")
    result.assert_outcomes(passed=8)
    seen = {path.stem: path.read_text().split(" ", 1) for path in pytester.path.glob("seen-*.txt")}
    assert len(seen) == 2, seen
    assert all(count == "1" for count, _ in seen.values()), seen  # each worker sees only its own GPU
    identities = {identity for _, identity in seen.values()}
    assert len(identities) == 2 and "" not in identities, seen  # and the two are different GPUs
