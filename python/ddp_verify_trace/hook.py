"""Recording without edits to the loop: global optimizer-step hooks find the model at its
first step and record every step after accumulation and the all-reduce, whoever calls
optimizer.step() (a plain loop, Trainer, Lightning, Accelerate, Colossal-AI).

The gradient is taken in the step's post-hook: frameworks that pass a closure (Lightning)
run the last micro-batch's backward and the clipping inside optimizer.step(), after the
pre-hook; the optimizers leave `.grad` as they applied it. The weights' peaks are taken in
the pre-hook, before the step moves them."""
import gc
import os
import warnings

import torch

from .recorder import Recorder, _framework, add_backward, close_at_exit, unwrap


def _owner(params):
    """The innermost module that holds every parameter the optimizer steps: the user's model
    inside any wrapper (DDP, Lightning's module, Accelerate's), so both runs name alike."""
    want = {id(p) for p in params}
    covering = []
    # Some objects warn when merely looked at (deprecated proxies such as dist.reduce_op).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            try:
                if isinstance(obj, torch.nn.Module):
                    have = {id(p) for p in obj.parameters()}
                    if want <= have:
                        covering.append((len(have), obj))
            except ReferenceError:
                continue
    if not covering:
        return None
    fewest = min(n for n, _ in covering)
    tied = [m for n, m in covering if n == fewest]
    # Among modules holding the same parameters, the one none of the others is inside.
    inner = [m for m in tied if not any(o is not m and any(c is o for c in m.modules()) for o in tied)]
    return unwrap((inner or tied)[0])


class Session:
    """One recording: hooks installed by `start`, the trace written by `close` (or at exit)."""

    def __init__(self, path, *, overwrite=False, magnitudes=True, meta=None, model=None):
        self.path = os.fspath(path)
        self._kw = dict(overwrite=overwrite, magnitudes=magnitudes)
        self._meta = dict(meta or {})
        self._model = model
        self._optimizer = None
        self.recorder = None
        self._handles = []
        # Before the model is known: magnitudes of each backward, by parameter identity.
        self._early = {}
        self._early_counts = {}
        self._early_hooks = []

    def start(self):
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        from . import _clip

        # Before training: the first epoch's set_epoch, clips, DDP forwards and skipped steps
        # are seen, and the first step's clips and forwards are counted from here.
        state = _clip.install()
        state.on_skip = self._skipped
        self._marks = (state.calls, len(state.ddp_syncs))
        self._handles = [register_optimizer_step_pre_hook(self._pre), register_optimizer_step_post_hook(self._post)]
        self._watch_new_optimizers()
        return self

    def _watch_new_optimizers(self):
        """Hooks every parameter of each optimizer that exists or is built from now on, so the
        first step's micro-batch magnitudes are kept before the model is known."""
        original = torch.optim.Optimizer.__init__
        session = self

        def __init__(opt, *args, **kwargs):
            original(opt, *args, **kwargs)
            session._watch(opt)

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for obj in gc.get_objects():
                if isinstance(obj, torch.optim.Optimizer):
                    self._watch(obj)

        __init__.__wrapped__ = original
        torch.optim.Optimizer.__init__ = __init__

        def restore():
            # Only our own patch is undone, and only once.
            if torch.optim.Optimizer.__init__ is __init__:
                torch.optim.Optimizer.__init__ = original

        self._restore_init = restore

    def _watch(self, opt):
        if self.recorder is not None or self._optimizer is not None:
            return
        for group in getattr(opt, "param_groups", []):
            for p in group["params"]:
                if p.requires_grad and id(p) not in self._early_counts:
                    self._early_counts[id(p)] = 0
                    self._early_hooks.append(p.register_hook(self._early_hook(id(p))))

    def _early_hook(self, key):
        how = {True: "element"}.get(self._kw["magnitudes"], self._kw["magnitudes"])
        return lambda grad: add_backward(self._early, self._early_counts, key, grad, how)

    def _pre(self, optimizer, args, kwargs):
        if self._optimizer is None:
            self._begin(optimizer)
        if optimizer is self._optimizer:
            self.recorder.settle()

    def _skipped(self, optimizer, scale):
        # A GradScaler found inf/NaN and skipped the step: recorded as a step all the same,
        # as ddp-verify's own runs record it, so both runs' skips line up.
        if self._optimizer is None:
            self._begin(optimizer)
        if optimizer is self._optimizer and self.recorder.state == "open":
            self.recorder.settle()
            self.recorder.track_peaks()
            self.recorder.step(optimizer, skipped=True)

    def _post(self, optimizer, args, kwargs):
        # The weights this step made are seen by the next step's pre-hook, or by close().
        if optimizer is not self._optimizer and self.recorder is not None:
            self.recorder.saw_other_optimizer(optimizer)
        if optimizer is self._optimizer:
            self.recorder.step(optimizer)
            self.recorder.track_peaks(later=True)

    def _begin(self, optimizer):
        params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
        model = unwrap(self._model) if self._model is not None else _owner(params)
        if model is None:
            raise RuntimeError("ddp_verify_trace: no nn.Module holds the optimizer's parameters; pass model=")
        ids = {id(p) for p in params}
        named = [(n, p) for n, p in model.named_parameters() if id(p) in ids]
        self._optimizer = optimizer
        meta = {"framework": _framework(), "recorded_by": "optimizer step hooks", **self._meta}
        self.recorder = Recorder(model, self.path, meta=meta, params=named, **self._kw)
        self.recorder.count_from(*self._marks)
        names = {id(p): n for n, p in named}
        self.recorder.take_sums(
            {names[k]: v for k, v in self._early.items() if k in names},
            {names[k]: v for k, v in self._early_counts.items() if k in names and v},
        )
        for h in self._early_hooks:
            h.remove()
        self._early_hooks, self._early, self._early_counts = [], {}, {}
        self._restore_init()
        close_at_exit(self.recorder)

    def _unhook(self):
        for h in self._handles + self._early_hooks:
            h.remove()
        self._handles, self._early_hooks = [], []
        self._restore_init()
        from . import _clip

        if _clip.install().on_skip == self._skipped:
            _clip.install().on_skip = None

    def close(self):
        """Writes the trace (rank 0) and removes the hooks; nothing is written without a step."""
        self._unhook()
        if self.recorder is not None and self.recorder.state == "open":
            self.recorder.close()

    def abandon(self, why):
        self._unhook()
        if self.recorder is not None and self.recorder.state == "open":
            self.recorder.finish(why)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        # A run that raised is no run to compare: nothing is written.
        if exc_type is None:
            self.close()
        else:
            self.abandon("abandoned by an exception in its with block")
        return False
