"""What one recording has seen of training: its `Watch`, the facts torch's patches
(`_torch_patches`), the engines' and the frameworks' hand it between optimizer steps, which
the recorder takes at each step. A watch sees only what happens while it is open; the open
ones are `OPEN`, and the last one to close takes every patch out (`_patches.undo`)."""
from __future__ import annotations

from typing import Any, Callable

import torch

from . import _patches
from ._stages.batches import Batches
from ._stages.local_sums import LocalSums


class Watch:
    """One recording's share of what the patches see, from when it opened."""

    def __init__(self) -> None:
        self.clip_calls = 0  # clip_grad_norm_ calls not yet taken by a step
        self.last_clip = [0.0, 0.0]  # [total norm before clipping, max_norm] of the last one
        # The loss scale of the GradScaler.step under way (None outside one), and what to
        # call when it skips the optimizer's step: (optimizer, scale) -> None.
        self.scale: float | None = None
        self.on_skip: Callable[[torch.optim.Optimizer, float], None] | None = None
        # Called with each optimizer built while set.
        self.on_optimizer: Callable[[torch.optim.Optimizer], None] | None = None
        # Two distinct epochs are all a recorder asks of set_epoch (did a second one start?),
        # so the log stays this small however long the run.
        self._epochs: set[Any] = set()
        self._syncs: list[bool] = []  # per micro-batch (DDP's forward): to be reduced?
        # Per parameter group of an engine that reduces by group: per backward,
        # whether it reduced its gradients.
        self._groups: dict[int, list[bool]] = {}
        self._comm = [0, 0]  # gradient collectives and their bytes since the last take
        # Which engine synchronised gradients (its header word), the divide factor it ran
        # with (None: its default) and the compute dtype where it casts the parameters.
        self.engine: str | None = None
        self.divide: float | None = None
        self.compute_dtype: torch.dtype | None = None
        # The dtype an engine reduced the gradients in, and the gradients' own.
        self.reduce_dtype: torch.dtype | None = None
        self.reduce_from: torch.dtype | None = None
        # The dtype autocast ran the outermost forwards in (None: off in every one so far),
        # and whether some forwards ran with it and others without (or in another dtype).
        self.autocast: torch.dtype | None = None
        self.autocast_mixed = False
        self._forwards = 0
        # Called once before the default process group is destroyed (an engine's
        # parts of the weights can be gathered only while it lives).
        self.on_destroy: Callable[[], None] | None = None
        # Stage facts (`_stages`): each micro-batch's samples and loss on its way to backward,
        # each backward's own gradient before any reduction (by parameter identity, named by
        # the recorder at the step), and the step calls a framework's optimizer wrapper passed through.
        self.batches = Batches()
        self.local = LocalSums()
        # Tensor hooks summing each backward's own gradient, one per parameter (by id), put on
        # every outermost module's parameters from its first forward: the first step's too,
        # before a recorder knows the model.
        self._local_hooked: set[int] = set()
        self._local_modules: set[int] = set()
        self._local_handles: dict[int, Any] = {}  # by parameter id
        self.local_hooks = True  # False once the run's engine hands the watch its own
        self.wrapper_calls = 0
        self.framework_accumulation: int | None = None
        self.zeroed_in_window = 0  # zero_grad calls after a backward of the step, before it
        self.zeroed_by: str | None = None
        self.boundary_by: str | None = None  # who marked an engine's accumulation boundary by hand
        # The trained weights as the first outermost forward found them, one checksum
        # (`take_start`): "" where a rank holds only part of them.
        self.start_weights: str | None = None
        self._in_api = 0  # a framework's backward API calls under way (one may call another)
        # How samplers and loaders dealt the data (`_deal`), by header key, this rank's.
        self.deal: dict[str, Any] = {}

    def autocast_seen(self, dtype: torch.dtype | None) -> None:
        """An outermost forward ran under autocast in `dtype` (None: off)."""
        if self._forwards and dtype != self.autocast:
            self.autocast_mixed = True
        if self.autocast is None:
            self.autocast = dtype
        self._forwards += 1

    def dealt(self, facts: dict[str, Any]) -> None:
        """How the data was dealt (the first epoch's, per key): see `_deal`."""
        for k, v in facts.items():
            self.deal.setdefault(k, v)

    def handed(self, loss: Any, api: str, who: str) -> None:
        """`who`'s code handed `loss` to framework `api`'s backward API: taken from the
        outermost such call alone (Lightning's manual_backward calls its strategy's)."""
        if not self._in_api:
            self.batches.handed(loss, api, who)

    def api_entered(self) -> None:
        self._in_api += 1

    def api_left(self) -> None:
        self._in_api -= 1

    def boundary_marked(self, who: str) -> None:
        """`who`'s code marked the engine's accumulation boundary by hand."""
        self.boundary_by = who

    def zeroed(self, who: str) -> None:
        self.zeroed_in_window += 1
        self.zeroed_by = who

    def take_start(self, module: torch.nn.Module) -> None:
        """The trained weights as the first forward finds them, before any backward, one
        checksum: a run resumed from another's checkpoint, or initialised from another
        seed, starts apart. By value, not by name (DDP, compile and frameworks prefix the
        names otherwise in each leg); not where a rank holds only part of a parameter (a
        tensor subclass wraps it, or its own storage is emptied)."""
        import hashlib

        from ._tensors import bits

        rows = []
        for p in module.parameters():
            if not p.requires_grad:
                continue
            if type(p) not in (torch.nn.Parameter, torch.Tensor) or p.is_meta or not p.numel():
                self.start_weights = ""
                return
            rows.append(f"{p.numel()}:{int(bits(p.detach()))}")
        self.start_weights = hashlib.sha256("\n".join(sorted(rows)).encode()).hexdigest()[:16] if rows else ""

    def hook_local(self, module: torch.nn.Module) -> None:
        """Sums each backward's own gradient of `module`'s parameters (once per module and
        parameter): a tensor hook sees it before any reduction, under DDP and no_sync alike."""
        if id(module) in self._local_modules or not self.local_hooks:
            return
        self._local_modules.add(id(module))
        for p in module.parameters():
            if p.requires_grad and id(p) not in self._local_hooked:
                self._local_hooked.add(id(p))
                key = id(p)
                self._local_handles[key] = p.register_hook(lambda g, key=key: self.local.add(key, g))

    def unhook_local(self, ids: set[int]) -> None:
        """A recorder's own tensor hooks on these parameters add their local sums from now
        on (one hook per parameter instead of two, each a Python call per backward)."""
        for key in ids & self._local_handles.keys():
            self._local_handles.pop(key).remove()

    def no_local_hooks(self) -> None:
        """The run's engine hands the watch each local gradient itself (`local_grad`), or
        none is wanted (one process: the judge reads them from the applied gradients)."""
        self.local_hooks = False
        for h in self._local_handles.values():
            h.remove()
        self._local_handles = {}

    def local_grad(self, param: Any, grad: torch.Tensor) -> None:
        """An engine's own point before it reduces: `grad` is this rank's for `param`."""
        self.local.add(id(param), grad)

    def wrapper_step(self, accumulation: int | None) -> None:
        """The script called a framework's optimizer wrapper's step (which may or may not
        step the optimizer inside), told to accumulate `accumulation` micro-batches."""
        self.wrapper_calls += 1
        if accumulation is not None:
            self.framework_accumulation = accumulation

    def take_wrapper_calls(self) -> int:
        calls, self.wrapper_calls = self.wrapper_calls, 0
        return calls

    def epoch_started(self, epoch: Any) -> None:
        if len(self._epochs) < 2:
            self._epochs.add(epoch)

    def several_epochs(self) -> bool:
        """Whether a second epoch was set since this watch opened."""
        return len(self._epochs) > 1

    def clipped(self, total: float, max_norm: float) -> None:
        self.clip_calls += 1
        self.last_clip = [total, max_norm]

    def take_clips(self) -> tuple[int, list[float]]:
        """The clips since the last take, and the last clip's norms."""
        calls, self.clip_calls = self.clip_calls, 0
        return calls, self.last_clip

    def reduced(self, flag: bool, group: int | None = None) -> None:
        """One micro-batch's gradient was (`flag`) or was not reduced: as a whole (DDP's
        forward), or by parameter `group`, each group's backwards in turn."""
        if group is None:
            self._syncs.append(flag)
        else:
            self._groups.setdefault(group, []).append(flag)

    def take_syncs(self) -> list[bool]:
        """The micro-batches since the last take, each reduced or not (by any group)."""
        syncs, self._syncs = self._syncs, []
        if self._groups:
            groups, self._groups = list(self._groups.values()), {}
            n = max(len(g) for g in groups)
            syncs += [any(g[i] for g in groups if i < len(g)) for i in range(n)]
        return syncs

    def take_comm(self) -> tuple[int, int]:
        """Gradient collectives since the last take, and their bytes (one rank's share)."""
        comm, self._comm = self._comm, [0, 0]
        return comm[0], comm[1]

    def synced(self, engine: str, collectives: int, nbytes: int) -> None:
        self.engine = engine
        self._comm[0] += collectives
        self._comm[1] += nbytes

    def close(self) -> None:
        """Sees nothing more; the last watch to close takes the patches out."""
        for h in self._local_handles.values():
            h.remove()
        self._local_handles = {}
        if self in OPEN:
            OPEN.remove(self)
            if not OPEN:
                _patches.undo()


# The open watches, oldest first.
OPEN: list[Watch] = []


def dealt(facts: dict[str, Any]) -> None:
    """Noted by the open watches, if any; patches nothing (our own sampler calls it)."""
    for watch in OPEN:
        watch.dealt(facts)


def epoch_started(epoch: Any) -> None:
    """An epoch set by a sampler torch does not know (AccumulationBatchSampler): noted by
    the open watches, if any; patches nothing."""
    for watch in OPEN:
        watch.epoch_started(epoch)
