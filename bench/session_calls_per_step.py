"""Python calls into torchlint per training step under a sanitizer session, by function (CPU, no GPU needed).

    python bench/session_calls_per_step.py [--checks sync,memory] [--steps 200]

The session is forced on without CUDA (``TORCHLINT_SANITIZER_FORCE=1``), so
only the per-step hooks run; the periodic work of a GPU run (memory samples,
NVML) is not counted. A count is deterministic, which makes it the way to
tell whether a change added per-step work when timed windows on a shared
GPU are too noisy to say: install two commits side by side (``pip install
--no-deps --target DIR CHECKOUT``) and run this with each on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checks", default="sync,memory", help="comma-separated checks (default: sync,memory)")
    parser.add_argument("--steps", type=int, default=200, help="steps counted, after 100 unmeasured ones")
    options = parser.parse_args(argv)
    os.environ["TORCHLINT_SANITIZER_FORCE"] = "1"
    import torch

    from torchlint.sanitizer import SanitizerSession

    layers: list = []
    for _ in range(4):
        layers += [torch.nn.Linear(32, 32), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    inputs = torch.randn(8, 32)

    def step() -> None:
        loss = model(inputs).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    session = SanitizerSession(checks=tuple(options.checks.split(",")))
    session.start()
    for _ in range(100):
        step()
    counts: collections.Counter = collections.Counter()

    def profile(frame, event, arg):  # noqa: ARG001 (sys.setprofile's signature)
        module = frame.f_globals.get("__name__", "")
        if event == "call" and module.startswith("torchlint."):
            counts[f"{module}:{frame.f_code.co_name}"] += 1

    sys.setprofile(profile)
    for _ in range(options.steps):
        step()
    sys.setprofile(None)
    session.stop()
    print(f"checks {options.checks}: {sum(counts.values()) / options.steps:.1f} calls into torchlint per step")
    for name, count in counts.most_common(25):
        print(f"  {count / options.steps:7.2f}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
