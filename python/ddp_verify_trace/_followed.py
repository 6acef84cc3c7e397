"""The recorder's facts beyond each step's gradients, as a part of `Recorder` (its base
class, on the recorder's own state): every optimizer's param groups per step (`groups`),
the other optimizers and their own parameters (`_extras.Others`), each rank's checksums of
the weights as each step found them (`rank_weights`, gathered in the step's one collective)
and at destroy_process_group (`rank_final`), the control run's nudge (`_perturb`), and
the engine's facts of each step.

Where the nudge goes: `session.Session` records a step in the optimizer's post-hook, once
the optimizer has applied it, so its pre-hook calls `before_step`, which nudges `.grad`
there (or after the closure a step is handed runs its backward); `TraceRecorder.step()` runs
before `optimizer.step()`, and `Recorder.step` nudges itself."""
from __future__ import annotations

import time
from typing import Any

import torch

from . import _collectives, _divisor, _extras, _groups, _perturb, _schema, engines
from ._args import rank_world
from ._positions import Sampling
from ._stages.exchange import all_gather
from ._detect import setting
from ._tensors import DTYPES, bits, host

K = _schema.Key
# Optimizer settings the bound on final weights needs (AdamW carries a gradient's allowance).
_SETTINGS = _schema.OPTIMIZER_SETTINGS


class Followed:
    """Recorder's methods for the facts above; the state is the Recorder's (`__init__`)."""

    engine: engines.Engine
    state: str
    _steps: int
    _params: list[tuple[str, torch.nn.Parameter]]
    _shapes: dict[str, tuple[int, ...]]
    _trained: set[str]
    _others: _extras.Others
    _sampling: Sampling
    _meta: dict[str, str]
    _tensors: dict[str, torch.Tensor]
    _warnings: list[str]
    _weights: tuple[int, list[str], torch.Tensor] | None
    _rank_final: tuple[int, list[str], torch.Tensor] | None
    _perturb: float | None
    _nudged: int
    _last_step: float | None
    _watch: Any
    _dtype: torch.dtype

    def other_stepping(self, optimizer: torch.optim.Optimizer) -> None:
        """Another optimizer is about to step: its groups join each step's `groups` rows, and
        its parameters outside the module are recorded (`_extras.Others`), their gradients as
        this step of theirs finds them, for the window it closes: the recorded optimizer's
        step to come where a backward ran since its last, else its last."""
        try:
            self._others.saw(optimizer)
            window = self._steps if self._watch.batches.rows else max(self._steps - 1, 0)
            if rank_world()[0] == 0:  # only rank 0 writes
                for n, g in self._others.taken(optimizer).items():
                    self._tensors[_schema.name("grads", window, n)] = host(g)
        except Exception as e:  # noqa: BLE001 - not followed, said so; training goes on
            self._warn(f"the optimizer {type(optimizer).__name__} that also stepped is not followed: {e}")

    def _warn(self, line: str) -> None:
        if line not in self._warnings:
            self._warnings.append(line)

    def before_step(self, args: Any = (), kwargs: Any = None) -> tuple[Any, Any] | None:
        """In the recorded optimizer's pre-hook, before it applies the step: the weights'
        checksums as the step finds them, and in a control run the nudge. Where the step was
        handed a closure (whose backward makes the gradients inside the step), the closure
        is wrapped to nudge after it, and the (args, kwargs) to step with are returned."""
        self._take_weights()
        if self._perturb is None or self._nudged == self._steps:
            return None
        if not self.engine.whole_params:
            self._warn(f"{_schema.PERTURB_ENV}: the engine steps its own copies of the gradients: not perturbed")
            return None
        # As torch's pre-hooks see them: the optimizer first, then step's own arguments.
        args, kwargs = tuple(args), dict(kwargs or {})
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
        if not callable(closure):
            self._nudge()
            return None

        def nudged() -> Any:
            loss = closure()
            self._nudge()  # once a step, however often the optimizer runs the closure
            return loss

        if "closure" in kwargs:
            kwargs["closure"] = nudged
        else:
            args = (args[0], nudged, *args[2:])
        return args, kwargs

    def _nudge(self) -> None:
        """The control run's nudge of every recorded gradient, before the step reads them
        and the optimizer applies them (`_perturb`)."""
        if self._perturb is None or self._nudged == self._steps:
            return
        grads = [p.grad for _, p in self._params if p.grad is not None]
        if not grads:  # none made yet: `step()` says whether it can still nudge them
            return
        self._nudged = self._steps
        with torch.no_grad():
            _perturb.nudge(grads, self._steps, self._perturb)
        self._meta[K.PERTURBED] = repr(self._perturb)

    def _take_weights(self) -> None:
        """Each followed parameter's weight checksum on this rank, as the step about to be
        recorded finds them; gathered with the step's own collective (`_gather`)."""
        if self._weights is not None and self._weights[0] == self._steps:
            return
        self._weights = None
        world = rank_world()[1]
        if self._watch.start_weights:  # the weights as the first forward found them
            self._meta[K.START_WEIGHTS] = self._watch.start_weights
        if world > 1 and self.engine.weights_replicated and self.engine.rank_checksums(bool(self._sampling.positions)):
            self._weights = (self._steps, *self._weight_bits())

    def _weight_bits(self) -> tuple[list[str], torch.Tensor]:
        """(the parameters checksummed: those that train and the other optimizers' own; one
        int64 per followed parameter, 0 for the rest, so every rank sends as many)."""
        device = self.engine.device(self._params[0][1])
        zero = torch.zeros((), dtype=torch.int64, device=device)
        names, parts = [], []
        for n, p in self._params + self._others.params:
            if n in self._trained or p.requires_grad or n in self._others.peaks:
                names.append(n)
                parts.append(bits(self.engine.weight(n, p) if n in self._shapes else p.detach()).to(device))
            else:
                parts.append(zero)
        return names, torch.stack(parts)

    def _final_checksums(self) -> None:
        """destroy_process_group, every rank here with the process group still alive: each
        rank's checksum of the final weights (`rank_final`), written at close. Not at an
        explicit close or at exit, where one rank may close alone (its gather would hang)."""
        if self.state != "open" or not self._steps:
            return
        try:
            world = rank_world()[1]
            if world <= 1 or not self.engine.rank_checksums(bool(self._sampling.positions)):
                return
            names, mine = self._weight_bits()
            self._rank_final = (self._steps, names, all_gather(mine, world))
        except Exception as e:  # noqa: BLE001 - no rank_final, said so; the run goes on
            self._warn(f"rank_final: the ranks' final weights could not be gathered ({type(e).__name__}: {e})")
        finally:
            _collectives.settle()

    def _groups(self, s: int, optimizer: torch.optim.Optimizer, lrs: list[float]) -> None:
        """Step `s`'s `groups` rows: every optimizer seen stepping, the recorded one first,
        with each group's settings now (a scheduler may have moved any of them)."""
        try:
            main = self.engine.groups(optimizer)
            if main is None:
                main = [(g, None) for g in optimizer.param_groups]
                if len(lrs) == len(main):  # the rates the step ran with, where they differ
                    main = [({**g, "lr": lr}, None) for (g, _), lr in zip(main, lrs)]
            every = [main] + [[(g, None) for g in o.param_groups] for o in self._others.optimizers]
            rows = _groups.rows(every)
            if rows.numel():
                self._tensors[_schema.name("groups", s)] = rows
        except Exception as e:  # noqa: BLE001 - no rows this step, said so; training goes on
            self._warn(f"groups: the optimizers' param groups could not be read ({type(e).__name__}: {e})")

    def _nudge_at_step(self, gathered: bool, after: bool) -> None:
        """In `step()`: the nudge where the pre-hook did not make it, if it can still be
        applied (the gradients the optimizer reads, before it reads them); else a warning."""
        if self._perturb is None or self._nudged == self._steps:
            return
        if gathered:
            self._warn(f"{_schema.PERTURB_ENV}: the engine hands the step gradients it gathered: not perturbed")
        elif after:
            self._warn(f"{_schema.PERTURB_ENV}: a step was recorded after the optimizer applied it: not perturbed")
        else:
            self._nudge()

    def _keep_columns(self, every: torch.Tensor, names: list[str], label: Any) -> None:
        """Each named parameter's column of `every` ([W, followed]: its checksum on each
        rank), one row each of one transposed copy."""
        at = {n: i for i, (n, _) in enumerate(self._params + self._others.params)}
        columns = every.t().contiguous()
        for n in names:
            self._tensors[label(n)] = columns[at[n]]

    def _settings(self, optimizer: torch.optim.Optimizer) -> None:
        if K.OPTIMIZER in self._meta:
            return
        group = optimizer.param_groups[0]
        self._meta[K.OPTIMIZER] = type(optimizer).__name__
        for key in _SETTINGS:
            value = setting(group.get(key))
            if value is not None:
                self._meta[key] = value

    def _engine_facts(self, s: int, world: int, reduced: list[bool]) -> None:
        """What synchronised the step's gradients and at what cost: the engine, its facts
        (its divide factor), the compute dtype, the step's gradient collectives and bytes
        (one rank's) and the seconds since the previous step."""
        now = time.perf_counter()
        if self._last_step is not None:
            self._tensors[_schema.name("seconds", s)] = torch.tensor([now - self._last_step], dtype=torch.float64)
        self._last_step = now
        collectives, nbytes = self._watch.take_comm()
        w = self._watch
        if w.engine is not None and world > 1:
            self._meta[K.ENGINE] = w.engine
            self._tensors[_schema.name("comm", s)] = torch.tensor([collectives, nbytes], dtype=torch.int64)
        self._meta.update(self.engine.step_facts(w, world, reduced))
        if w.compute_dtype is not None and w.compute_dtype != self._dtype and w.compute_dtype in DTYPES:
            self._meta[K.COMPUTE_DTYPE] = DTYPES[w.compute_dtype]
        if w.autocast in DTYPES:
            self._meta[K.AUTOCAST] = DTYPES[w.autocast]
            if w.autocast_mixed:
                self._warn("autocast ran some outermost forwards and not others (or in another dtype)")
        control = _divisor.ACTIVE
        if control is not None:
            self._meta[K.DIVISOR_CONTROL] = repr(control.by)
        if _divisor.WARNING:
            self._warn(_divisor.WARNING)
