"""What a framework that calls optimizer.step() for the user adds to a run, behind one
interface: which of the calling frames are its own (so the header names it), the callback a
user may pass it instead of `record()`, and the places it divides the loss or gates the
optimizer step, which it patches to watch (`patch`).

A new framework is one module in this folder and one line in the registry
(`frameworks/__init__.py`), plus its word in the Rust `Framework` vocabulary."""
from __future__ import annotations

from typing import Any, Callable

from ..engines.base import Patches

# Makes the recording a callback starts: (path, record()'s keyword arguments) -> Session.
SessionMaker = Callable[[Any, dict[str, Any]], Any]


class Framework:
    """One framework."""

    # The header's `framework` word (`_schema.Framework`).
    name: str = ""
    # Its Python packages: an optimizer step called from inside them is the framework's.
    modules: tuple[str, ...] = ()
    # The names its callback is exported under from `ddp_verify_trace` (the first is the
    # class's own; the rest deprecated aliases).
    callback_names: tuple[str, ...] = ()

    def owns(self, module: str) -> bool:
        return any(module == m or module.startswith(m + ".") for m in self.modules)

    def callback(self, session: SessionMaker) -> type | None:
        """The callback class a user passes to the framework, recording from the start of
        training to its end; built on first use (importing the framework), or None."""
        return None

    @staticmethod
    def patch(patches: Patches) -> None:
        """Installs what the framework adds around the step: its own division of the loss
        and its step gating (where it skips or repeats optimizer.step()), as facts for the
        watch; undone with the engines' patches."""
