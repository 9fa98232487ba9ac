"""Run real training scripts of the development corpus under ``torchlint-sanitize``, with synthetic data.

    python bench/real_scripts/run.py --corpus PATH --out DIR [--only NAME,...] [--cpu] [--force] [--list]

Issue #32 asks that the sanitizer be judged on scripts nobody on the project
wrote. Each recipe below names a script of ``/work/shared/corpus`` (read from
``--corpus``; nothing is copied into this repository), the arguments that
make a short run of it, and the synthetic data that replaces its download.
For each recipe the driver:

1. copies the script's folder into ``DIR/work/NAME/run/here`` and runs there
   (two levels deep, so that the scripts' ``../../data`` stays inside the
   work folder), writing what the recipe needs beside it (a text corpus, GPT-2
   token shards in llm.c's format);
2. runs ``python -m torchlint.sanitizer --report-json DIR/NAME.json
   --report-html DIR/NAME.html --trace DIR/NAME.trace.json SCRIPT ARGS`` with
   ``bench/real_scripts/synthetic`` on ``PYTHONPATH``: its ``sitecustomize``
   replaces the datasets (torchvision's, tiktoken's encoding, PyG's
   Planetoid) and caps the optimizer steps, so the script itself runs
   unchanged;
3. keeps the run's output in ``DIR/NAME.log``, and at the end writes
   ``DIR/summary.md``: per script its kind, exit status, time, steps and each
   finding on one line (place, kind, cadence, cost, rule), for judging each
   one by reading the script (``/work/shared/reference/judging.md``).

``--cpu`` runs the CPU variant of each recipe (smaller models, ``--device
cpu`` where the script has it, no compilation) to check that the recipes
start and step on a machine without a GPU; ``--force`` then starts the checks
anyway (``TORCHLINT_SANITIZER_FORCE=1``). No recipe needs the network: the
GPU machine has none.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

GPT2_SHAPE = ["--model", "d12", "--batch_size", "8", "--sequence_length", "256", "--total_batch_size", "4096",
              "--num_iterations", "60", "--val_loss_every", "20", "--val_max_steps", "8", "--sample_every", "0",
              "--write_tensors", "0", "--overfit_single_batch", "0", "--dtype", "bfloat16", "--tensorcores", "1",
              "--input_bin", "train_000.bin", "--input_val_bin", "val_000.bin"]
GPT2_CPU = ["--model", "d12", "--batch_size", "2", "--sequence_length", "32", "--total_batch_size", "128",
            "--num_iterations", "3", "--val_loss_every", "2", "--val_max_steps", "2", "--sample_every", "0",
            "--write_tensors", "0", "--overfit_single_batch", "0", "--dtype", "float32", "--device", "cpu",
            "--compile", "0", "--input_bin", "train_000.bin", "--input_val_bin", "val_000.bin"]


@dataclass
class Recipe:
    """One real script, made short and self-contained."""

    kind: str
    project: str  # the corpus folder
    folder: str  # copied into the run folder, contents only
    script: str  # inside ``folder``
    args: List[str] = field(default_factory=list)
    cpu_args: Optional[List[str]] = None  # --cpu: these instead of ``args``
    spec: Dict[str, object] = field(default_factory=dict)  # for synthetic/sitecustomize.py
    cpu_spec: Dict[str, object] = field(default_factory=dict)  # --cpu: merged over ``spec``
    text_corpus: Optional[str] = None  # a file of random words to write, relative to the run folder
    token_shards: bool = False  # train_000.bin / val_000.bin in llm.c's format
    timeout_s: int = 600


MNIST = {"size": 28, "channels": 1, "classes": 10}
RECIPES: Dict[str, Recipe] = {
    "cnn-tutorial": Recipe(
        kind="vision, a tutorial's top-level loop (yunjey/pytorch-tutorial CNN on MNIST)",
        project="yunjey+pytorch-tutorial", folder="tutorials/02-intermediate/convolutional_neural_network",
        script="main.py",
        # 100 batches an epoch, so its `(i+1) % 100` log fires once an epoch; 20 evaluation batches.
        spec={"datasets": {"MNIST": dict(MNIST, train=10000, test=2000)}, "max_steps": 600},
        cpu_spec={"datasets": {"MNIST": dict(MNIST, train=1000, test=300)}, "max_steps": 30},
    ),
    "lm-tutorial": Recipe(
        kind="language model (LSTM), a tutorial's top-level loop (yunjey/pytorch-tutorial)",
        project="yunjey+pytorch-tutorial", folder="tutorials/02-intermediate/language_model", script="main.py",
        text_corpus="data/train.txt", spec={"words": 60000, "max_steps": 600},
        cpu_spec={"words": 6000, "max_steps": 20},
    ),
    "dcgan": Recipe(
        kind="GAN (eriklindernoren/PyTorch-GAN DCGAN on MNIST)",
        project="eriklindernoren+PyTorch-GAN", folder="implementations/dcgan", script="dcgan.py",
        args=["--n_epochs", "3", "--batch_size", "64", "--sample_interval", "25", "--n_cpu", "0"],
        spec={"datasets": {"MNIST": dict(MNIST, train=64 * 30)}, "max_steps": 200},
        cpu_spec={"datasets": {"MNIST": dict(MNIST, train=64 * 4)}, "max_steps": 8},
    ),
    "resnet-tutorial": Recipe(
        kind="vision, a tutorial's top-level loop with an evaluation pass (yunjey/pytorch-tutorial ResNet on CIFAR-10)",
        project="yunjey+pytorch-tutorial", folder="tutorials/02-intermediate/deep_residual_network",
        script="main.py",
        # 80 epochs are fixed in the script: 10 batches an epoch, so its learning-rate decay (every 20 epochs)
        # and its evaluation (10 batches) both run; its `(i+1) % 100` log never does.
        spec={"datasets": {"CIFAR10": {"size": 32, "channels": 3, "classes": 10, "train": 1000, "test": 1000}},
              "max_steps": 1000},
        cpu_spec={"datasets": {"CIFAR10": {"size": 32, "channels": 3, "classes": 10, "train": 100, "test": 100}},
                  "max_steps": 20},
    ),
    "wgan-gp": Recipe(
        kind="GAN with a gradient penalty, critic stepped 5 times per generator step (PyTorch-GAN WGAN-GP on MNIST)",
        project="eriklindernoren+PyTorch-GAN", folder="implementations/wgan_gp", script="wgan_gp.py",
        args=["--n_epochs", "4", "--batch_size", "64", "--sample_interval", "50", "--n_cpu", "0"],
        spec={"datasets": {"MNIST": dict(MNIST, train=64 * 50)}, "max_steps": 400},
        cpu_spec={"datasets": {"MNIST": dict(MNIST, train=64 * 4)}, "max_steps": 8},
    ),
    "gpt2-eager": Recipe(
        kind="language model (karpathy/llm.c GPT-2 124M reference, eager, bf16 autocast)",
        project="karpathy+llm.c", folder=".", script="train_gpt2.py",
        args=GPT2_SHAPE + ["--compile", "0"], cpu_args=GPT2_CPU,
        token_shards=True, spec={"tiktoken": True, "max_steps": 100},
    ),
    "gpt2-compiled": Recipe(
        kind="language model, compiled (llm.c GPT-2 124M, torch.compile with coordinate-descent tuning)",
        project="karpathy+llm.c", folder=".", script="train_gpt2.py",
        args=GPT2_SHAPE + ["--compile", "1"], cpu_args=GPT2_CPU,
        token_shards=True, spec={"tiktoken": True, "max_steps": 100}, timeout_s=900,
    ),
    "gcn": Recipe(
        kind="graph (pyg-team/pytorch_geometric GCN on a Cora-sized synthetic graph)",
        project="pyg-team+pytorch_geometric", folder="examples", script="gcn.py", args=["--epochs", "100"],
        cpu_args=["--epochs", "5"],
        spec={"planetoid": {"nodes": 2708, "edges": 10556, "features": 1433, "classes": 7}, "max_steps": 200},
    ),
}


def _write_text_corpus(path: str, words: int) -> None:
    vocabulary = [f"w{index}" for index in range(2000)]
    rng = random.Random(0)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        for start in range(0, words, 20):
            handle.write(" ".join(rng.choice(vocabulary) for _ in range(20)) + "\n")


def _write_token_shard(path: str, tokens: int, seed: int) -> None:
    """A shard as llm.c's data loaders write it: a 256-int32 header (magic 20240520, version 1, count), uint16 tokens."""
    rng = random.Random(seed)
    header = [20240520, 1, tokens] + [0] * 253
    with open(path, "wb") as handle:
        handle.write(struct.pack("<256i", *header))
        handle.write(struct.pack(f"<{tokens}H", *(rng.randrange(50257) for _ in range(tokens))))


def _prepare(recipe: Recipe, corpus: str, run_dir: str, cpu: bool) -> Dict[str, object]:
    source = os.path.join(corpus, recipe.project, recipe.folder)
    if not os.path.isdir(source):
        raise FileNotFoundError(f"{source}: not in the corpus (copy {recipe.project} next to the repository)")
    if os.path.isdir(run_dir):
        shutil.rmtree(run_dir)
    shutil.copytree(source, run_dir)
    spec = dict(recipe.spec, **(recipe.cpu_spec if cpu else {}))
    if recipe.text_corpus:
        _write_text_corpus(os.path.join(run_dir, recipe.text_corpus), int(spec.pop("words")))
    if recipe.token_shards:
        _write_token_shard(os.path.join(run_dir, "train_000.bin"), 400_000 if not cpu else 20_000, seed=0)
        _write_token_shard(os.path.join(run_dir, "val_000.bin"), 100_000 if not cpu else 5_000, seed=1)
    return spec


def run_recipe(name: str, recipe: Recipe, corpus: str, out: str, cpu: bool, force: bool) -> Dict[str, object]:
    run_dir = os.path.join(out, "work", name, "run", "here")
    spec = _prepare(recipe, os.path.abspath(corpus), run_dir, cpu)
    outputs = {"json": os.path.join(out, f"{name}.json"), "html": os.path.join(out, f"{name}.html"),
               "trace": os.path.join(out, f"{name}.trace.json"), "log": os.path.join(out, f"{name}.log")}
    args = recipe.cpu_args if cpu and recipe.cpu_args is not None else recipe.args
    command = [sys.executable, "-m", "torchlint.sanitizer", "--report-json", outputs["json"],
               "--report-html", outputs["html"], "--trace", outputs["trace"], recipe.script, *args]
    env = dict(os.environ, TORCHLINT_REAL_SCRIPT_SPEC=json.dumps(spec), PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(filter(None, [os.path.join(HERE, "synthetic"), ROOT,
                                                        os.environ.get("PYTHONPATH")])))
    if force:
        env["TORCHLINT_SANITIZER_FORCE"] = "1"
    started = time.time()
    with open(outputs["log"], "w") as log:
        log.write("$ " + " ".join(command) + f"\n  (in {run_dir})\n")
        log.flush()
        try:
            done = subprocess.run(command, cwd=run_dir, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=recipe.timeout_s)
            code: object = done.returncode
        except subprocess.TimeoutExpired:
            code = f"timeout after {recipe.timeout_s} s"
    return {"name": name, "kind": recipe.kind, "exit": code, "seconds": round(time.time() - started, 1),
            "outputs": outputs}


def _finding_line(finding: Dict[str, object]) -> str:
    details = finding.get("details") or {}
    where = f"{os.path.basename(finding['file'])}:{finding['line']}" if finding.get("file") else "<process>"
    what = f"sync {details.get('sync_kind')}" if finding["kind"] == "sync" else finding["kind"]
    cadence = details.get("cadence") or ""
    if cadence == "periodic":
        cadence = f"every {details.get('period_steps')} steps"
    stall = details.get("stall_ms")
    cost = f"{stall:.1f} ms" if isinstance(stall, (int, float)) else ""
    return (f"| {finding['severity']} | `{where}` | {what} | {cadence} | {finding.get('count')} | {cost} | "
            f"{finding.get('rule') or ''} | {finding['message'][:140]} |")


def write_summary(out: str, results: List[Dict[str, object]]) -> str:
    lines = ["# Real scripts under torchlint-sanitize", "",
             "Judge every finding by reading the script (`/work/shared/reference/judging.md`).", ""]
    for result in results:
        lines.append(f"## {result['name']}: {result['kind']}")
        lines.append(f"exit {result['exit']}, {result['seconds']} s; log `{os.path.basename(result['outputs']['log'])}`")
        path = result["outputs"]["json"]
        if not os.path.exists(path):
            lines += ["", "no report (see the log)", ""]
            continue
        with open(path) as handle:
            report = json.load(handle)
        steps = report.get("steps") or {}
        lines.append(f"steps: {steps.get('completed')} ({steps.get('warmup')} warm-up); "
                     f"device: {(report.get('device') or {}).get('name', 'none')}"
                     + (f"; INACTIVE: {report['inactive']}" if report.get("inactive") else ""))
        phases = (report.get("phases") or {}).get("phases") or []
        if phases:
            lines.append("phases: " + ", ".join(
                f"{p['phase']} {p['seconds']:.1f} s" + (f" ({p['utilization_mean_percent']:.0f}% busy)"
                                                       if p.get("utilization_mean_percent") is not None else "")
                for p in phases))
        lines += ["", "| severity | where | kind | cadence | count | host wait | rule | message |",
                  "|---|---|---|---|---|---|---|---|"]
        order = {"error": 0, "warning": 1, "info": 2}
        for finding in sorted(report["findings"], key=lambda f: (order.get(f["severity"], 3), f.get("file") or "",
                                                                f.get("line") or 0)):
            lines.append(_finding_line(finding))
        lines.append("")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out, "summary.md"), "w") as handle:
        handle.write(text)
    return text


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", required=True,
                        help="the development corpus: a folder per repository (/work/shared/corpus, or a copy)")
    parser.add_argument("--out", default="real-scripts", help="where the reports, logs and summary.md go")
    parser.add_argument("--only", default="", help="comma-separated recipe names (default: all)")
    parser.add_argument("--cpu", action="store_true", help="the CPU variant of each recipe (a dry run)")
    parser.add_argument("--force", action="store_true", help="start the checks without CUDA (TORCHLINT_SANITIZER_FORCE)")
    parser.add_argument("--list", action="store_true", help="list the recipes and exit")
    options = parser.parse_args(argv)
    if options.list:
        for name, recipe in RECIPES.items():
            print(f"{name:14} {recipe.kind}\n{'':14} {recipe.project}/{recipe.folder}/{recipe.script}")
        return 0
    names = [name for name in options.only.split(",") if name] or list(RECIPES)
    unknown = [name for name in names if name not in RECIPES]
    if unknown:
        parser.error(f"unknown recipe(s) {', '.join(unknown)}; known: {', '.join(RECIPES)}")
    os.makedirs(options.out, exist_ok=True)
    out = os.path.abspath(options.out)
    results = []
    for name in names:
        print(f"== {name}: {RECIPES[name].kind}", flush=True)
        try:
            result = run_recipe(name, RECIPES[name], options.corpus, out, options.cpu, options.force)
        except FileNotFoundError as error:
            print(f"   skipped: {error}", flush=True)
            continue
        print(f"   exit {result['exit']} in {result['seconds']} s", flush=True)
        results.append(result)
    print(write_summary(out, results))
    return 0 if all(result["exit"] == 0 for result in results) else 1


if __name__ == "__main__":
    sys.exit(main())
