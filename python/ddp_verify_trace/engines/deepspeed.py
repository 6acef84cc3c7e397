"""DeepSpeed ZeRO (stages 1, 2, 3): the model and full gradients behind the inner optimizer.

Under ZeRO the torch optimizer whose step hooks fire is DeepSpeed's *client* optimizer, and
it steps flattened fp32 partitions, not the model's parameters: `engine.optimizer` is the
ZeRO optimizer, `engine.optimizer.optimizer` that torch optimizer. `find_zero(optimizer)`
tells whether an optimizer is one and returns the engine's module, its trained parameters by
name and a `Zero` that reads the full gradient and weight of each parameter; `DeepSpeed` is
the recorder's engine built on it.

When the gradients can be read (`Zero.when`): inside the inner optimizer's step, pre- or
post-hook. ZeRO calls the inner optimizer's step once per parameter group (stage 1/2) or
sub-group (stage 3), with `param_groups` narrowed to that group's one flat fp32 partition
whose `.grad` is, there and only there, the gradient the optimizer applies: reduced over the
ranks (averaged), divided by gradient_accumulation_steps, unscaled and clipped (DeepSpeed's
`gradient_clipping`). ZeRO sets it just before and drops it just after that call, and by
then its own buffers (`averaged_gradients`, which deepspeed.utils.safe_get_full_grad reads
at stage 1/2) are gone: safe_get_full_grad fails there at stage 1/2 and returns the
unclipped gradient at stage 3. `Zero.stepping(optimizer)` names the parameters whose
gradients that call applies (all of them where the optimizer has one group).

Every `full_grad` and `full_param` is a collective over the engine's data-parallel group:
each rank calls it for the same parameters in the same order.

deepspeed is imported lazily, only once something already imported it: this module imports
without it."""
from __future__ import annotations

import gc
import sys
import warnings
from typing import Any

import torch

from .. import _schema
from .._sampling import Sampling
from .._tensors import DTYPES
from .base import Engine, Named


def engines() -> list[Any]:
    """The live DeepSpeedEngine objects (none when deepspeed was never imported)."""
    if "deepspeed" not in sys.modules:
        return []
    try:
        from deepspeed.runtime.engine import DeepSpeedEngine
    except Exception:  # a broken or partial install: not DeepSpeed's loop
        return []
    found = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            try:
                if isinstance(obj, DeepSpeedEngine):
                    found.append(obj)
            except ReferenceError:
                continue
    return found


def find_zero(optimizer: torch.optim.Optimizer) -> tuple[torch.nn.Module, Named, Zero] | None:
    """(engine.module, its named parameters that train, Engine) where `optimizer` is the
    inner (client) optimizer of a live DeepSpeedEngine under ZeRO stage 1, 2 or 3; else None."""
    for engine in engines():
        zero = getattr(engine, "optimizer", None)
        if zero is None or getattr(zero, "optimizer", None) is not optimizer:
            continue
        stage = int(engine.zero_optimization_stage())
        if stage not in (1, 2, 3):
            continue
        module = engine.module
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        return module, named, Zero(engine, stage)
    return None


class Zero:
    """One DeepSpeedEngine under ZeRO: the full gradients the inner optimizer applies and the
    full fp32 weights, gathered from the ranks' partitions."""

    # Read in the inner optimizer's step hooks; "post" sees the same gradient as "pre" (the
    # optimizer leaves it) and is where hook.py reads every other optimizer's.
    when = "post"

    def __init__(self, engine: Any, stage: int) -> None:
        self.engine = engine
        self.stage = stage
        self.name = getattr(_schema.Engine, f"DEEPSPEED_ZERO{stage}")
        self.zero = engine.optimizer
        self.inner = engine.optimizer.optimizer

    @property
    def gas(self) -> int:
        return int(self.engine.gradient_accumulation_steps())

    @property
    def clip(self) -> float:
        return float(self.engine.gradient_clipping() or 0.0)

    # -- where each parameter's gradient lives ------------------------------------------
    def _flat_groups(self) -> list[torch.Tensor]:
        if self.stage == 3:
            return list(self.zero.fp32_partitioned_groups_flat)
        return list(self.zero.single_partition_of_fp32_groups)

    def _lp_groups(self) -> list[list[torch.nn.Parameter]]:
        if self.stage == 3:
            return [list(g) for g in self.zero.fp16_groups]
        return [list(g) for g in self.zero.bit16_groups]

    def _group_of(self, param: torch.nn.Parameter) -> int:
        for i, group in enumerate(self._lp_groups()):
            if any(p is param for p in group):
                return i
        raise ValueError("ddp_verify_trace: the parameter is not one the DeepSpeed engine trains")

    def stepping(self, optimizer: torch.optim.Optimizer | None = None) -> list[torch.nn.Parameter]:
        """The model parameters whose gradients the inner optimizer's step now running
        applies: those of the (sub-)group whose flat partition it holds."""
        opt = optimizer if optimizer is not None else self.inner
        held = {id(p) for g in opt.param_groups for p in g["params"]}
        out: list[torch.nn.Parameter] = []
        for flat, lp in zip(self._flat_groups(), self._lp_groups()):
            if id(flat) in held:
                out.extend(lp)
        return out

    def lrs(self, optimizer: torch.optim.Optimizer) -> dict[int, float]:
        """{index of the user's parameter group: its learning rate} for the (sub-)groups the
        inner optimizer's step now running applies (stage 1/2 narrow `param_groups` to the
        one group stepping; stage 3 keeps them all and fills the stepping one's params)."""
        held = {id(p) for g in optimizer.param_groups for p in g["params"]}
        out: dict[int, float] = {}
        for i, flat in enumerate(self._flat_groups()):
            if id(flat) not in held:
                continue
            group = next(g for g in optimizer.param_groups if any(p is flat for p in g["params"]))
            key = int(self.zero.sub_group_to_group_id[i]) if self.stage == 3 else i
            out[key] = float(group["lr"])
        return out

    def groups(self) -> int:
        """How many inner optimizer steps make one engine step (one per (sub-)group)."""
        return len(self._flat_groups())

    # -- gathering ------------------------------------------------------------------------
    def full_grad(self, param: torch.nn.Parameter) -> torch.Tensor | None:
        """The full gradient the inner optimizer applies to `param` in the step now running
        (float32, CPU): averaged over the ranks, divided by gradient_accumulation_steps,
        unscaled and clipped. None where the parameter does not train. Outside the inner
        step (its flat partition has no .grad) it falls back to
        deepspeed.utils.safe_get_full_grad: before the clipping, and at stage 1/2 only
        between the boundary backward and engine.step(). Collective."""
        if not param.requires_grad:
            return None
        if self.stage == 3:
            sub, offset, numel = self.zero.grad_position[self.zero.get_param_id(param)]
            flat = self.zero.fp32_partitioned_groups_flat[sub]
            if flat.grad is None:
                return self._fallback_grad(param)
            part = flat.grad.narrow(0, offset, numel).float()
            return self.zero._fp32_state_allgather(param, part).detach().float().cpu().clone()
        i = self._group_of(param)
        flat = self.zero.single_partition_of_fp32_groups[i]
        if flat.grad is None:
            return self._fallback_grad(param)
        full = torch.zeros(param.numel(), dtype=torch.float32, device=flat.device)
        mapping = getattr(param, "_hp_mapping", None)
        if mapping is not None:
            hp, lp = mapping.hp_fragment_address, mapping.lp_fragment_address
            full.narrow(0, lp.start, lp.numel).copy_(flat.grad.narrow(0, hp.start, hp.numel))
        # Each element lives in exactly one rank's partition: the sum is the whole tensor.
        torch.distributed.all_reduce(full, group=self._dp_group(param, i))
        return full.view(param.shape).cpu()

    def _dp_group(self, param: torch.nn.Parameter, i: int) -> Any:
        group = getattr(param, "_dp_group", None)
        return group if group is not None else self.zero.real_dp_process_group[i]

    def _fallback_grad(self, param: torch.nn.Parameter) -> torch.Tensor | None:
        from deepspeed.utils import safe_get_full_grad

        g = safe_get_full_grad(param)
        return None if g is None else g.detach().float().cpu().clone().view(self.shape(param))

    def full_param(self, param: torch.nn.Parameter) -> torch.Tensor:
        """The full fp32 master weight of `param` (float32, CPU); in the inner step's
        post-hook, the weight the step made for the (sub-)group that stepped. Collective."""
        from deepspeed.utils import safe_get_full_fp32_param

        w = safe_get_full_fp32_param(param)
        if w is None:  # not partitioned by ZeRO (stage 0) or frozen
            w = param.detach()
        return w.detach().float().cpu().clone().view(self.shape(param))

    @staticmethod
    def shape(param: torch.nn.Parameter) -> torch.Size:
        """The parameter's full shape (ZeRO-3 leaves `param` itself empty between forwards)."""
        return getattr(param, "ds_shape", None) or param.shape

    # -- bookkeeping ----------------------------------------------------------------------
    def grad_bytes(self) -> int:
        """Bytes of one full gradient of the trained parameters at their gradient dtype: what
        one reduction moves per rank (stage 1 reduces once per optimizer step, at the
        boundary; stages 2 and 3 reduce-scatter after every backward)."""
        total = 0
        for _, p in self.engine.module.named_parameters():
            if p.requires_grad:
                numel = getattr(p, "ds_numel", None) or p.numel()
                total += int(numel) * p.element_size()
        return total

    def count_backwards(self) -> Counter:
        """A counter of backward passes through the engine's module: a tensor hook on one
        trained parameter (removed by Counter.close()). Each backward that reaches it adds
        one; with ZeRO's own hooks the parameter's grad hook still fires once per backward."""
        return Counter(self.engine.module)


class Counter:
    """Counts backwards through a module by a grad hook on its first trained parameter."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.count = 0
        param = next(p for p in module.parameters() if p.requires_grad)
        self._handle = param.register_hook(self._seen)

    def _seen(self, grad: torch.Tensor) -> None:
        self.count += 1

    def take(self) -> int:
        n, self.count = self.count, 0
        return n

    def close(self) -> None:
        self._handle.remove()


class DeepSpeed(Engine):
    """DeepSpeed ZeRO behind the recorder's one interface: the engine names the model; each
    engine step's whole gradients are gathered in its inner optimizer's steps (one per
    (sub-)group) and its whole weights kept on the host after it, so the trace is written
    at destroy_process_group or at exit without a collective (the engine may be gone)."""

    backward_hooks = False
    no_magnitudes = "DeepSpeed: no per-micro-batch magnitudes (its partitions are flat)"
    peaks_now = True  # from the host copies of this step, before the next step replaces them
    write_at_destroy = True

    def __init__(self, module: torch.nn.Module, named: Named, zero: Zero) -> None:
        self.zero = zero
        self.name = zero.name
        self._module, self._named = module, named
        self._names = {id(p): n for n, p in named}
        # The whole weights on the host, every rank's (gathered at start and after each step).
        self._whole: dict[str, torch.Tensor] = {}
        self._counter: Counter | None = None
        # The engine step under way: whole gradients and learning rates gathered so far, and
        # how many of its inner steps ran.
        self._grads: dict[str, torch.Tensor | None] = {}
        self._lrs: dict[int, float] = {}
        self._calls = 0

    @classmethod
    def find(cls, optimizer: torch.optim.Optimizer | None, params: list[torch.Tensor]) -> Engine | None:
        found = find_zero(optimizer) if optimizer is not None else None
        return None if found is None else cls(*found)

    def model(self) -> tuple[torch.nn.Module, Named] | None:
        return self._module, self._named

    def shape(self, p: torch.Tensor) -> tuple[int, ...]:
        return tuple(self.zero.shape(p))  # type: ignore[arg-type]

    def dtypes(self, params: Named) -> list[str]:
        return ["torch.float32"]  # the master weights and the gradients they step with

    def dtype(self, params: Named) -> torch.dtype:
        return torch.float32

    def device(self, p: torch.Tensor) -> torch.device:
        return torch.device("cpu")

    def start(self, params: Named, sampling: Sampling) -> dict[str, str]:
        self._whole = {n: self.zero.full_param(p) for n, p in params}  # collective
        # The backwards, counted by a hook on one parameter (no tensor hook sees a
        # micro-batch's gradient of a flat partition).
        self._counter = self.zero.count_backwards()
        facts = {_schema.Key.ENGINE: self.name, _schema.Key.ENGINE_ACCUMULATION: str(self.zero.gas)}
        bit16 = {p.dtype for _, p in params} - {torch.float32}
        if len(bit16) == 1 and next(iter(bit16)) in DTYPES:
            facts[_schema.Key.COMPUTE_DTYPE] = DTYPES[next(iter(bit16))]
        return facts

    def close(self) -> None:
        if self._counter is not None:
            self._counter.close()
            self._counter = None

    def weight(self, name: str, p: torch.Tensor) -> torch.Tensor:
        return self._whole[name]

    def backwards(self, counts: dict[str, int], reduced: list[bool]) -> int:
        # The early hooks' count at step 0, the counter's after.
        return max(counts.values(), default=0) + (self._counter.take() if self._counter is not None else 0)

    def applied(self, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any] | None, list[float] | None] | None:
        """One of the inner steps (one per (sub-)group) ended: the whole gradients it applied
        are gathered now, the only time they are there; after the engine step's last one,
        all of them. Every rank gathers the same tensors in the same order (each rank's inner
        optimizer steps the same groups)."""
        for p in self.zero.stepping(optimizer):
            self._grads[self._names[id(p)]] = self.zero.full_grad(p)
        self._lrs.update(self.zero.lrs(optimizer))
        self._calls += 1
        if self._calls < self.zero.groups():
            return None
        grads, lrs = self._grads, [lr for _, lr in sorted(self._lrs.items())]
        self._grads, self._lrs, self._calls = {}, {}, 0
        return grads, lrs

    def after_step(self) -> None:
        self._whole = {n: self.zero.full_param(p) for n, p in self._named}  # collective

    def rank_checksums(self, sampled: bool) -> bool:
        return False  # its ranks hold partitions, and its gradients come gathered
