"""Every patch the recorder makes goes through here: one registry of them, and `Patches`, the
one interface engines, frameworks and torch's own watch (`_torch_patches`) patch through.

A patch replaces an attribute (`replace`), or waits for a module to be imported first
(`after_import`: a library the recorder must never import itself). The patches go in when
the first recording opens and `undo` takes every one out when the last one closes: torch is
left with the very objects it had, except where something else patched over them since (left
alone, the patch under it passing every call through). The registry says what was patched
(`made`: this round's patches; `places`: every place patched in this process, with what was
found there), so a test can hold torch as found without a list of its own."""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from typing import Any, Callable


class Patch:
    """One attribute replaced: where, what was there, and ours."""

    def __init__(self, owner: Any, name: str, original: Any, replacement: Any, inherited: bool = False) -> None:
        self.owner, self.name, self.original, self.replacement = owner, name, original, replacement
        # Found on a base class (torch.Tensor.to is TensorBase's): put back by deleting ours.
        self.inherited = inherited
        self.given_back = False  # put back by `undo`: at the last close, or sooner where asked

    def undo(self) -> None:
        # Only our own patch, and only where nothing patched over it since.
        if getattr(self.owner, self.name) is self.replacement:
            if self.inherited:
                delattr(self.owner, self.name)
            else:
                setattr(self.owner, self.name, self.original)
            self.given_back = True


# This round's patches, in the order made; everything `undo` runs, last first (patches,
# import finders, hooks and state that go with them).
_MADE: list[Patch] = []
_UNDO: list[Callable[[], None]] = []
# Every place patched in this process: (owner, name, the object found there the first time).
_PLACES: dict[tuple[int, str], tuple[Any, str, Any]] = {}


# What could not be patched (an internal a torch or framework release moved), in words: each
# is a warning in the trace's header, the part recorded there not recorded; the run goes on.
_MISSING: dict[str, None] = {}
_NOTHING = object()


def _where(owner: Any) -> str:
    return str(getattr(owner, "__qualname__", None) or getattr(owner, "__name__", None) or type(owner).__name__)


def _versions() -> str:
    torch = sys.modules.get("torch")
    return f"torch {getattr(torch, '__version__', '?')}"


def missing() -> list[str]:
    """What this process could not patch, one line each (the header's warnings)."""
    return list(_MISSING)


def replace(owner: Any, name: str, replacement: Callable[..., Any]) -> Callable[[], None]:
    """`owner.name` replaced until the last recording closes; returns what puts it back sooner.
    Where `owner` has no `name` (moved in this release), nothing is replaced and it is said."""
    original = getattr(owner, name, _NOTHING)
    if original is _NOTHING:
        _MISSING[f"{_where(owner)}.{name} not found ({_versions()}): what the recorder patches there is not recorded"] = None
        return lambda: None
    inherited = isinstance(owner, type) and name not in vars(owner)
    replacement.__wrapped__ = original  # type: ignore[attr-defined]
    replacement.__doc__ = original.__doc__
    setattr(owner, name, replacement)
    patch = Patch(owner, name, original, replacement, inherited)
    _PLACES.setdefault((id(owner), name), (owner, name, original))
    _MADE.append(patch)
    _UNDO.append(patch.undo)
    return patch.undo


def keep_builtin(replacement: Any, original: Any) -> None:
    """A replaced torch builtin (torch.zeros, torch.dropout) still compiles as that builtin
    where TorchScript meets the replacement, until the patches come out (TorchScript knows
    builtins by identity, and cannot compile a wrapper)."""
    try:
        from torch.jit import _builtins

        op = _builtins._find_builtin(original)
        if op is None:
            return
        _builtins._register_builtin(replacement, op)
    except Exception:  # noqa: BLE001 - a torch without that table: TorchScript is no concern there
        return
    # Out with the patches: the table knows the replacement by id, which a later object may take.
    _UNDO.append(lambda: _builtins._get_builtin_table().pop(id(replacement), None))


def on_undo(then: Callable[[], None]) -> None:
    """`then()` with the patches' undoing (a hook's removal, state that goes with a patch)."""
    _UNDO.append(then)


def undo() -> None:
    """Takes out everything patched, last first."""
    while _UNDO:
        _UNDO.pop()()
    _MADE.clear()


def made() -> list[Patch]:
    """This round's patches (since the first recording opened), in the order made."""
    return list(_MADE)


def places() -> list[tuple[Any, str, Any]]:
    """Every place patched in this process so far: (owner, name, what was found there first)."""
    return list(_PLACES.values())


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls each of `thens` with the module once `name` is imported (by anyone, after this
    was installed): one finder a module, as the first finder to answer for it is the only one
    asked."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.thens: list[Callable[[Any], None]] = []

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        _drop_finder(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run, thens = loader.exec_module, self.thens

        def exec_module(module: Any) -> None:
            run(module)
            for then in thens:
                _then_or_said(then, module)

        loader.exec_module = exec_module
        return spec


def _then_or_said(then: Callable[[Any], None], module: Any) -> None:
    """then(module); where it fails (an internal renamed), said, and training goes on."""
    try:
        then(module)
    except Exception as e:  # noqa: BLE001 - the user's run is never broken by a patch
        _MISSING[f"a patch of {module.__name__} failed ({_versions()}: {type(e).__name__}: {e}): what it records is not recorded"] = None


def attempt(what: str, patch: Callable[[], None]) -> None:
    """patch(): one part's patches, which read torch's internals; where one is missing or moved
    (AttributeError, ImportError...), that part is said (`missing`) and the rest go in."""
    try:
        patch()
    except Exception as e:  # noqa: BLE001 - the user's run is never broken by a patch
        _MISSING[f"{what}: not patched ({_versions()}: {type(e).__name__}: {e}): what it records is not recorded"] = None


def _drop_finder(finder: Any) -> None:
    if finder in sys.meta_path:
        sys.meta_path.remove(finder)


def after_import(name: str, then: Callable[[Any], None]) -> None:
    """`then(module)` now where `name` is imported already, else once it is (by anyone):
    a module the recorder must never import itself (an engine's, in another engine's run).
    Several for one module all run, in the order given."""
    module = sys.modules.get(name)
    if module is not None:
        _then_or_said(then, module)
        return
    finder = next((f for f in sys.meta_path if isinstance(f, _AfterImport) and f.name == name), None)
    if finder is None:
        finder = _AfterImport(name)
        sys.meta_path.insert(0, finder)
        _UNDO.append(lambda: _drop_finder(finder))
    finder.thens.append(then)


def waiting() -> list[str]:
    """The modules whose import a patch still waits for (finders in `sys.meta_path`)."""
    return [f.name for f in sys.meta_path if isinstance(f, _AfterImport)]


class Patches:
    """How an engine, a framework or torch's own watch patches: through the registry (out
    when the last recording closes), each hook reaching the open watches."""

    def __init__(self, watches: Callable[[], list[Any]]) -> None:
        # The open watches (`_watch.Watch`), at the time of the call.
        self.watches = watches

    @staticmethod
    def replace(owner: Any, name: str, replacement: Callable[..., Any]) -> Callable[[], None]:
        """owner.name = replacement, `__wrapped__` the original; returns its undo."""
        return replace(owner, name, replacement)

    @staticmethod
    def after_import(name: str, then: Callable[[Any], None]) -> None:
        """then(module) now where imported, else once it is."""
        after_import(name, then)
