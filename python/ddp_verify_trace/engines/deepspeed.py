"""DeepSpeed: the model and full gradients behind the inner optimizer, under ZeRO (stages 1,
2, 3) and DeepSpeed's other optimizer wrappers.

The torch optimizer whose step hooks fire is DeepSpeed's *client* optimizer, and it steps
fp32 master copies, not the model's parameters: `engine.optimizer` is DeepSpeed's wrapper,
`engine.optimizer.optimizer` that torch optimizer. `find_zero(optimizer)` tells whether an
optimizer is one and returns the engine's module, its trained parameters by name and a
`Zero` that reads the full gradient and weight of each parameter; `DeepSpeed` is the
recorder's engine built on it. Where the wrapper keeps its master copies (`Zero.kind`):
- "zero" (DeepSpeedZeroOptimizer, ZeRO 1/2, ZeRO-Offload's too): one flat fp32 partition
  per parameter group and rank, linked to the parameters by `_hp_mapping`;
- "zero3" (DeepSpeedZeroOptimizer_Stage3): flat partitions per sub-group;
- "bf16" (BF16_Optimizer: ZeRO 1 with bf16 parameters and fp32 gradient accumulation): one
  flat fp32 partition per group and rank as "zero", stepped by one inner step for all groups;
- "flat" (FP16_Optimizer: stage 0, fp16 or bf16): one whole flat fp32 copy per group;
- "copies" (FP16_UnfusedOptimizer: stage 0, fp16 or bf16): a whole fp32 copy per parameter;
- "other": a wrapper this module does not know. Its steps, learning rates and final weights
  are recorded, its gradients not, and the trace's header says so (`Zero.warnings`).

When the gradients can be read (`Zero.when`): inside the inner optimizer's step, pre- or
post-hook. ZeRO calls the inner optimizer's step once per parameter group (stage 1/2) or
sub-group (stage 3), with `param_groups` narrowed to that group's one flat fp32 partition;
the other wrappers call it once for all groups. The master copies' `.grad` is, there and
only there, the gradient the optimizer applies: reduced over the ranks (averaged), divided
by gradient_accumulation_steps, unscaled and clipped (DeepSpeed's `gradient_clipping`). The
wrapper sets it just before and drops it just after that call, and by then its own buffers
(`averaged_gradients`, which deepspeed.utils.safe_get_full_grad reads at stage 1/2) are gone
or zeroed: safe_get_full_grad fails there at stage 1/2 and returns the unclipped gradient
at stage 3. `Zero.stepping(optimizer)` names the parameters whose gradients that call
applies (all of them where the optimizer has one group or the wrapper steps all at once).

Every `full_grad` and `full_param` of a partitioned kind is a collective over the engine's
data-parallel group: each rank calls it for the same parameters in the same order.

deepspeed is imported lazily, only once something already imported it: this module imports
without it."""
from __future__ import annotations

import gc
import sys
import warnings
from typing import Any

import torch

from .. import _collectives, _schema
from .._positions import Sampling
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
    """(engine.module, its named parameters that train, Zero) where `optimizer` is the inner
    (client) optimizer of a live DeepSpeedEngine's optimizer wrapper (ZeRO stage 1, 2 or 3,
    BF16_Optimizer, FP16_Optimizer, ... at any stage); else None."""
    for engine in engines():
        zero = getattr(engine, "optimizer", None)
        if zero is None or getattr(zero, "optimizer", None) is not optimizer:
            continue
        stage = int(engine.zero_optimization_stage())
        module = engine.module
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        return module, named, Zero(engine, stage)
    return None


# The wrappers' attributes that say where they keep the master copies, by kind (see the
# module's docstring): (the flat fp32 tensors or per-parameter copies, the model's parameters
# per group). Told apart by what they hold, not by class: the classes move between releases.
_KINDS = (
    ("zero3", "fp32_partitioned_groups_flat", "fp16_groups"),
    ("zero", "single_partition_of_fp32_groups", "bit16_groups"),
    ("bf16", "fp32_groups_flat_partition", "bf16_groups"),
    ("flat", "fp32_groups_flat", "fp16_groups"),
    ("copies", "fp32_groups", "fp16_groups"),
)


def kind_of(zero: Any) -> str:
    """Which of `_KINDS` a DeepSpeed optimizer wrapper is, or "other"."""
    for kind, masters, models in _KINDS:
        if isinstance(getattr(zero, masters, None), list) and isinstance(getattr(zero, models, None), list):
            return kind
    return "other"


class Zero:
    """One DeepSpeedEngine's optimizer wrapper: the full gradients the inner optimizer applies
    and the full fp32 weights, gathered from the ranks' partitions where it partitions them."""

    # Read in the inner optimizer's step hooks; "post" sees the same gradient as "pre" (the
    # optimizer leaves it) and is where session.py reads every other optimizer's.
    when = "post"

    def __init__(self, engine: Any, stage: int) -> None:
        self.engine = engine
        self.stage = stage
        self.name = getattr(_schema.Engine, f"DEEPSPEED_ZERO{stage}", _schema.Engine.DEEPSPEED_ZERO0)
        self.zero = engine.optimizer
        self.inner = engine.optimizer.optimizer
        self.kind = kind_of(self.zero)
        # What the trace cannot hold of this wrapper's run, each once (the header's warnings).
        self.warnings: list[str] = []
        if self.kind == "other":
            self.warnings.append(
                f"DeepSpeed: its optimizer wrapper {type(self.zero).__name__} (ZeRO stage {stage}) is not one the "
                "recorder knows: the gradients it applied are not recorded, only its steps, learning rates and "
                "final weights"
            )

    def warn(self, line: str) -> None:
        if line not in self.warnings:
            self.warnings.append(line)

    @property
    def gas(self) -> int:
        return int(self.engine.gradient_accumulation_steps())

    @property
    def clip(self) -> float:
        return float(self.engine.gradient_clipping() or 0.0)

    @property
    def partitioned(self) -> bool:
        """Each rank holds its own part of the master weights (gathered by collectives)."""
        return self.kind in ("zero", "zero3", "bf16")

    # -- where each parameter's gradient lives ------------------------------------------
    def _masters(self) -> list[list[torch.Tensor]]:
        """Per parameter group (sub-group at stage 3), the tensors the inner optimizer steps."""
        if self.kind == "other":
            return [list(g["params"]) for g in self.inner.param_groups]
        masters = getattr(self.zero, next(m for k, m, _ in _KINDS if k == self.kind))
        return [list(g) if self.kind == "copies" else [g] for g in masters]

    def _lp_groups(self) -> list[list[torch.nn.Parameter]]:
        """Per parameter group (sub-group at stage 3), the model's parameters it trains."""
        if self.kind == "other":
            return [[p for p in self.engine.module.parameters() if p.requires_grad]]
        return [list(g) for g in getattr(self.zero, next(m for k, _, m in _KINDS if k == self.kind))]

    def _where(self, param: torch.nn.Parameter) -> tuple[int, int, int] | None:
        """(its group, its index there, its offset in the group's flat tensor); None where
        the optimizer does not train it (a parameter left out of its groups)."""
        for i, group in enumerate(self._lp_groups()):
            offset = 0
            for j, p in enumerate(group):
                if p is param:
                    return i, j, offset
                offset += int(getattr(p, "ds_numel", None) or p.numel())
        return None

    def stepping(self, optimizer: torch.optim.Optimizer | None = None) -> list[torch.nn.Parameter]:
        """The model parameters whose gradients the inner optimizer's step now running
        applies: those of the (sub-)groups whose master copies it holds."""
        if self.kind == "other":
            return self._lp_groups()[0]
        opt = optimizer if optimizer is not None else self.inner
        held = {id(p) for g in opt.param_groups for p in g["params"]}
        out: list[torch.nn.Parameter] = []
        for masters, lp in zip(self._masters(), self._lp_groups()):
            if any(id(m) in held for m in masters):
                out.extend(lp)
        return out

    def lrs(self, optimizer: torch.optim.Optimizer) -> dict[int, float]:
        """{index of the user's parameter group: its learning rate} for the (sub-)groups the
        inner optimizer's step now running applies (stage 1/2 narrow `param_groups` to the
        one group stepping; stage 3 keeps them all and fills the stepping one's params; the
        other wrappers keep the user's groups, each holding its master copies)."""
        if self.kind not in ("zero", "zero3"):
            return {i: float(g["lr"]) for i, g in enumerate(optimizer.param_groups)}
        held = {id(p) for g in optimizer.param_groups for p in g["params"]}
        out: dict[int, float] = {}
        for i, (flat,) in enumerate(self._masters()):
            if id(flat) not in held:
                continue
            group = next(g for g in optimizer.param_groups if any(p is flat for p in g["params"]))
            key = int(self.zero.sub_group_to_group_id[i]) if self.stage == 3 else i
            out[key] = float(group["lr"])
        return out

    def settings(self, optimizer: torch.optim.Optimizer) -> dict[int, tuple[dict[str, Any], float | None]]:
        """As `lrs`, each stepping user group's settings (its dict less its flat `params`)
        and its count of model parameters where known (not at stage 3, whose sub-groups
        split the user's)."""
        lp = self._lp_groups() if self.kind != "other" else []
        if self.kind not in ("zero", "zero3"):
            same = len(lp) == len(optimizer.param_groups)
            return {
                i: ({k: v for k, v in g.items() if k != "params"}, float(len(lp[i])) if same else None)
                for i, g in enumerate(optimizer.param_groups)
            }
        held = {id(p) for g in optimizer.param_groups for p in g["params"]}
        out: dict[int, tuple[dict[str, Any], float | None]] = {}
        for i, (flat,) in enumerate(self._masters()):
            if id(flat) not in held:
                continue
            group = next(g for g in optimizer.param_groups if any(p is flat for p in g["params"]))
            key = int(self.zero.sub_group_to_group_id[i]) if self.stage == 3 else i
            count = float(len(lp[i])) if self.stage != 3 else None
            out[key] = ({k: v for k, v in group.items() if k != "params"}, count)
        return out

    def groups(self) -> int:
        """How many inner optimizer steps make one engine step: one per (sub-)group under
        ZeRO, one for all of them under the other wrappers."""
        return len(self._masters()) if self.kind in ("zero", "zero3") else 1

    # -- gathering ------------------------------------------------------------------------
    def full_grad(self, param: torch.nn.Parameter) -> torch.Tensor | None:
        """The full gradient the inner optimizer applies to `param` in the step now running
        (float32, CPU): averaged over the ranks, divided by gradient_accumulation_steps,
        unscaled and clipped. None where the parameter does not train, or the wrapper keeps
        it where this cannot read it ("other"; a fused step given its gradients as
        arguments). Under ZeRO, outside the inner step (its flat partition has no .grad) it
        falls back to deepspeed.utils.safe_get_full_grad: before the clipping, and at stage
        1/2 only between the boundary backward and engine.step(). Collective where the
        wrapper partitions the weights."""
        if not param.requires_grad or self.kind == "other":
            return None
        if self.kind == "zero3":
            sub, offset, numel = self.zero.grad_position[self.zero.get_param_id(param)]
            flat = self.zero.fp32_partitioned_groups_flat[sub]
            if flat.grad is None:
                return self._fallback_grad(param)
            part = flat.grad.narrow(0, offset, numel).float()
            return self.zero._fp32_state_allgather(param, part).detach().float().cpu().clone()
        where = self._where(param)
        if where is None:
            return None
        i, j, offset = where
        masters = self._masters()[i]
        if self.kind == "copies":
            g = masters[j].grad
            return None if g is None else g.detach().float().cpu().clone().view(param.shape)
        flat = masters[0]
        if self.kind == "flat":  # whole on every rank
            if flat.grad is None:
                self.warn(
                    f"DeepSpeed: {type(self.zero).__name__} stepped without its gradients in .grad (a fused "
                    "step given them as arguments): the gradients it applied are not recorded"
                )
                return None
            return flat.grad.narrow(0, offset, param.numel()).float().cpu().clone().view(param.shape)
        if flat.grad is None:
            return self._fallback_grad(param)
        # The buffer the partitions are summed in lives where the collective runs: beside the
        # model's parameters (a ZeRO-Offload partition is on the host, NCCL's world is not).
        full = torch.zeros(param.numel(), dtype=torch.float32, device=param.device)
        mapping = getattr(param, "_hp_mapping", None)
        if mapping is not None:
            hp, lp = mapping.hp_fragment_address, mapping.lp_fragment_address
            full.narrow(0, lp.start, lp.numel).copy_(flat.grad.narrow(0, hp.start, hp.numel))
        # Each element lives in exactly one rank's partition: the sum is the whole tensor.
        _collectives.all_reduce(full, group=self._dp_group(param, i))
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
        post-hook, the weight the step made for the (sub-)group that stepped. Collective
        where the wrapper partitions the weights."""
        where = self._where(param) if self.kind in ("flat", "copies") else None
        if where is not None:
            i, j, offset = where
            masters = self._masters()[i]
            w = masters[j] if self.kind == "copies" else masters[0].narrow(0, offset, param.numel())
            return w.detach().float().cpu().clone().view(param.shape)
        if self.kind in ("flat", "copies"):  # not the optimizer's: the model's own weight
            return param.detach().float().cpu().clone()
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
    """DeepSpeed behind the recorder's one interface: the engine names the model; each
    engine step's whole gradients are gathered in its inner optimizer's steps (one per
    (sub-)group under ZeRO, one in all under its other wrappers) and its whole weights kept
    on the host after it, so the trace is written at destroy_process_group or at exit
    without a collective (the engine may be gone)."""

    backward_hooks = False
    no_magnitudes = "DeepSpeed: no per-micro-batch magnitudes (its partitions are flat)"
    peaks_now = True  # from the host copies of this step, before the next step replaces them
    write_at_destroy = True
    whole_params = False  # its inner optimizer steps flat fp32 copies
    weights_replicated = False  # partitions, and its gradients come gathered

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
        # Each user group's settings, gathered as the learning rates are; the last step's.
        self._settings: dict[int, tuple[dict[str, Any], float | None]] = {}
        self._last: dict[int, tuple[dict[str, Any], float | None]] = {}

    @classmethod
    def find(cls, optimizer: torch.optim.Optimizer | None, params: list[torch.Tensor]) -> Engine | None:
        found = find_zero(optimizer) if optimizer is not None else None
        return None if found is None else cls(*found)

    @classmethod
    def setting_up(cls, optimizer: torch.optim.Optimizer | None) -> bool:
        # FP16_Optimizer and FP16_UnfusedOptimizer step their optimizer on zero gradients in
        # their __init__, inside DeepSpeedEngine.__init__: before the engine holds them.
        if "deepspeed" not in sys.modules:
            return False
        try:
            from deepspeed.runtime.engine import DeepSpeedEngine
        except Exception:  # noqa: BLE001 - a broken or partial install: not DeepSpeed's loop
            return False
        frame: Any = sys._getframe(1)
        while frame is not None:
            try:
                if frame.f_code.co_name == "__init__" and isinstance(frame.f_locals.get("self"), DeepSpeedEngine):
                    return True
            except Exception:  # noqa: BLE001 - a frame that will not be looked at: not the engine's
                pass
            frame = frame.f_back
        return False

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
        # The dtype its reductions run in (`communication_data_type`: the config's, else the
        # 16-bit dtype it trains in), where narrower than the float32 gradients it steps with.
        comm = getattr(self.zero.engine, "communication_data_type", None)
        if comm in (torch.bfloat16, torch.float16):
            facts[_schema.Key.REDUCE_DTYPE] = DTYPES[comm]
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
        try:
            self._settings.update(self.zero.settings(optimizer))
        except Exception:  # noqa: BLE001 - a wrapper laid out otherwise: no groups rows, training goes on
            pass
        self._calls += 1
        if self._calls < self.zero.groups():
            return None
        self._last, self._settings = self._settings, {}
        grads, lrs = self._grads, [lr for _, lr in sorted(self._lrs.items())]
        self._grads, self._lrs, self._calls = {}, {}, 0
        return grads, lrs

    def groups(self, optimizer: torch.optim.Optimizer) -> list[tuple[dict[str, Any], float | None]] | None:
        # ZeRO narrows `param_groups` to the group stepping: the user's, as its steps went.
        return [v for _, v in sorted(self._last.items())] if self._last else None

    def clipped(self) -> list[float] | None:
        """DeepSpeed's `gradient_clipping`: the global norm its step clipped by (of the
        averaged, unscaled gradients; its coefficient is max / (norm + 1e-6), as torch's), as
        the wrapper holds it while it steps (the engine copies it only after the step)."""
        try:
            clip = self.zero.clip
            norm = getattr(self.zero.zero, "_global_grad_norm", None) if clip > 0 else None
            return [float(norm), clip] if norm is not None else None
        except Exception:  # noqa: BLE001 - not recorded; the judge then reads no clip
            return None

    def after_step(self) -> None:
        self._whole = {n: self.zero.full_param(p) for n, p in self._named}  # collective

    def rank_checksums(self, sampled: bool) -> bool:
        return False  # its ranks hold partitions, and its gradients come gathered

    def warnings(self) -> list[str]:
        return list(self.zero.warnings)
