"""Small reads of tensors the recorder makes: host copies, bit checksums, and the float
dtypes a trace may hold."""
from __future__ import annotations

import torch

from . import _schema

# The float dtypes ddp-verify reads, by the names its --dtype uses (torch's own names).
DTYPES = {getattr(torch, word): word for key, word in vars(_schema.Dtype).items() if not key.startswith("_")}
# Integer views of each float dtype, for bit checksums.
_BITS = {torch.float32: torch.int32, torch.float64: torch.int64, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def host(t: torch.Tensor) -> torch.Tensor:
    """A detached contiguous CPU copy: never a view of a tensor training goes on changing."""
    return t.detach().to("cpu", copy=True).contiguous()


def owns_memory(g: torch.Tensor) -> bool:
    """A CPU tensor alone in its memory: no bucket view that DDP writes into again."""
    return g.device.type == "cpu" and g._base is None and g.is_contiguous() and (
        g.untyped_storage().nbytes() == g.numel() * g.element_size()
    )


def bits(g: torch.Tensor) -> torch.Tensor:
    """A checksum of a tensor's bits, in one pass: equal gradients give equal sums, and a
    gradient part of which was never all-reduced differs in many elements, whose bit
    patterns do not cancel."""
    return g.detach().contiguous().view(_BITS[g.dtype]).sum(dtype=torch.int64)


def max_abs_into(group: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> None:
    """peak = max(peak, |w|) for each (peak, scratch, w) of one device, in three foreach
    operations: on the writer thread a loop of two operations per parameter holds the GIL
    between them, and the training thread's backward waits for it at each of its own."""
    peaks, scratch, weights = (list(t) for t in zip(*group))
    try:
        torch._foreach_copy_(scratch, weights)
        torch._foreach_abs_(scratch)
        torch._foreach_maximum_(peaks, scratch)
    except (AttributeError, RuntimeError, TypeError):  # a torch without them: one by one
        for peak, buf, w in group:
            torch.maximum(peak, torch.abs(w, out=buf), out=peak)
