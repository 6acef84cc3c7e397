"""What a framework that calls optimizer.step() for the user adds to a run, behind one
interface: which of the calling frames are its own (so the header names it), the callback a
user may pass it instead of `record()`, and the places it divides the loss or gates the
optimizer step, which it patches to watch (`patch`).

A new framework is one module in this folder and one line in the registry
(`frameworks/__init__.py`), plus its word in the Rust `Framework` vocabulary."""
from __future__ import annotations

import sys
from typing import Any, Callable

from .. import _owners, _schema
from .._patches import Patches

# (module, class, method): a framework's API a script hands its loss to (first argument).
Api = tuple[str, str, str]
# (module, class, method, the accumulation steps it was told, read from the wrapper or None).
Wrapper = tuple[str, str, str, Callable[[Any], Any]]

# (module, class, method, reader): where a framework plans the run's optimizer steps; the
# reader takes the call's arguments (self first) and returns the plan's header facts (`plan`'s
# where it planned the steps; none where the script set them itself), `planned_by` added here.
Planner = tuple[str, str, str, Callable[..., Any]]

# The plan this process's framework made, as header facts (`planned`): it is made before
# the first step, before a recording may have started.
_PLAN: dict[str, str] = {}

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

    def callback(self, session: SessionMaker) -> type | None:
        """The callback class a user passes to the framework, recording from the start of
        training to its end; built on first use (importing the framework), or None."""
        return None

    # Where it takes the loss to run backward (its own division of the loss happens there).
    backward_apis: tuple[Api, ...] = ()
    # Its optimizer wrappers' step: the script calls it every micro-batch, and the framework
    # gates the real step.
    step_wrappers: tuple[Wrapper, ...] = ()
    # Where a script marks its engine's accumulation boundary by hand: several backwards per
    # engine step are then the engine's documented use, not a script that misread its setting.
    boundary_setters: tuple[Api, ...] = ()
    # Where it plans the run's optimizer steps from its loader (its epoch arithmetic).
    planners: tuple[Planner, ...] = ()

    def patch(self, patches: Patches) -> None:
        """Installs what the framework adds around the step: the loss handed to its backward
        API (and by whom), and each call of its optimizer wrapper's step, as stage facts for
        the watch; undone with the engines' patches."""
        name = self.name
        for module, cls, method in self.backward_apis:
            patches.after_import(module, _api_patch(patches, name, cls, method))
        for module, cls, method, told in self.step_wrappers:
            patches.after_import(module, _wrapper_patch(patches, cls, method, told))
        for module, cls, method in self.boundary_setters:
            patches.after_import(module, _boundary_patch(patches, cls, method))
        for module, cls, method, reader in self.planners:
            patches.after_import(module, _planner_patch(patches, name, cls, method, reader))


def plan(steps: Any, loader: Any, accumulation: Any, epochs: Any) -> dict[str, str]:
    """A planned run's header facts: its optimizer steps, its loader's batches per epoch, its
    micro-batches per step and its epochs."""
    K = _schema.Key
    return {K.PLANNED_STEPS: str(int(steps)), K.PLANNED_LOADER: str(int(loader)),
            K.PLANNED_ACCUMULATION: str(int(accumulation)), K.PLANNED_EPOCHS: repr(float(epochs))}  # fmt: skip


def planned() -> dict[str, str]:
    """The header facts of the steps a framework planned in this process (none: not seen)."""
    return dict(_PLAN)


def forget_plan() -> None:
    """A recording closed: the plan was its training's."""
    _PLAN.clear()


def _planner_patch(patches: Patches, framework: str, cls: str, method: str, reader: Callable[..., Any]) -> Callable[[Any], None]:
    def install(module: Any) -> None:
        owner = getattr(module, cls)
        original = getattr(owner, method)

        def plan(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                _PLAN.clear()  # a plan of this training's own, or none
                got = reader(self, *args, **kwargs)
                if got:
                    _PLAN.update(got)
                    if _schema.Key.PLANNED_STEPS in got:
                        _PLAN[_schema.Key.PLANNED_BY] = framework
            except Exception:  # noqa: BLE001 - a fact not taken; training goes on
                pass
            return original(self, *args, **kwargs)

        patches.replace(owner, method, plan)

    return install


def _api_patch(patches: Patches, framework: str, cls: str, method: str) -> Callable[[Any], None]:
    def install(module: Any) -> None:
        owner = getattr(module, cls)
        original = getattr(owner, method)

        def api(self: Any, loss: Any, *args: Any, **kwargs: Any) -> Any:
            watches = patches.watches()
            try:
                who = _owners.caller(sys._getframe(1))
                for w in watches:
                    w.handed(loss, framework, who)
            except Exception:  # noqa: BLE001 - a fact not taken; training goes on
                pass
            for w in watches:
                w.api_entered()
            try:
                return original(self, loss, *args, **kwargs)
            finally:
                for w in watches:
                    w.api_left()

        patches.replace(owner, method, api)

    return install


def _wrapper_patch(patches: Patches, cls: str, method: str, told: Callable[[Any], Any]) -> Callable[[Any], None]:
    def install(module: Any) -> None:
        owner = getattr(module, cls)
        original = getattr(owner, method)

        def step(self: Any, *args: Any, **kwargs: Any) -> Any:
            watches = patches.watches()
            if watches:
                try:
                    k = told(self)
                    k = int(k) if isinstance(k, (int, float)) and not isinstance(k, bool) and k >= 1 else None
                except Exception:  # noqa: BLE001 - not known: counted only
                    k = None
                for w in watches:
                    w.wrapper_step(k)
            return original(self, *args, **kwargs)

        patches.replace(owner, method, step)

    return install


def _boundary_patch(patches: Patches, cls: str, method: str) -> Callable[[Any], None]:
    def install(module: Any) -> None:
        owner = getattr(module, cls)
        original = getattr(owner, method)

        def boundary(self: Any, *args: Any, **kwargs: Any) -> Any:
            watches = patches.watches()
            if watches:
                try:
                    who = _owners.caller(sys._getframe(1))
                    for w in watches:
                        w.boundary_marked(who)
                except Exception:  # noqa: BLE001 - a fact not taken; training goes on
                    pass
            return original(self, *args, **kwargs)

        patches.replace(owner, method, boundary)

    return install
