"""One process, or torch's DistributedDataParallel: every rank holds its parameters whole
and `.grad` is the gradient the step applies, after DDP's all-reduce (the defaults of
`Engine`).

DDP decides at the end of each forward whether that micro-batch's backward is all-reduced
(`require_backward_grad_sync`, which `no_sync()` clears): the patch of `_post_forward`
notes each forward's flag and the bytes of its buckets, so a rank's unsynchronised gradient
can be traced to the micro-batch that ran without the all-reduce, and a loop that reduces
every micro-batch (seed 002's slowdown) can be told so.

A framework whose backwards run inside DDP's forward (Lightning's manual optimization:
`training_step` calls `manual_backward` and `opt.step()` within the forward) decides for each
backward itself, by preparing DDP's reducer where it runs it, and the flag the forward then
ends with decides nothing (Lightning clears it there). Such a framework reports each of those
backwards through `prepared` and marks the forward with `decided_inside`, whose end is then
not counted as a micro-batch.

Under `--device cpu` (`_cpu_device`) DDP's construction drops `device_ids` and
`output_device`, which a module on the CPU refuses: done in this engine's own patch of
`__init__`, the one DDP is built through."""
from __future__ import annotations

import sys
import weakref
from typing import Any

import torch

from .. import _cpu_device, _owners, _schema
from .._patches import Patches
from .base import Engine


class Ddp(Engine):
    """Whole gradients in `.grad` on every rank; the header's engine word comes from DDP's
    forwards (a run with none is one process, or a loop that bypassed the wrapper)."""

    local_is_applied = True

    @classmethod
    def find(cls, optimizer: torch.optim.Optimizer | None, params: list[torch.Tensor]) -> Engine | None:
        return cls()  # the last in the registry: whatever no other engine claims

    @staticmethod
    def patch(patches: Patches) -> None:
        from torch.nn.parallel import DistributedDataParallel

        post_forward = getattr(DistributedDataParallel, "_post_forward", None)
        if post_forward is None:  # where DDP decides, in the torch versions supported
            return

        def _post_forward(self: DistributedDataParallel, output: Any) -> Any:
            if id(self) in _DECIDED_INSIDE:
                _DECIDED_INSIDE.discard(id(self))
            elif torch.is_grad_enabled():
                prepared(patches.watches(), self, bool(self.require_backward_grad_sync))
            return post_forward(self, output)

        patches.replace(DistributedDataParallel, "_post_forward", _post_forward)
        init = DistributedDataParallel.__init__

        def __init__(self: DistributedDataParallel, *args: Any, **kwargs: Any) -> None:
            args, kwargs = _cpu_device.without(init, (self, *args), kwargs, ("device_ids", "output_device"), "DDP")
            init(*args, **kwargs)
            try:
                global _BUILT
                _BUILT = (_owners.caller(sys._getframe(1)), weakref.ref(self))
            except Exception:  # noqa: BLE001 - a fact not taken; training goes on
                pass

        patches.replace(DistributedDataParallel, "__init__", __init__)
        register = getattr(DistributedDataParallel, "register_comm_hook", None)
        if register is not None:

            def register_comm_hook(self: DistributedDataParallel, state: Any, hook: Any) -> Any:
                out = register(self, state, hook)
                _HOOKED[id(self)] = str(getattr(hook, "__name__", type(hook).__name__))
                return out

            patches.replace(DistributedDataParallel, "register_comm_hook", register_comm_hook)

    def step_facts(self, watch: Any, world: int, reduced: list[bool]) -> dict[str, str]:
        if not reduced:
            return {}
        return {_schema.Key.DDP_FORWARD: _schema.DdpForward.SEEN, **built()}

    def closing_facts(self, world: int) -> dict[str, str]:
        return {_schema.Key.DDP_FORWARD: _schema.DdpForward.NONE} if world > 1 else {}


# Who built the last DistributedDataParallel (a framework's word, or plain), and it; the ids
# of those given a comm hook.
_BUILT: tuple[str, Any] | None = None
_HOOKED: dict[int, str] = {}  # by id: the hook's name

# The reduction's dtype a comm hook of torch's own casts each bucket to, by its name
# (`default_hooks.bf16_compress_hook`, `fp16_compress_hook` and their `*_wrapper`s).
_HOOK_DTYPES = (("bf16", "bfloat16"), ("fp16", "float16"))


def built() -> dict[str, str]:
    """Header words for the DDP module the run built last: whose code built it (a framework's
    strategy owns the reduction it drives) and the settings that change when and what it
    reduces."""
    if _BUILT is None:
        return {}
    who, ref = _BUILT
    ddp = ref()
    if ddp is None:
        return {_schema.Key.DDP_BUILT_BY: who}
    settings = [
        f"static_graph={bool(getattr(ddp, 'static_graph', False))}",
        f"find_unused_parameters={bool(getattr(ddp, 'find_unused_parameters', False))}",
        f"gradient_as_bucket_view={bool(getattr(ddp, 'gradient_as_bucket_view', False))}",
    ]
    facts = {_schema.Key.DDP_BUILT_BY: who}
    hook = _HOOKED.get(id(ddp))
    if hook is not None:
        settings.append(f"comm hook {hook}")
        dtype = next((d for key, d in _HOOK_DTYPES if key in hook), None)
        if dtype is not None:
            facts[_schema.Key.REDUCE_DTYPE] = dtype
    facts[_schema.Key.DDP_SETTINGS] = ", ".join(settings)
    return facts


# The DDP modules whose forward now ending ran its backwards inside it, each reported where
# the framework prepared the reducer for it (`decided_inside`), by id.
_DECIDED_INSIDE: set[int] = set()


def prepared(watches: list[Any], ddp: Any, synced: bool) -> None:
    """One micro-batch's backward through `ddp` will be all-reduced (`synced`) or not, as the
    watches hear it: its flag, and where synced the engine and the buckets' collectives."""
    buckets = _buckets(ddp) if synced and watches else []
    for watch in watches:
        watch.reduced(synced)
        if synced:
            watch.synced(_schema.Engine.DDP, len(buckets), sum(buckets))


def decided_inside(ddp: Any) -> None:
    """The forward of `ddp` now ending ran its backwards inside it, each reported through
    `prepared` where the framework prepared the reducer: its end is no micro-batch."""
    _DECIDED_INSIDE.add(id(ddp))


def _buckets(ddp: Any) -> list[int]:
    """The bytes of each of DDP's gradient buckets (one all-reduce each per synchronised
    backward), from its own logging data; [] where this torch does not say."""
    try:
        sizes = str(ddp._get_ddp_logging_data().get("bucket_sizes", ""))
        return [int(s) for s in sizes.replace(" ", "").split(",") if s]
    except Exception:  # noqa: BLE001 - a torch without it: no count, training goes on
        return []
