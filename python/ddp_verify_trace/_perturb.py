"""The control run's nudge (`_schema.PERTURB_ENV`): ddp-verify runs the one-process leg once
more with every step's gradients moved by a tiny seeded amount, to learn how far two runs
that differ only by rounding-sized noise drift apart (the floor a real difference must clear).

The nudge is drawn from private generators seeded by the step, so the control run is
reproducible and the script's own random stream (torch's global RNG) is left as it was."""
from __future__ import annotations

import os

import torch

from . import _schema

# The generators' seed at step s is SEED + s.
SEED = 1234


def scale() -> tuple[float | None, str | None]:
    """(the nudge's scale where the environment asks for one, else None; a warning line
    where its value is no number, which leaves the run unperturbed rather than failing it)."""
    text = os.environ.get(_schema.PERTURB_ENV, "").strip()
    if not text:
        return None, None
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if value != value or abs(value) == float("inf") or value <= 0:
        return None, f"{_schema.PERTURB_ENV}={text!r} is no positive number: the gradients were not perturbed"
    return value, None


def nudge(grads: list[torch.Tensor], step: int, by: float) -> None:
    """Adds `by * max|g| * U(-1, 1)` to each gradient in place, elementwise, drawn in order
    from one generator per device seeded with SEED + step (of a tensor each rank holds a
    part of, its `to_local()`: each rank nudges what it holds)."""
    generators: dict[torch.device, torch.Generator] = {}
    for g in grads:
        to_local = getattr(g, "to_local", None)
        t = to_local() if callable(to_local) else g
        if t.numel() == 0:
            continue
        gen = generators.get(t.device)
        if gen is None:
            gen = generators[t.device] = torch.Generator(device=t.device)
            gen.manual_seed(SEED + step)
        wide = torch.float64 if t.dtype == torch.float64 else torch.float32
        noise = torch.rand(t.shape, generator=gen, device=t.device, dtype=wide).mul_(2).sub_(1)
        t.add_(noise.mul_(t.detach().abs().max().to(wide) * by).to(t.dtype))
