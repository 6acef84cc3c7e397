"""Whose code made a call: one walk over the calling frames, each frame's module matched
against the prefixes every framework registers (`frameworks/__init__.py`, outermost first);
torch's and the recorder's own frames are looked past. A cause names an owner, so that its
fix is given to the right code (docs/stages.md).

`caller`: the innermost owner (who called backward, zero_grad, a framework's API).
`framework`: the first registered framework among all the calling frames (who called
optimizer.step(): Transformers' Trainer steps through Accelerate, and the header names the
user's, the outermost). `versions`: the registered libraries the run imported."""
from __future__ import annotations

import sys
from types import FrameType

from . import _schema

# Called by no registered framework: the user's own code.
PLAIN = _schema.Framework.PLAIN

# (framework word, its Python packages), in registry order: outermost first.
_REGISTERED: list[tuple[str, tuple[str, ...]]] = []
# Module name -> its owner's word ("": torch's or the recorder's, looked past).
_WORDS: dict[str, str] = {}


def register(word: str, modules: tuple[str, ...]) -> None:
    """Code in `modules` (packages, with their submodules) is framework `word`'s; registered
    after the ones before it, which outrank it."""
    _REGISTERED[:] = [r for r in _REGISTERED if r[0] != word] + [(word, tuple(modules))]
    _WORDS.clear()


def _word(module: str) -> str:
    """A module's owner, the first time it is met ("": looked past)."""
    if module == "torch" or module.startswith(("torch.", "ddp_verify_trace")):
        return ""
    for word, packages in _REGISTERED:
        if any(module == m or module.startswith(m + ".") for m in packages):
            return word
    return PLAIN


def _owner(frame: FrameType) -> str:
    module = frame.f_globals.get("__name__", "")
    word = _WORDS.get(module)
    if word is None:
        word = _WORDS[module] = _word(module)
    return word


def caller(frame: FrameType | None) -> str:
    """The owner of the first frame outward from `frame` that is neither torch's nor the
    recorder's: whose code made the call (`plain`: the user's script)."""
    while frame is not None:  # `_owner` inlined: this runs at every backward
        module = frame.f_globals.get("__name__", "")
        word = _WORDS.get(module)
        if word is None:
            word = _WORDS[module] = _word(module)
        if word:
            return word
        frame = frame.f_back
    return PLAIN


def framework(frame: FrameType | None) -> str:
    """Which framework called, from the calling frames outward from `frame`: the first
    registered among them. It decides where clipping and loss division happen, so causes
    can name the right fix."""
    seen: set[str] = set()
    while frame is not None:
        seen.add(_owner(frame))
        frame = frame.f_back
    return next((word for word, _ in _REGISTERED if word in seen), PLAIN)


def versions() -> str:
    """torch and each registered library the run imported, `name==version`, for the header:
    a library's bug belongs to a version."""
    from importlib import metadata

    out = []
    for module in ["torch"] + [m for _, packages in _REGISTERED for m in packages]:
        if module in sys.modules:
            version = getattr(sys.modules[module], "__version__", None)  # torch's says its build (+cu130)
            if not isinstance(version, str):
                try:
                    version = metadata.version(module)
                except metadata.PackageNotFoundError:
                    continue
            out.append(f"{module}=={version}")
    return ", ".join(out)
