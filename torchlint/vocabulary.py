"""Every name heuristic of the engine, in one place.

Where code says what a value is only by its name (``optimizer``,
``train_loader``, ``scaler``, ``device``), the engine and the rules ask
this module. Patterns that answer different questions keep different
names here (a variable that holds a device is not the same question as an
argument that names one), so a change to one is a change to every rule
that asks it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Optional, Tuple

import libcst as cst

from torchlint.names import last_name

if TYPE_CHECKING:  # pragma: no cover
    from torchlint.names import ImportTable

# Stands for "one element of an unpacked value" (``a, b = f()``): the name is
# known to be assigned, not to what. Compared by identity.
UNKNOWN_PART = cst.Name("__unpacked__")

# -- data -------------------------------------------------------------------------
# Names whose iteration yields batches (a loader passed in, ``self.train_loader``).
# Matched against the last identifier as a whole word part, so
# ``dispatch_batches_options`` is not one.
DATA_SOURCE_NAME = re.compile(
    r"(?i)(loader|loaders|(^|_)dl|(^|_)batches|batch_iter|data_?iter|prefetcher|batch_gen|dataiter|minibatches)$"
)
# Wrappers whose iteration hands out their first argument's items: a loop over
# one of them over a data source is a loop over the data source.
ITERATES_ARGUMENT = frozenset(
    {"enumerate", "tqdm", "iter", "islice", "zip", "progress", "track", "progress_bar", "chain"}
)
# The wrappers among those that keep each item whole (``zip`` and ``chain``
# mix items of several sources): a batch's provenance passes through them.
KEEPS_ITEMS = ("enumerate", "tqdm", "iter", "islice", "progress", "track")
# Calls that receive a loader but do not yield its batches when iterated.
NOT_BATCHES = frozenset({"range", "len", "trange", "sorted", "reversed", "print", "isinstance", "getattr", "hasattr"})
# Methods of a data source that hand out one batch per call
# (``x, y = train_loader.next_batch()``, a project's own loader class).
BATCH_PULL_METHODS = frozenset({"next_batch", "get_batch", "get_next_batch", "__next__"})
# Calls in a dataset's ``__getitem__`` that read, decode or transform a sample.
PER_ITEM_WORK = frozenset(
    {
        "open",
        "imread",
        "imdecode",
        "read_image",
        "decode_image",
        "decode_jpeg",
        "load",
        "loadtxt",
        "read_csv",
        "read_file",
        "transform",
        "transforms",
        "augment",
        "read",
        "fromfile",
        "memmap",
    }
)

# -- training -----------------------------------------------------------------------
OPTIMIZER_NAME = re.compile(r"(?i)(optim|opt$|^opt|optimizer)")
# A receiver named like this is a GradScaler even when its construction is out of sight.
SCALER_NAME = re.compile(r"(?i)(^|_)(grad_?|loss_?)?scaler(_[a-z0-9]+)?$")


def names_an_optimizer(name: Optional[str]) -> bool:
    return bool(name and OPTIMIZER_NAME.search(name) and "sched" not in name.lower())


def optimizer_receiver(receiver: cst.BaseExpression) -> bool:
    """Is ``receiver`` (``optimizer``, ``self.opt``, ``optimizers[i]``) an
    optimizer by its name? The one test every rule uses: a learning-rate
    scheduler's name often mentions its optimizer, and its ``step()`` trains nothing."""
    name = last_name(receiver.value if isinstance(receiver, cst.Subscript) else receiver)
    return names_an_optimizer(name)


def mentions_scaler(name: Optional[str]) -> bool:
    """A name that mentions a grad scaler (``self.grad_scaler_fp16``), not a scheduler."""
    return bool(name and "scaler" in name.lower() and "sched" not in name.lower())


def steps_optimizer(receiver: cst.BaseExpression) -> bool:
    """Is ``receiver`` an optimizer or a grad scaler (``opt.step()`` trains; a scheduler's does not)?"""
    if optimizer_receiver(receiver):
        return True
    return mentions_scaler(last_name(receiver.value if isinstance(receiver, cst.Subscript) else receiver))


def is_training_step_call(func: cst.Attribute) -> bool:
    """``loss.backward()``, ``optimizer.step()``, ``scaler.step(opt)``: the one
    test for "this call trains" (schedulers' ``step()`` does not count)."""
    attr = func.attr.value
    if attr == "backward":
        return True
    return attr == "step" and steps_optimizer(func.value)


# -- gradients and devices ------------------------------------------------------------
NO_GRAD_CONTEXTS = frozenset(
    {
        "torch.no_grad",
        "torch.inference_mode",
        "torch.autograd.no_grad",
        "torch.autograd.inference_mode",
        "torch.autograd.grad_mode.no_grad",
        "torch.autograd.grad_mode.inference_mode",
    }
)
SET_GRAD_ENABLED = frozenset(
    {"torch.set_grad_enabled", "torch.autograd.set_grad_enabled", "torch.autograd.grad_mode.set_grad_enabled"}
)
CUDA_AVAILABILITY = frozenset({"torch.cuda.is_available", "torch.cuda.device_count", "torch.cuda.is_initialized"})
# A variable that holds a device (``x.to(device)``, ``x.to(self.dev)``).
DEVICE_VARIABLE = re.compile(r"(?i)(^|_)(device|dev|devices|gpu|rank_device|target_device)$|^(cuda_)?device")
DTYPE_VARIABLE = re.compile(r"(?i)(dtype|precision)$")
# Code that places tensors on a device or trains (prose in docstrings rarely matches).
NAMES_A_DEVICE_OR_TRAINS = re.compile(
    r"\bcuda\b|\bdevice_map\b|\.to\(|\bdevice\s*=|\.(backward|step|prepare|setup)\(|\b(xpu|mps)\b"
)

# -- control flow ------------------------------------------------------------------------
# A guard named like one of these runs its body every N steps, not every step.
PERIODIC_NAME = re.compile(
    r"(?i)(every|interval|periodic|should_log|is_log|log_step|do_log|log_now|_freq|frequency|"
    r"should_save|should_eval|should_evaluate|do_eval)"
)
INDEX_NAME = re.compile(r"(?i)(step|idx|index|iter|batch|^i$|^j$|^it$|^n$)")
EXIT_CALLS = frozenset({"sys.exit", "exit", "quit", "os._exit"})
# Builtins whose calls are not calls of module functions.
BUILTIN_CALLS = frozenset(
    {
        "print",
        "len",
        "range",
        "isinstance",
        "getattr",
        "hasattr",
        "setattr",
        "int",
        "float",
        "str",
        "bool",
        "list",
        "dict",
        "tuple",
        "set",
        "enumerate",
        "zip",
        "super",
        "min",
        "max",
        "sum",
        "abs",
        "round",
        "sorted",
        "iter",
        "next",
        "type",
        "format",
        "open",
        "repr",
        "any",
        "all",
        "map",
        "filter",
    }
)

# -- framework trainers ------------------------------------------------------------------
# Trainers of training frameworks, by the qualified name of their constructor: the
# framework and the method that runs the training. The trainer builds the loaders from
# the arguments it is given, runs the loop, and places the model on the GPU when one is
# present (mmengine's ``Runner.wrap_model`` moves it to ``get_device()``; Lightning's
# ``accelerator="auto"``).
FRAMEWORK_TRAINERS = {
    "mmengine.runner.Runner": ("mmengine", "train"),
    "mmengine.runner.runner.Runner": ("mmengine", "train"),
    "mmengine.Runner": ("mmengine", "train"),
    "mmengine.runner.Runner.from_cfg": ("mmengine", "train"),
    "mmengine.runner.runner.Runner.from_cfg": ("mmengine", "train"),
    "lightning.Trainer": ("lightning", "fit"),
    "lightning.pytorch.Trainer": ("lightning", "fit"),
    "pytorch_lightning.Trainer": ("lightning", "fit"),
    # Hugging Face's Trainer (and TRL's, which derive from it) build the loader from ``args``
    "transformers.Trainer": ("transformers", "train"),
    "transformers.Seq2SeqTrainer": ("transformers", "train"),
    "transformers.trainer.Trainer": ("transformers", "train"),
    "trl.SFTTrainer": ("transformers", "train"),
    "composer.Trainer": ("composer", "fit"),
    "composer.trainer.Trainer": ("composer", "fit"),
    "composer.trainer.trainer.Trainer": ("composer", "fit"),
}
# Methods a training framework calls once per batch, for classes that derive
# from the framework's base: (framework, qualified-name prefixes of the base,
# the base's own name or None for any class under the prefix, the methods).
# ``training_step`` of a ``LightningModule`` runs for every batch the Trainer
# feeds; basicsr's trainer calls a model's ``feed_data`` and
# ``optimize_parameters`` on every iteration; mmengine calls a hook's
# ``*_iter`` methods around every iteration.
FRAMEWORK_STEP_METHODS = (
    (
        "Lightning",
        ("lightning.", "pytorch_lightning."),
        "LightningModule",
        frozenset({"training_step", "validation_step", "test_step", "predict_step"}),
    ),
    ("basicsr", ("basicsr.models.",), None, frozenset({"feed_data", "optimize_parameters"})),
    (
        "Hugging Face's Trainer",
        ("transformers.Trainer", "transformers.Seq2SeqTrainer", "transformers.trainer.Trainer", "trl."),
        None,
        frozenset({"compute_loss", "training_step", "prediction_step"}),
    ),
    (
        "mmengine",
        ("mmengine.hooks.", "mmengine.Hook"),
        "Hook",
        frozenset({"before_train_iter", "after_train_iter", "before_val_iter", "after_val_iter", "after_test_iter"}),
    ),
)


def framework_of_base(qualified: str) -> Optional[Tuple[str, frozenset]]:
    """(framework, its per-batch methods) when a class deriving from
    ``qualified`` is one a training framework drives, else None."""
    for framework, prefixes, base, methods in FRAMEWORK_STEP_METHODS:
        if qualified.startswith(prefixes) and (base is None or qualified.rsplit(".", 1)[-1] == base):
            return framework, methods
    return None


# Imported names that are never a project's own functions (the collector does not
# record calls of them as calls another file of the project may define).
LIBRARY_MODULES = ("torch.", "numpy.", "math.", "os.", "sys.", "time.", "random.", "json.", "logging.", "functools.")
# Keywords of a framework trainer that take a loader configuration it builds a DataLoader from.
FRAMEWORK_LOADER_KEYWORDS = {"mmengine": ("train_dataloader",)}
# Trainers configured through an arguments object (Hugging Face's
# ``TrainingArguments``, TRL's ``SFTConfig``): where the constructor takes it,
# as (keyword, position). The collector resolves it (``TrainerRun.arguments``).
FRAMEWORK_ARGUMENTS = {"transformers": ("args", 1)}
# Frameworks that take the training loader's settings from that arguments
# object: the workers setting in it, and the trainer's parameter for the
# training dataset (keyword, position).
FRAMEWORK_LOADER_ARGUMENTS = {"transformers": ("dataloader_num_workers", ("train_dataset", 3))}
# Frameworks handed a DataLoader built by the script, to train with: where it
# is passed, as (keyword, position) of the trainer's constructor and of the call
# that runs it (a position of None: by keyword only).
FRAMEWORK_TRAINING_LOADERS = {
    "composer": (("train_dataloader", 1), ("train_dataloader", None)),
    "lightning": (("train_dataloaders", None), ("train_dataloaders", 1)),
}
# Optimizer wrappers and precision settings that turn on mixed precision in a framework.
FRAMEWORK_AMP_WRAPPERS = frozenset({"AmpOptimWrapper"})
MIXED_PRECISION_VALUES = frozenset({"fp16", "bf16", "16", "16-mixed", "bf16-mixed"})


def torch_alias(names: "ImportTable") -> Optional[str]:
    """The local name bound to the ``torch`` package itself (``torch``, ``T``), if any."""
    for local, full in names.aliases.items():
        if full == "torch" and "." not in local:
            return local
    return None
