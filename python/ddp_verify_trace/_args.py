"""The recorder's arguments, checked at the call: a wrong one stops the script before it
trains, never inside its first optimizer step."""
from __future__ import annotations

import os
from typing import Any, Union

import torch.distributed as dist

from ._schema import Key

# What a trace's path may be given as.
PathLike = Union[str, "os.PathLike[str]"]
# magnitudes=: "element", "tensor", True ("element") or False/None (off).
Magnitudes = Union[str, bool, None]
# sample=: a positive int N (positions kept per tensor), "auto", or None/"full" (whole tensors).
Sample = Union[int, str, None]


def rank_world() -> tuple[int, int]:
    """(rank, world size). Before init_process_group (or after its destroy) torchrun's RANK
    still says which process is rank 0, so only one of them ever touches the file."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0")), 1


def check_sample(value: Sample, what: str = "sample") -> int | str | None:
    """`value` as the recorder keeps it (N, "auto" or None for whole), or a ValueError now."""
    if value is None or (isinstance(value, str) and value == "full"):
        return None
    if isinstance(value, str) and value == "auto":
        return "auto"
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise ValueError(
        f"ddp_verify_trace: {what} must be a positive int (positions kept per tensor), 'auto' or "
        f"'full' (whole tensors), not {value!r}"
    )


def check_magnitudes(value: Magnitudes, what: str = "magnitudes") -> str | None:
    """`value` as the recorder keeps it ("element", "tensor" or None), or a ValueError now."""
    if value is True:
        return "element"
    if value is False or value is None:
        return None
    if isinstance(value, str) and value in ("element", "tensor"):
        return value
    raise ValueError(f"ddp_verify_trace: {what} must be 'element', 'tensor' or False, not {value!r}")


def check_path(path: PathLike, overwrite: bool) -> str:
    """`path` as a str, once rank 0 could write a trace there: refused now, at the call, not
    at the first optimizer step inside the user's training. Other ranks never touch it."""
    path = os.fspath(path)
    if not isinstance(path, str):
        raise ValueError(f"ddp_verify_trace: path must be a str or os.PathLike of str, not {path!r}")
    if rank_world()[0] != 0:
        return path
    if os.path.isdir(path):
        example = os.path.join(path, "trace.safetensors")
        raise ValueError(f"ddp_verify_trace: path {path} is a folder: pass a file's path, such as {example}")
    if not overwrite and os.path.exists(path):
        raise FileExistsError(f"{path} exists: pass overwrite=True to replace it, or remove it")
    # The folder is made at the first step where missing: its nearest existing part must allow it.
    folder = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(folder):
        folder = os.path.dirname(folder)
    if not os.path.isdir(folder):
        raise ValueError(f"ddp_verify_trace: path {path} lies under {folder}, which is a file: pass a path under a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"ddp_verify_trace: path {path}: {folder} is not writable: pass a path in a folder you may write in")
    return path


def _check_int(key: str, value: Any) -> int | None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ValueError(f"ddp_verify_trace: {key} must be a positive int, not {value!r}")
    return value


def header_meta(acc_steps: int | None, steps_per_epoch: int | None) -> dict[str, str]:
    """acc_steps= and steps_per_epoch=, checked, as the header holds them (where given)."""
    meta = {}
    for key, value in ((Key.ACC_STEPS, acc_steps), (Key.STEPS_PER_EPOCH, steps_per_epoch)):
        if _check_int(key, value) is not None:
            meta[key] = str(value)
    return meta


def env_magnitudes() -> Magnitudes:
    """DDP_VERIFY_MAGNITUDES, the default of record()'s magnitudes: "tensor" where unset."""
    raw = os.environ.get("DDP_VERIFY_MAGNITUDES", "")
    value = raw.strip().lower()
    if value in ("", "tensor", "element"):
        return value or "tensor"
    if value in ("0", "false"):
        return False
    raise ValueError(f"ddp_verify_trace: DDP_VERIFY_MAGNITUDES={raw!r}: set it to tensor, element or false, or unset it")


def env_sample() -> int | str | None:
    """DDP_VERIFY_SAMPLE, the default of record()'s sample: "auto" where unset."""
    raw = os.environ.get("DDP_VERIFY_SAMPLE", "")
    value = raw.strip().lower()
    if value in ("", "auto"):
        return "auto"
    if value == "full":
        return None
    if value.isascii() and value.isdigit() and int(value) >= 1:
        return int(value)
    raise ValueError(
        f"ddp_verify_trace: DDP_VERIFY_SAMPLE={raw!r}: set it to auto, full or a positive number of positions, or unset it"
    )


def resolve_sample(value: Sample) -> int | str | None:
    """record()'s sample=, checked: None takes DDP_VERIFY_SAMPLE (else "auto")."""
    return env_sample() if value is None else check_sample(value)
