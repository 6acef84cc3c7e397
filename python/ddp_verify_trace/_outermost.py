"""Outermost module calls, where the stage facts read each micro-batch's samples and loss:
every call of a module with trainable parameters, under grad mode, that no such call is
under way around (its inputs' fingerprint, its `num_items_in_batch`, the loss it returned).

Until the first optimizer step, `torch.nn.Module.__call__` is patched to find them; from
then on only the modules found so far carry a forward pre-hook and hook of their own, and
the class is given its `__call__` back. The patch costs every inner module call a Python
frame (about 3% of a small model's forward and backward); a module's own hooks cost its
outermost call alone. A trained module first called as an outermost one after the first
step is not seen (nor its samples' fingerprint): the step's loop has shown its models."""
from __future__ import annotations

import sys
import weakref
from typing import Any, Callable

import torch

from . import _divisor, _owners
from ._stages.fingerprint import seen
from ._stages.loss import forward_loss, normaliser


# Each trained module's parameters' device type, by module: found at its first outermost call.
_DEVICES: weakref.WeakKeyDictionary[torch.nn.Module, str] = weakref.WeakKeyDictionary()


def autocast_of(module: torch.nn.Module) -> torch.dtype | None:
    """The dtype autocast runs this forward in on its parameters' device (None: off), read
    from torch's own state, so every framework's switch (Lightning's precision, Accelerate's
    mixed_precision, Trainer's bf16) is seen alike."""
    device = _DEVICES.get(module)
    if device is None:  # a module's parameters are walked once (microseconds a forward)
        p = next(module.parameters(), None)
        device = _DEVICES[module] = p.device.type if p is not None else "cpu"
    try:
        if torch.is_autocast_enabled(device):  # torch >= 2.4 takes the device type
            return torch.get_autocast_dtype(device)
        return None
    except (TypeError, AttributeError, RuntimeError):
        pass
    if device == "cpu":
        return torch.get_autocast_cpu_dtype() if torch.is_autocast_cpu_enabled() else None
    return torch.get_autocast_gpu_dtype() if torch.is_autocast_enabled() else None


class Outer:
    """The outermost calls' state, shared by the class patch and the modules' own hooks."""

    def __init__(self, watches: Callable[[], list[Any]]) -> None:
        self._watches = watches
        self.depth = 0  # outermost calls under way (0 or 1 unless one is re-entered)
        self.learning = True  # the class patch finds them; False: the modules' own hooks
        self._seen: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
        self._trained: weakref.WeakKeyDictionary[torch.nn.Module, bool] = weakref.WeakKeyDictionary()
        self._handles: list[Any] = []
        # Per hooked call under way, innermost last: (its module's id, what `enter` said).
        self._calls: list[tuple[int, bool | None]] = []
        # The outermost call's precision: autocast's dtype as it began, or of an autocast
        # entered inside it (Accelerate's prepared forward enters its own).
        self._precision: torch.dtype | None = None

    def autocast_entered(self, dtype: torch.dtype | None) -> None:
        """An autocast context was entered (`dtype`: None where disabled): inside an outermost
        call, its forward runs in it."""
        if self.depth and dtype is not None and self._precision is None:
            self._precision = dtype

    def enter(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], frame: Any) -> bool | None:
        """An outermost call starts: None where it is not one (an inner call, no watch, no
        grad, compiling), else whether its module trains (its facts taken)."""
        if self.depth or torch.compiler.is_compiling() or not torch.is_grad_enabled():
            return None
        watches = self._watches()
        if not watches:
            return None
        self.depth += 1
        # A module carrying the hooks was found training (`learned`): no lookup.
        trained = True if not self.learning else self._trained.get(module)
        if trained is None:
            trained = self._trained[module] = any(p.requires_grad for p in module.parameters())
        if not trained:
            return False
        try:
            if self.learning:
                self._seen.add(module)
            fp = seen(args, kwargs)
            norm = normaliser(kwargs)
            who = _owners.caller(frame) if norm is not None else None
            self._precision = autocast_of(module)
            if _divisor.ACTIVE is not None:
                _divisor.ACTIVE.hook(module)
            for watch in watches:
                if watch.start_weights is None:
                    watch.take_start(module)
                watch.batches.forward(fp, norm, who)
                watch.hook_local(module)
        except Exception:  # noqa: BLE001 - a fact not taken; the forward goes on
            pass
        return True

    def leave(self, trained: bool, out: Any) -> None:
        """The outermost call `enter` counted ended (`out`: what it returned, None if it raised)."""
        self.depth -= 1
        if trained and out is not None:
            try:
                loss = forward_loss(out)
                for watch in self._watches():
                    watch.autocast_seen(self._precision)
                    watch.batches.precision(self._precision)
                    watch.batches.returned(loss)
            except Exception:  # noqa: BLE001 - a fact not taken; training goes on
                pass

    def learned(self) -> bool:
        """The first optimizer step: the modules found carry their own hooks from now on.
        False where none was found yet, or this torch lacks the hooks' `always_call`."""
        if not self.learning or not len(self._seen):
            return False
        try:
            for m in list(self._seen):
                self._handles.append(m.register_forward_pre_hook(self._pre, prepend=True, with_kwargs=True))
                self._handles.append(m.register_forward_hook(self._post, prepend=True, with_kwargs=True, always_call=True))
        except TypeError:  # torch before 2.1
            self._remove()
            return False
        self.learning = False
        return True

    def _pre(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            self._calls.append((id(module), self.enter(module, args, kwargs, sys._getframe(1))))
        except Exception:  # noqa: BLE001 - never in the forward's way
            pass

    def _post(self, module: torch.nn.Module, args: Any, kwargs: Any, out: Any) -> None:
        # Torch calls an always-called hook even where an earlier pre-hook raised before
        # ours ran: only the call that `_pre` saw is taken off.
        if self._calls and self._calls[-1][0] == id(module):
            trained = self._calls.pop()[1]
            if trained is not None:
                self.leave(trained, out)

    def _remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def reset(self) -> None:
        """The last watch closed: the modules' hooks come off, and finding starts again."""
        self._remove()
        self.learning = True
        self._seen = weakref.WeakSet()
        self._calls = []
        self.depth = 0
