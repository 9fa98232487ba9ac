"""The model of a file: the one module rules import from the engine.

A rule receives a ``FileModel`` (``self.ctx``) and asks it, and the helpers
named here, what the code means: what a name resolves to, whether a value is
a tensor and where it lives, whether data is batch data and from which
loader, whether a node runs once per batch (``FileModel.site()`` then
``Site.batch_context()``), what the project supports. The facts behind the
answers are recorded by ``torchlint.collector`` during the walk; answers that
depend on module-wide facts are exact once the walk is over (``finish()``).
Every name heuristic lives in ``torchlint.vocabulary``, re-exported here.
A test fails when a rule imports any other engine module (``torchlint.rule``
excepted: the Rule and Evidence base).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Set, Tuple

import libcst as cst

from torchlint.amp import (
    autocast_dtype,
    enabled,
    enclosing_autocast,
    is_autocast_call,
    is_grad_scaler_call,
    scaled_backward,
    scaler_call,
    tensor_backward,
)
from torchlint.analysis import (
    Site,
    branch_taken_on_cuda,
    conv_dims,
    exclusive_branches,
    framework_training_run,
    framework_training_runs,
    is_no_grad_decorated,
    is_periodic_test,
    loop_trains,
    mentions_cuda_availability,
    module_mode_call,
    outermost_loop_in_function,
    per_batch_anchor,
    training_entry_loop,
)
from torchlint.batches import BatchFlow, Origin
from torchlint.facts import (
    FunctionInfo,
    LoaderInfo,
    LoopInfo,
    ModuleFacts,
    TrainerRun,
    does_per_item_work,
    is_dataloader_call,
    keyword,
    keyword_value,
    literal_bool,
    positional,
    uses_default_collate,
)
from torchlint.names import ImportTable, dotted_name, last_name
from torchlint.project import EXPLICIT as EXPLICIT_TARGET
from torchlint.project import ProjectFacts, TorchRange, lower_ceiling, requires_cuda
from torchlint.rule import Edit, Evidence, Fix
from torchlint.tensors import (
    SYNCHRONIZE_CALLS,
    already_on_host,
    device_move,
    device_placement,
    is_module_base,
    launches_device_work,
    lives_on_host,
    module_evidence,
    names_a_module,
    reads_host,
    requires_grad_evidence,
    tensor_evidence,
    tensor_type_device,
)
from torchlint.tree import child_nodes, iter_subtree
from torchlint.vocabulary import (
    FRAMEWORK_AMP_WRAPPERS,
    FRAMEWORK_LOADER_ARGUMENTS,
    FRAMEWORK_LOADER_KEYWORDS,
    FRAMEWORK_TRAINING_LOADERS,
    MIXED_PRECISION_VALUES,
    NAMES_A_DEVICE_OR_TRAINS,
    NO_GRAD_CONTEXTS,
    PER_ITEM_WORK,
    SCALER_NAME,
    SET_GRAD_ENABLED,
    UNKNOWN_PART,
    names_an_optimizer,
    optimizer_receiver,
    steps_optimizer,
    torch_alias,
)

if TYPE_CHECKING:  # pragma: no cover
    from torchlint.crossfile import ProjectAnalysis
    from torchlint.rule import Rule

__all__ = [
    "branch_taken_on_cuda",
    "framework_run_evidence",
    "training_loop_evidence",
    "per_batch_evidence",
    "FRAMEWORK_AMP_WRAPPERS",
    "FRAMEWORK_LOADER_KEYWORDS",
    "FRAMEWORK_TRAINING_LOADERS",
    "FRAMEWORK_LOADER_ARGUMENTS",
    "MIXED_PRECISION_VALUES",
    "PER_ITEM_WORK",
    "TrainerRun",
    "framework_training_run",
    "framework_training_runs",
    "FileModel",
    "FunctionInfo",
    "LoaderInfo",
    "LoopInfo",
    "NO_GRAD_CONTEXTS",
    "Origin",
    "SCALER_NAME",
    "SET_GRAD_ENABLED",
    "SYNCHRONIZE_CALLS",
    "Site",
    "UNKNOWN_PART",
    "already_on_host",
    "autocast_dtype",
    "child_nodes",
    "conv_dims",
    "device_move",
    "device_placement",
    "tensor_type_device",
    "does_per_item_work",
    "dotted_name",
    "enabled",
    "enclosing_autocast",
    "exclusive_branches",
    "is_autocast_call",
    "is_dataloader_call",
    "is_grad_scaler_call",
    "is_module_base",
    "is_no_grad_decorated",
    "is_periodic_test",
    "iter_subtree",
    "launches_device_work",
    "keyword",
    "keyword_value",
    "last_name",
    "literal_bool",
    "lives_on_host",
    "loop_trains",
    "mentions_cuda_availability",
    "module_evidence",
    "module_mode_call",
    "names_a_module",
    "names_an_optimizer",
    "optimizer_receiver",
    "outermost_loop_in_function",
    "per_batch_anchor",
    "positional",
    "reads_host",
    "requires_cuda",
    "requires_grad_evidence",
    "scaled_backward",
    "scaler_call",
    "steps_optimizer",
    "tensor_backward",
    "tensor_evidence",
    "torch_alias",
    "training_entry_loop",
    "uses_default_collate",
]


def framework_run_evidence(ctx: "FileModel", run: TrainerRun) -> Evidence:
    """The evidence that a framework trains here, on the GPU when there is one."""
    return Evidence(
        f"the {run.framework} trainer runs the training, on the GPU when one is present: `{ctx.code_line(run.run)}`",
        node=run.run,
    )


def training_loop_evidence(ctx: "FileModel", loop: LoopInfo) -> Evidence:
    """The evidence that a script trains in ``loop``: the loop, and where the
    training happens when a function of another file does it
    (``train_one_epoch()`` of engine.py)."""
    elsewhere = None if loop.trains else ctx.facts.trains_elsewhere(loop.imported_calls)
    through = f", through the training function at {elsewhere}" if elsewhere else ""
    return Evidence(f"it trains in {loop.line_hint}{through}", node=loop.node)


def per_batch_evidence(loop, helper: Optional[FunctionInfo]) -> Evidence:
    """The evidence that a node runs once per batch: the loop, or the helper's
    call from it (``Site.batch_context()`` gives both)."""
    text = (
        f"runs once per batch: {loop.line_hint}"
        if helper is None or getattr(loop, "function", None) is helper  # the step function itself
        else f"`{helper.name}()` runs once per batch: {loop.line_hint}"
    )
    return Evidence(text, node=per_batch_anchor(loop, helper))


class FileModel:
    """What one file means: its imports, functions, loops, values and
    batches as the collector recorded them, and the questions rules ask of
    them. Rules read it; only the collector (and the walker, which moves
    the walk's position: ``stack``, ``function``, ``loop``, ``values``)
    writes it."""

    def __init__(
        self,
        path: str,
        source: str,
        module: cst.Module,
        target_torch: Optional[Tuple[int, int]] = None,
        project: Optional[ProjectFacts] = None,
        torch_range: Optional[TorchRange] = None,
        analysis: Optional["ProjectAnalysis"] = None,
    ) -> None:
        self.path = path
        self.source = source
        self.module = module
        # The torch versions the code supports (torchlint.project); target_torch is its lower bound.
        self.project = project or ProjectFacts()
        self._declared_range = torch_range or TorchRange(target_torch, None)
        self._torch_range: Optional[TorchRange] = None
        self.target_torch = self._declared_range.lower
        # the cross-file questions about the file's project (None: the file alone)
        self.analysis = analysis
        self.names = ImportTable()
        self.facts = ModuleFacts(self.names, path, analysis)
        self.stack: List[cst.CSTNode] = []
        self.function: Optional[FunctionInfo] = None
        self.loop: Optional[LoopInfo] = None
        self.class_names: List[str] = []
        # name -> the last expression assigned to it in the current scope, as
        # far as the walk has got: "what is x here?" for visit-time questions.
        self.values: Dict[str, cst.BaseExpression] = {}
        # every binding, kept per scope (id of the function node, 0 for the
        # module): name -> [(order, value)], so a Site answers "what is x
        # here?" after the walk too (``Site.value_of``)
        self.bindings: Dict[int, Dict[str, List[Tuple[int, cst.BaseExpression]]]] = {}
        self.binding_count = 0
        self.reports: List[Tuple["Rule", cst.CSTNode, str, Optional[Fix], Tuple[Evidence, ...]]] = []
        self._host_only: Optional[bool] = None
        self._accelerator_move: Optional[Tuple[Optional[cst.Call]]] = None
        # which names hold batch data, per scope (TL201, TL202, TL206 ask it)
        self.batches = BatchFlow(self)
        # ids of the assignment values being walked: their targets are not bound yet
        self.assigning: set = set()

    @property
    def host_only(self) -> bool:
        """An inference client: the file never names a device and never trains,
        so a model fed host tensors runs on the host. Read once, when asked."""
        if self._host_only is None:
            self._host_only = NAMES_A_DEVICE_OR_TRAINS.search(self.source) is None
        return self._host_only

    def accelerator_move(self) -> Optional[cst.Call]:
        """The first call in the file that moves a tensor or a model to an
        accelerator (``.cuda()``, ``.to(device)``, ``.type(torch.cuda.FloatTensor)``):
        the evidence that the file's work runs on a GPU. None when the file
        moves nothing there (it trains on the CPU, or another file places the
        work). Read once, when asked."""
        if self._accelerator_move is None:
            moves = (
                node
                for node in iter_subtree(self.module)
                if isinstance(node, cst.Call) and device_move(self, node) == "device"
            )
            self._accelerator_move = (next(moves, None),)
        return self._accelerator_move[0]

    def report(
        self,
        rule: "Rule",
        node: cst.CSTNode,
        message: str,
        fix: Optional[Fix] = None,
        evidence: Tuple[Evidence, ...] = (),
    ) -> None:
        self.reports.append((rule, node, message, fix, evidence))

    # -- where the walk is (for ``visit_``/``leave_`` methods) ------------------------
    @property
    def current_node(self) -> Optional[cst.CSTNode]:
        """The node being visited."""
        return self.stack[-1] if self.stack else None

    def current_parent(self, up: int = 1) -> Optional[cst.CSTNode]:
        """The ancestor ``up`` levels above the node being visited, or None."""
        return self.stack[-1 - up] if len(self.stack) > up else None

    def ancestry(self) -> Tuple[cst.CSTNode, ...]:
        """The node being visited and its ancestors, root first (a snapshot)."""
        return tuple(self.stack)

    def inside(self, node: Optional[cst.CSTNode]) -> bool:
        """Is ``node`` the node being visited or one of its ancestors?"""
        return any(ancestor is node for ancestor in self.stack)

    def enclosing_class(self) -> Optional[str]:
        """The name of the innermost class around the node being visited."""
        return self.class_names[-1] if self.class_names else None

    def scope_values(self) -> Mapping[str, cst.BaseExpression]:
        """Name -> the expression last assigned to it in the current scope, so far."""
        return MappingProxyType(self.values)

    def site(self) -> Site:
        """A snapshot of where the current node sits; see ``torchlint.analysis``."""
        return Site(self, self.stack, self.function, self.loop)

    def qualified_name(self, node: cst.CSTNode) -> Optional[str]:
        return self.names.qualified_name(node)

    def facts_batch_caller(
        self,
        function: FunctionInfo,
        callers: Optional[Set[str]] = None,
        is_batch_loop: Optional[Callable[[LoopInfo], bool]] = None,
    ) -> Optional[LoopInfo]:
        """A batch loop that calls ``function`` (perhaps through other module
        functions) at a site that runs every iteration. Exact after the walk.
        ``callers`` and ``is_batch_loop`` replace the defaults (every module
        function reaching ``function``; ``LoopInfo.is_batch_loop``). Rules
        that need no variation ask ``Site.batch_context()`` instead."""
        callers = self.facts.callers_of(function) if callers is None else callers
        for loop in self.facts.loops.values():
            if loop.function is function or not (loop.is_batch_loop if is_batch_loop is None else is_batch_loop(loop)):
                continue
            for name in callers & loop.calls:
                for site in loop.call_sites.get(name, ()):
                    if site.runs_every_step(within=loop):
                        return loop
        return None

    @property
    def torch_range(self) -> TorchRange:
        """The torch versions the code supports: the project's (and the file's
        API use), bounded from above by what the file's imports show (a module
        of the project that imports ``torch._six``). Asked on demand: only
        then does the result depend on the project's other files."""
        if self._torch_range is None:
            ceiling = self.analysis.import_ceiling(self.path, self.source) if self.analysis is not None else None
            self._torch_range = lower_ceiling(self._declared_range, ceiling)
        return self._torch_range

    def torch_below(self, major: int, minor: int = 0) -> bool:
        """May the code run on a torch older than major.minor? False if unknown.
        Either bound shows it: the oldest supported, or the newest when even
        that one is older (``from torch._six import inf``: torch 1.x only)."""
        bound = (major, minor)
        if self.target_torch is not None and self.target_torch < bound:
            return True
        upper = self.torch_range.upper
        return upper is not None and upper < bound

    def torch_at_least(self, major: int, minor: int = 0) -> bool:
        """Does every torch the code supports have major.minor's APIs? False if unknown."""
        return self.target_torch is not None and self.target_torch >= (major, minor)

    def torch_target_explicit(self) -> bool:
        """Did the user name the targeted torch (``target-torch``) rather than
        leave it to the manifests? A manifest's open-ended floor
        (``torch>=1.13``) says what the code may run on; installs today get
        the newest release. ``target-torch = "1.13"`` says what it runs on."""
        return EXPLICIT_TARGET in self.torch_range.sources

    def torch_all_below(self, major: int, minor: int = 0) -> bool:
        """Is every torch the code supports older than major.minor? False if unknown."""
        upper = self.torch_range.upper
        return upper is not None and upper < (major, minor)

    def code_for(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node)

    def code_line(self, node: cst.CSTNode, width: int = 60) -> str:
        """The node's code on one line, for an evidence note: its first line,
        cut at ``width`` characters, with ``…`` where anything was left out."""
        lines = self.code_for(node).strip().splitlines() or [""]
        first = lines[0].strip().rstrip(",")
        if len(first) > width:
            return first[: width - 1] + "…"
        return first + ("…" if len(lines) > 1 else "")

    @staticmethod
    def replace(node: cst.CSTNode, new: Any) -> Edit:
        """An edit replacing ``node`` with ``new`` (a node or source text).

        A node's position excludes its own parentheses, which stay in the
        text; so the replacement's parentheses are dropped when the old node
        had some (rules usually build ``new`` with ``node.with_changes``)."""
        if isinstance(new, str):
            return Edit(content=new, node=node)
        if getattr(node, "lpar", None) and getattr(new, "lpar", None):
            new = new.with_changes(lpar=[], rpar=[])
        return Edit(content=cst.Module(body=[]).code_for_node(new), node=node, new_node=new)

    @staticmethod
    def insert_line_before(node: cst.CSTNode, line: str) -> Edit:
        """An edit inserting ``line`` above the line where ``node`` starts, indented like it."""
        return Edit(content=line, node=node, mode="line-before")

    @staticmethod
    def fix(applicability: str, message: str, *edits: Edit) -> Fix:
        return Fix(applicability, message, tuple(edits))

    def value_of(self, name: Optional[str]) -> Optional[cst.BaseExpression]:
        value = self.values.get(name) if name else None
        if value is not None and id(value) in self.assigning:
            return None  # inside ``x = f(x)``'s own value: the new binding is not in effect yet
        return value

    def constant(self, expr: cst.BaseExpression) -> cst.BaseExpression:
        """Follow a name to the literal it holds (a module constant or a local
        assigned once before), and a ternary to the branch that holds one."""
        for _ in range(4):
            if isinstance(expr, cst.Name) and expr.value not in ("True", "False", "None"):
                value = self.values.get(expr.value) or self.facts.module_constants.get(expr.value)
                if value is None:
                    return expr
                expr = value
            elif isinstance(expr, cst.Attribute) and isinstance(expr.value, cst.Attribute):
                # ``config.DATA.PIN_MEMORY``: the default the project's config module
                # gives that key (a yacs ``_C.DATA.PIN_MEMORY = True``)
                value = self.analysis.config_default(expr) if self.analysis is not None else None
                if value is None:
                    return expr
                expr = value
            elif isinstance(expr, cst.Attribute) and isinstance(expr.value, cst.Name):
                # ``args.pin_mem``: the default of the argparse option of that name
                dest = expr.attr.value
                value = self.facts.set_defaults.get(dest) or self.facts.argument_defaults.get(dest)
                if value is None:
                    return expr
                expr = value
            elif isinstance(expr, cst.IfExp):
                body, orelse = literal_bool(expr.body), literal_bool(expr.orelse)
                if body is True or orelse is True:
                    return cst.Name("True")
                return expr
            else:
                return expr
        return expr

    def dict_key(self, expr: cst.BaseExpression) -> Optional[tuple]:
        name = dotted_name(expr)
        if name is None:
            return None
        scope = id(self.function.node) if self.function is not None else 0
        if (scope, name) in self.facts.dicts:
            return (scope, name)
        return (0, name) if (0, name) in self.facts.dicts else (scope, name)

    def dict_values(self, expr: cst.BaseExpression, key: str) -> List[cst.BaseExpression]:
        """Every value the dict ``expr`` is given for ``key`` in this scope."""
        dict_key = self.dict_key(expr)
        return list(self.facts.dicts.get(dict_key, {}).get(key, ())) if dict_key else []

    def in_dead_branch(self) -> bool:
        """Under ``if False:`` (or the ``else`` of ``if True:``): code that cannot run."""
        stack = self.stack
        for i in range(len(stack) - 2, -1, -1):
            node = stack[i]
            if isinstance(node, cst.If) and isinstance(node.test, cst.Name) and node.test.value in ("True", "False"):
                child = stack[i + 1]
                if (node.test.value == "False") == (child is node.body):
                    return True
        return False

    # -- across files (the project's other modules) ------------------------------------
    def loader_copied_elsewhere(self, loader: LoaderInfo) -> Optional[str]:
        """The file of the project that copies ``loader``'s batches to the
        device, when the loader is passed to a function imported from it."""
        return self.analysis.copied_elsewhere(self, loader) if self.analysis is not None else None

    def init_value(self, class_name: Optional[str], attribute: str) -> Optional[cst.BaseExpression]:
        """What the class's ``__init__`` last assigns to ``attribute``
        (``self.melspec = MelSpectrogram(...)``), as far as the walk has seen."""
        if class_name is None:
            return None
        for info in self.facts.functions.get("__init__", ()):
            if info.class_name == class_name and info.parent is None:
                found = self.bindings.get(id(info.node), {}).get(attribute)
                if found:
                    return found[-1][1]
        return None

    def convolution_built(self, call: cst.Call) -> Optional[Tuple[int, Optional[str]]]:
        """(spatial dims, where) when ``call`` builds or runs a convolution:
        a torch convolution or a torchvision/timm CNN (where: None, the call
        itself), or a model class of another file of the project whose own
        code builds convolutions (where: "models/vae.py:12")."""
        dims = conv_dims(self.qualified_name(call.func), call)
        if dims is not None:
            return dims, None
        return self.analysis.class_convolution(self, call.func) if self.analysis is not None else None

    def class_loads_per_item(self, func: cst.BaseExpression) -> bool:
        """Is ``func`` a dataset class imported from another file of the
        project whose ``__getitem__`` reads, decodes or transforms a sample?"""
        return self.analysis.class_loads_per_item(self, func) if self.analysis is not None else False
