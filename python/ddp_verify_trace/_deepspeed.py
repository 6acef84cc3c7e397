"""DeepSpeed ZeRO (stages 1, 2, 3): the model and full gradients behind the inner optimizer.

Under ZeRO the torch optimizer whose step hooks fire is DeepSpeed's *client* optimizer, and
it steps flattened fp32 partitions, not the model's parameters: `engine.optimizer` is the
ZeRO optimizer, `engine.optimizer.optimizer` that torch optimizer. `find(optimizer)` tells
whether an optimizer is one and returns the engine's module, its trained parameters by name
and an `Engine` that reads the full gradient and weight of each parameter.

When the gradients can be read (`Engine.when`): inside the inner optimizer's step, pre- or
post-hook. ZeRO calls the inner optimizer's step once per parameter group (stage 1/2) or
sub-group (stage 3), with `param_groups` narrowed to that group's one flat fp32 partition
whose `.grad` is, there and only there, the gradient the optimizer applies: reduced over the
ranks (averaged), divided by gradient_accumulation_steps, unscaled and clipped (DeepSpeed's
`gradient_clipping`). ZeRO sets it just before and drops it just after that call, and by
then its own buffers (`averaged_gradients`, which deepspeed.utils.safe_get_full_grad reads
at stage 1/2) are gone: safe_get_full_grad fails there at stage 1/2 and returns the
unclipped gradient at stage 3. `Engine.stepping(optimizer)` names the parameters whose
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

__all__ = ["Engine", "find", "engines"]


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


def find(optimizer: torch.optim.Optimizer) -> tuple[torch.nn.Module, list[tuple[str, torch.nn.Parameter]], Engine] | None:
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
        return module, named, Engine(engine, stage)
    return None


class Engine:
    """One DeepSpeedEngine under ZeRO: the full gradients the inner optimizer applies and the
    full fp32 weights, gathered from the ranks' partitions."""

    # Read in the inner optimizer's step hooks; "post" sees the same gradient as "pre" (the
    # optimizer leaves it) and is where hook.py reads every other optimizer's.
    when = "post"

    def __init__(self, engine: Any, stage: int) -> None:
        self.engine = engine
        self.stage = stage
        self.name = f"deepspeed-zero{stage}"
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
