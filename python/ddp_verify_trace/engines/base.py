"""What every engine tells the recorder: the one interface between the recording core and the
ways gradients are synchronised (DDP, FSDP2, DeepSpeed ZeRO, ...).

The core (`recorder.Recorder`, `session.Session`) names no engine: it asks the engine found for
the run at each point of a step where engines differ. The defaults here are a run whose
parameters hold their whole gradient in `.grad` on every rank, after any reduction (one
process, or DDP); an engine overrides what it does otherwise.

A new engine is one module in this folder (a subclass of `Engine`) and one line in the
registry (`engines/__init__.py`), plus its word in the Rust `Engine` vocabulary, which the
generated `_schema.py` carries (see docs/architecture.md, "Adding an engine").
"""
from __future__ import annotations

from typing import Any

import torch

from .._patches import Patches
from .._positions import Sampling, Summaries

# A parameter's name and the parameter, as the trace names it.
Named = list[tuple[str, torch.nn.Parameter]]
# Per sampled parameter whose gradient the engine gathered itself: (its kept values on the
# host, float64; its whole gradient's [sum, sum of squares, max |g|]).
Gathered = dict[str, tuple[torch.Tensor, torch.Tensor]]
# Per parameter whose final weight the engine gathered: (final, peaks, summaries or None).
Finals = dict[str, tuple[torch.Tensor, torch.Tensor, "torch.Tensor | None"]]


class Engine:
    """One run's engine. Found by `find` (the registry asks each engine in turn), then
    `start`ed by the recorder once the parameters and the sampled positions are known."""

    # The header's `engine` word (`_schema.Engine`); None where the watch says it (DDP's
    # forwards), as a single process has none.
    name: str | None = None
    # Tensor hooks on the parameters see each backward's own gradient (micro-batch
    # magnitudes and counts); where they do not, the warning the trace carries instead.
    backward_hooks = True
    no_magnitudes: str | None = None
    # Tensor hooks see each backward's own gradient before the engine reduces it (the stage
    # facts' local gradient); False where the engine hands it to the watch itself.
    local_hooks = True
    # In one process the engine reduces nothing, and the .grad a step applies is the
    # backwards' own sum (a clip and a loss scale aside, which the trace records): the judge
    # reads the local gradient from it, and no hook sums each backward (their cost, a few
    # percent of a small model's step, is spared).
    local_is_applied = False
    # Every rank tracks peaks (its own shard's) and takes part in gathering them at close.
    peaks_on_every_rank = False
    # Peaks are read while the step's weights still stand (not later on the writer thread).
    peaks_now = False
    # The trace is written when the process group is destroyed (its gathers need the group,
    # or the engine may be gone at exit), not only at close or exit.
    write_at_destroy = False
    # The parameters themselves hold the gradients the step applies and the weights it makes
    # (not flat copies the engine steps instead): the recorder can follow parameters beyond
    # the optimizer's, and the control run can nudge `.grad` before the step applies it.
    whole_params = True
    # Every rank holds the whole weights alike, so a checksum per rank compares them.
    weights_replicated = True

    @classmethod
    def find(cls, optimizer: torch.optim.Optimizer | None, params: list[torch.Tensor]) -> Engine | None:
        """This engine, where it is the one that trains `params` (stepped by `optimizer`,
        where known); else None."""
        return None

    @classmethod
    def setting_up(cls, optimizer: torch.optim.Optimizer) -> bool:
        """Whether `optimizer` steps now inside this engine's own setup, not the training's
        (asked before the first step, which names the model and engine)."""
        return False

    @staticmethod
    def patch(patches: Patches) -> None:
        """Installs this engine's watch on torch (what it reduces, when): once, with the
        first recording; `patches` takes them out again."""

    # -- what it trains --------------------------------------------------------------------
    def model(self) -> tuple[torch.nn.Module, Named] | None:
        """The model and its trained parameters, where the engine knows them (its optimizer
        steps tensors no module holds); None: the recorder finds the model."""
        return None

    def shape(self, p: torch.Tensor) -> tuple[int, ...]:
        """The parameter's whole shape."""
        return tuple(p.shape)

    def dtypes(self, params: Named) -> list[str]:
        """The dtypes the optimizer steps, as str: one, or the recorder refuses."""
        return sorted({str(p.dtype) for _, p in params})

    def dtype(self, params: Named) -> torch.dtype:
        """The trace's float dtype: what the optimizer steps."""
        return params[0][1].dtype

    def device(self, p: torch.Tensor) -> torch.device:
        """Where the engine's whole gradients and weights of `p` are read."""
        return p.device

    def start(self, params: Named, sampling: Sampling) -> dict[str, str]:
        """Ready to record `params` (sampled as `sampling` keeps them); returns the header
        facts known now. Collectives allowed: every rank starts alike."""
        return {}

    def close(self) -> None:
        """Removes whatever `start` added."""

    # -- each step -------------------------------------------------------------------------
    def weight(self, name: str, p: torch.Tensor) -> torch.Tensor:
        """The whole weight as the optimizer keeps it."""
        return p.detach()

    def local_weight(self, name: str, p: torch.Tensor) -> torch.Tensor | None:
        """This rank's part of the weight where each rank keeps its own peaks; else None."""
        return None

    def backwards(self, counts: dict[str, int], reduced: list[bool]) -> int:
        """Backward passes since the last step: from the tensor hooks' `counts`, or the
        engine's per-micro-batch `reduced` flags."""
        return max(counts.values(), default=0)

    def applied(self, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any] | None, list[float] | None] | None:
        """In the optimizer's post-hook: (the whole gradients the step applied where the
        engine gathers them, else None: `.grad`; the learning rates where the optimizer's
        groups do not say them). None: the engine's step is not over yet."""
        return None, None

    def groups(self, optimizer: torch.optim.Optimizer) -> list[tuple[dict[str, Any], float | None]] | None:
        """The user's param groups of the step just recorded, each with its parameter count
        where its `params` do not say it, where the optimizer's `param_groups` do not hold
        them (an engine that narrows them); None: they do."""
        return None

    def clipped(self) -> list[float] | None:
        """[total norm, max norm] of a clip the engine made inside its own step (none a
        clip_grad_norm_ call shows), where it clipped; None: it does not clip."""
        return None

    def after_step(self) -> None:
        """The step is recorded: the engine may keep what it made (collectives allowed)."""

    def gradients(self, params: Named, sampling: Sampling, summaries: Summaries) -> tuple[dict[str, Any], Gathered]:
        """Each parameter's gradient as the trace keeps it, and the sampled ones the engine
        gathered itself (kept values and summaries). Every rank calls this every step."""
        return {n: p.grad for n, p in params}, {}

    def rank_checksums(self, sampled: bool) -> bool:
        """Whether every rank holds the same whole gradient, checksummed per rank."""
        return True

    def step_facts(self, watch: Any, world: int, reduced: list[bool]) -> dict[str, str]:
        """Header facts the step's watch (`_watch.Watch`) shows of this engine."""
        return {}

    def finals(self, params: Named, peaks: dict[str, torch.Tensor], sampling: Sampling, summaries: Summaries) -> Finals:
        """The final weights and peaks the engine gathers itself, on the host (every rank
        calls this once, at close); the rest the recorder reads from `weight`."""
        return {}

    def closing_facts(self, world: int) -> dict[str, str]:
        """Header facts written at close, where no step said otherwise."""
        return {}

    def warnings(self) -> list[str]:
        """What the trace could not hold of this engine's run, a line each (the header's
        `warnings`, beside the recorder's own), as known at close."""
        return []
