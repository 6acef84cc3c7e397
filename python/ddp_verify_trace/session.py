"""Recording without edits to the loop: global optimizer-step hooks find the model at its
first step and record every step after accumulation and the all-reduce, whoever calls
optimizer.step() (a plain loop, Trainer, Lightning, Accelerate, Colossal-AI).

The gradient is taken in the step's post-hook: frameworks that pass a closure (Lightning)
run the last micro-batch's backward and the clipping inside optimizer.step(), after the
pre-hook; the optimizers leave `.grad` as they applied it. The weights' peaks and checksums
are taken in the pre-hook, before the step moves them, and the control run's nudge is made
there (after a closure's backward, by wrapping the closure): see `Recorder.before_step`.

A session changes nothing in torch or Python that it does not undo: the patches (`_patches`),
the step hooks, the tensor hooks, an exit handler, and from its first step a sys.excepthook
are all taken out when it closes, is abandoned, or the interpreter exits with it open.

A session never breaks the training it watches: an exception inside any of its hooks stops
the recording (one warning line on stderr, starting `STOPPED`; no trace is written, and
ddp-verify quotes the line), and the step, backward or exit it happened in goes on.

Where engines differ (an optimizer stepping flat partitions once per parameter group, whose
engine names the model; gathers that need the process group alive), the session asks the
run's engine (`engines/`), found at the first step: it names no engine itself."""
from __future__ import annotations

import atexit
import functools
import gc
import sys
import warnings
from types import TracebackType
from typing import Any, Callable

import torch

from . import _owners, _schema, _torch_patches, _watch, engines
from ._args import Magnitudes, PathLike, Sample, check_magnitudes, check_path, check_sample
from ._detect import owner, unwrap
from ._magnitudes import add_backward
from .recorder import Recorder


# What a stopped recording prints, once, on stderr: ddp-verify looks for it in a leg's log.
STOPPED = _schema.STOPPED


def _never_raises(method: Callable[..., Any]) -> Callable[..., Any]:
    """A hook of the session's: an exception in it stops the recording, never the training."""

    @functools.wraps(method)
    def guarded(self: Session, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except Exception as e:  # noqa: BLE001 - the user's run goes on, whatever the recorder met
            self._stop(method.__name__, e)
            return None

    return guarded


class Session:
    """One recording: hooks installed by `start`, the trace written by `close` (or at exit).
    Its arguments are checked here, at the call: a wrong one stops the script before it
    trains, not inside its first optimizer step. `sample`: the Recorder's (N, "auto" or None
    for whole); record() resolves DDP_VERIFY_SAMPLE before it comes here. The hooks set
    before the first step know no positions yet: they keep what `magnitudes` says, and the
    recorder turns that into per-element magnitudes at the positions then (take_sums)."""

    def __init__(
        self,
        path: PathLike,
        *,
        overwrite: bool = False,
        magnitudes: Magnitudes = True,
        meta: dict[str, str] | None = None,
        model: torch.nn.Module | None = None,
        sample: Sample = None,
    ) -> None:
        self.path = check_path(path, overwrite)
        self._kw: dict[str, Any] = dict(
            overwrite=overwrite, magnitudes=check_magnitudes(magnitudes), sample=check_sample(sample)
        )
        self._meta = dict(meta or {})
        self._model = model
        self._optimizer: torch.optim.Optimizer | None = None
        self.recorder: Recorder | None = None
        self._state = "new"  # then "started", then "ended"
        self._watch: _watch.Watch | None = None
        self._handles: list[Any] = []
        # Before the model is known: magnitudes of each backward, by parameter identity.
        self._early: dict[int, Any] = {}
        self._early_counts: dict[int, int] = {}
        self._early_hooks: list[Any] = []
        # (our sys.excepthook, the one it replaced), from the first step; set when it ran.
        self._excepthook: tuple[Callable[..., None], Callable[..., None]] | None = None
        self._crashed = False

    def start(self) -> Session:
        """Hooks every optimizer step from now on; the first one says which model is recorded."""
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        if self._state != "new":
            raise RuntimeError(f"ddp_verify_trace: the recording to {self.path} was started before: start a new one")
        self._state = "started"
        # Before training: the first epoch's set_epoch, clips, DDP forwards and skipped steps
        # are seen, and the first step's clips and forwards are counted from here.
        self._watch = _torch_patches.open_watch()
        self._watch.on_skip = self._skipped
        self._watch.on_optimizer = self._hook_early
        self._handles = [register_optimizer_step_pre_hook(self._pre), register_optimizer_step_post_hook(self._post)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for obj in gc.get_objects():
                if isinstance(obj, torch.optim.Optimizer):
                    self._hook_early(obj)
        atexit.register(self._at_exit)
        return self

    def _stop(self, where: str, e: BaseException) -> None:
        """Ends the recording after an exception in `where`: hooks out, nothing written."""
        steps = self.recorder.steps if self.recorder is not None else 0
        print(
            f"{STOPPED} at optimizer step {steps} (in {where.strip('_')}): {type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}; the training goes on unrecorded, and no trace is "
            "written",
            file=sys.stderr,
            flush=True,
        )
        try:
            self._end(f"stopped by {type(e).__name__} in {where}")
        except Exception:  # noqa: BLE001 - as much as can be undone is undone
            pass

    @_never_raises
    def _hook_early(self, opt: torch.optim.Optimizer) -> None:
        """Hooks every parameter of an optimizer that exists or is built before the first
        step, so that step's micro-batch magnitudes are kept before the model is known."""
        if self.recorder is not None or self._optimizer is not None:
            return
        for group in getattr(opt, "param_groups", []):
            for p in group["params"]:
                if p.requires_grad and id(p) not in self._early_counts:
                    self._early_counts[id(p)] = 0
                    self._early_hooks.append(p.register_hook(self._early_hook(id(p))))

    def _early_hook(self, key: int) -> Callable[[torch.Tensor], None]:
        how = self._kw["magnitudes"]
        return lambda grad: self._early_backward(key, grad, how)

    @_never_raises
    def _early_backward(self, key: int, grad: torch.Tensor, how: Any) -> None:
        add_backward(self._early, self._early_counts, key, grad, how)

    @_never_raises
    def _pre(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
        if self._optimizer is None:
            if engines.setting_up(optimizer):  # an engine's own step while it is built: not training
                return None
            self._begin(optimizer)
        if optimizer is not self._optimizer and self.recorder is not None:
            self.recorder.other_stepping(optimizer)
            return None
        if optimizer is self._optimizer and self.recorder is not None:
            self.recorder.settle()
            # Before the optimizer applies the step: the weights as it finds them, and the
            # control run's nudge (a closure handed to the step comes back wrapped).
            return self.recorder.before_step(args, kwargs)
        return None

    @_never_raises
    def _skipped(self, optimizer: torch.optim.Optimizer, scale: float) -> None:
        # A GradScaler found inf/NaN and skipped the step: recorded as a step all the same,
        # as ddp-verify's own runs record it, so both runs' skips line up.
        if self._optimizer is None:
            self._begin(optimizer)
        if optimizer is self._optimizer and self.recorder is not None and self.recorder.state == "open":
            self.recorder.settle()
            self.recorder.track_peaks()
            self.recorder.step(optimizer, skipped=True)

    @_never_raises
    def _post(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        # The weights this step made are seen by the next step's pre-hook, or by close().
        rec = self.recorder
        if rec is None:
            return
        if optimizer is not self._optimizer:
            return
        # The engine's whole gradients where it gathers them (in each of its inner steps),
        # once its step is over; else the parameters' .grad, read now.
        applied = rec.engine.applied(optimizer)
        if applied is None:
            return
        grads, lrs = applied
        rec.step(optimizer, grads=grads, lrs=lrs, after=True)
        rec.engine.after_step()
        rec.track_peaks(later=True)

    def _begin(self, optimizer: torch.optim.Optimizer) -> None:
        meta = {
            _schema.Key.FRAMEWORK: _owners.framework(sys._getframe(1)),
            _schema.Key.RECORDED_BY: "optimizer step hooks",
            **self._meta,
        }
        every = [p for g in optimizer.param_groups for p in g["params"]]
        params = [p for p in every if p.requires_grad]
        engine = engines.find(optimizer, params)
        # An engine whose optimizer steps tensors no module holds (flat partitions) says
        # which model they train; else the model is the one holding them.
        known = engine.model()
        if known is not None:
            model, named = known
        else:
            # Its frozen parameters too: the recorder follows those a later step unfreezes.
            model = unwrap(self._model) if self._model is not None else owner(every)
            if model is None:
                raise RuntimeError("ddp_verify_trace: no nn.Module holds the optimizer's parameters; pass model=")
            ids = {id(p) for p in params}
            named = [(n, p) for n, p in model.named_parameters() if id(p) in ids]
        self.recorder = Recorder(model, self.path, meta=meta, params=named, watch=self._watch, engine=engine, **self._kw)
        self._optimizer = optimizer
        names = {id(p): n for n, p in self.recorder.params}
        self.recorder.take_sums(
            {names[k]: v for k, v in self._early.items() if k in names},
            {names[k]: v for k, v in self._early_counts.items() if k in names and v},
        )
        for h in self._early_hooks:
            h.remove()
        self._early_hooks, self._early, self._early_counts = [], {}, {}
        if self._watch is not None:
            self._watch.on_optimizer = None
            # Written while the process group lives where the engine says so.
            if engine.write_at_destroy:
                self._watch.on_destroy = self._destroyed
        self._catch_crash()

    def _catch_crash(self) -> None:
        """An exception that ends the script leaves no trace at exit. Set at the first step,
        over whatever hook the script's imports set (some replace it without chaining)."""
        previous = sys.excepthook

        def excepthook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
            self._crashed = True
            previous(kind, value, tb)

        sys.excepthook = excepthook
        self._excepthook = (excepthook, previous)

    @_never_raises
    def _destroyed(self) -> None:
        rec = self.recorder
        if rec is not None and rec.state == "open" and rec.steps and not self._crashed:
            self._end(None)

    @_never_raises
    def _at_exit(self) -> None:
        # A trace on disk is a run that finished: written where the run stepped, nothing
        # closed it and no exception ended the script; the streamed part goes otherwise.
        rec = self.recorder
        if rec is not None and rec.state == "open" and rec.steps and not self._crashed:
            self._end(None, at_exit=True)
        else:
            self._end("abandoned at exit", at_exit=True)

    def _end(self, why: str | None, at_exit: bool = False) -> None:
        """Undoes everything `start` and the first step did, then writes the trace (`why`
        None) or abandons it."""
        for h in self._handles + self._early_hooks:
            h.remove()
        self._handles, self._early_hooks = [], []
        if self._watch is not None:
            self._watch.close()
        if self._excepthook is not None:
            ours, previous = self._excepthook
            if sys.excepthook is ours:  # not where another hook was set over it since
                sys.excepthook = previous
            self._excepthook = None
        if not at_exit:  # atexit runs the handler now; removing it there is not needed
            atexit.unregister(self._at_exit)
        self._state = "ended"
        if self.recorder is not None and self.recorder.state == "open":
            if why is None:
                self.recorder.close()
            else:
                self.recorder.finish(why)

    def close(self) -> None:
        """Writes the trace (rank 0) and removes the hooks; nothing is written without a step."""
        self._end(None)

    def abandon(self, why: str) -> None:
        """Writes nothing (a streamed part is removed) and removes the hooks."""
        self._end(why)

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # A run that raised is no run to compare: nothing is written (and the exception goes on).
        if exc_type is None:
            self.close()
        else:
            self.abandon("abandoned by an exception in its with block")
