"""What the recorder learns of a run by looking at it: the user's model inside its wrappers,
the dropout that trains, and the optimizer's settings as the header holds them. (Which
framework called the step: `frameworks`; which engine synchronises: `engines`.)"""
from __future__ import annotations

import gc
import warnings
from typing import Any

import torch


def active_dropout(module: torch.nn.Module) -> str | None:
    """The dropout that trains (layers with p > 0 in training mode), in words, or None: runs
    with it draw their own masks, which compare must say before anything finer."""
    ps = [m.p for m in module.modules() if isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.training and m.p > 0]
    return f"{len(ps)} dropout layer{'s' if len(ps) != 1 else ''}, p up to {max(ps):g}" if ps else None


def coupled(module: torch.nn.Module) -> str | None:
    """The layers that mix a micro-batch's samples while training (BatchNorm's batch
    statistics), in words, or None: where they train, a step's samples grouped otherwise
    into micro-batches give other gradients, which the judge names only with this fact."""
    n = sum(1 for m in module.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.training)
    return f"{n} BatchNorm layer{'s' if n > 1 else ''} in training mode" if n else None


def setting(value: Any) -> str | None:
    """An optimizer setting as the header holds it: a number, a flag, or numbers separated by
    spaces (betas); None for what is none of these (a setting another optimizer spells
    otherwise), which the header then leaves out."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, (int, float)):
        return str(value) if abs(float(value)) != float("inf") and value == value else None
    if isinstance(value, (tuple, list)) and value:
        parts = [setting(v) for v in value]
        ok = all(p is not None and not isinstance(v, bool) for p, v in zip(parts, value))
        return " ".join(p for p in parts if p is not None) if ok else None
    return None


def unwrap(module: torch.nn.Module) -> torch.nn.Module:
    """The user's own module inside DDP's, Accelerate's, Colossal-AI's or torch.compile's
    wrappers: their names are what both runs share."""
    while True:
        inner = getattr(module, "module", None) or getattr(module, "_orig_mod", None)
        if isinstance(inner, torch.nn.Module) and set(map(id, inner.parameters())) == set(
            map(id, module.parameters())
        ):
            module = inner
        else:
            return module


def owner(params: list[torch.nn.Parameter]) -> torch.nn.Module | None:
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
