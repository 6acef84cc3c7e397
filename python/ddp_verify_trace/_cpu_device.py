"""`--device cpu` (`_schema.DEVICE_ENV` set to cpu): a script that hard-codes CUDA and NCCL runs
on the CPU with gloo, unedited, so both legs run where there is no GPU (or where it is busy).

Mapped, through the registry (`_patches`: out when the last recording closes), at the use
sites of a CUDA device (torch.device itself is a builtin type, left alone: a
`torch.device("cuda", i)` is mapped where it is used):
- cuda -> cpu: Tensor.to and Module.to with a CUDA device ("cuda", "cuda:1", torch.device("cuda", i)
  or a device index), Tensor.cuda and Module.cuda (the CPU tensor or module itself), the
  `device=` of torch's factory functions (`FACTORIES`: torch.zeros, torch.tensor, ...) and of
  Tensor.new_* and Module.to_empty, torch.load's `map_location`, torch.set_default_device,
  init_device_mesh's device type;
- nccl -> gloo: init_process_group's and new_group's backend ("nccl", "cuda:nccl",
  "cpu:gloo,cuda:nccl"), their `device_id` dropped;
- dropped: DDP's `device_ids` and `output_device` (in the DDP engine's own patch of its
  construction, through `without`), barrier's `device_ids`;
- no-ops: torch.cuda.set_device, synchronize, empty_cache, ipc_collect, manual_seed and
  manual_seed_all (the CPU's seed is torch.manual_seed's), Tensor.pin_memory and factories'
  `pin_memory=True`; torch.cuda.current_device reads 0;
- autocast(device_type="cuda") (torch.autocast, torch.amp.autocast, torch.cuda.amp.autocast):
  the CPU's autocast in bfloat16, and in float16 where this torch's CPU autocast runs it
  (else off: float32);
- GradScaler("cuda") (torch.amp's and torch.cuda.amp's): the CPU's GradScaler where this torch
  has one (its scale, unscale_, inf checks and skipped steps as on the GPU), else disabled.
- answered as the mapping implies, to the script's own code (not torch's or an installed
  library's, which keep the truth and stay on their CPU paths): torch.cuda.is_available() is
  True, device_count() the local ranks (LOCAL_WORLD_SIZE, else 1), is_bf16_supported() True;
  so a script that asserts CUDA before using it runs.
Assignments such as `torch.backends.cuda.matmul.allow_tf32 = True` are left as they are
(harmless on the CPU).

Refused (`REFUSED`): what drives the GPU itself and has no CPU meaning (streams, events,
CUDA graphs, the device's properties): the call raises one line, "ddp_verify_trace: --device
cpu cannot run torch.cuda.X on the CPU; ...". The user asked for the mapping, so a clear
refusal is the behaviour, not a recording failure.

What was mapped (`header`: the device_mapped key, one line) is what the run met, kept from
the patches going in until the next round's."""
from __future__ import annotations

import functools
import inspect
import os
import sys
from typing import Any, Callable

import torch

from . import _patches, _schema

# torch's functions that build a tensor on `device=`.
FACTORIES = ("zeros", "ones", "empty", "full", "rand", "randn", "randint", "randperm", "arange", "linspace",
             "logspace", "eye", "tensor", "as_tensor", "zeros_like", "ones_like", "empty_like", "full_like",
             "rand_like", "randn_like", "randint_like", "empty_strided", "normal", "tril_indices",
             "triu_indices", "scalar_tensor")  # fmt: skip
TENSOR_FACTORIES = ("new_tensor", "new_zeros", "new_ones", "new_empty", "new_full")
NO_OPS = ("set_device", "synchronize", "empty_cache", "ipc_collect", "manual_seed", "manual_seed_all")
REFUSED = ("Stream", "Event", "ExternalStream", "CUDAGraph", "graph", "make_graphed_callables", "stream",
           "set_stream", "current_stream", "default_stream", "get_device_properties",
           "get_device_capability", "get_device_name", "mem_get_info")  # fmt: skip


class _Met:
    """What the patches mapped since they went in: {group: {what: None}}, in the order met."""

    def __init__(self) -> None:
        self.live = False  # the patches map (else they pass calls through)
        self.groups: dict[str, dict[str, None]] = {}

    def note(self, group: str, what: str) -> None:
        self.groups.setdefault(group, {})[what] = None


MET = _Met()
CPU = "cuda -> cpu"
# The header's groups in this order; "" (autocast, GradScaler) last.
ANSWERS = "answered"
GROUPS = (CPU, "nccl -> gloo", "dropped", "no-ops", ANSWERS, "")


def enabled() -> bool:
    """Whether this run asks for it: the variable set to cpu (unset or empty: no)."""
    text = os.environ.get(_schema.DEVICE_ENV, "").strip()
    if text not in ("", "cpu"):
        raise ValueError(f"ddp_verify_trace: {_schema.DEVICE_ENV}={text!r}: the one device the recorder maps to is cpu")
    return text == "cpu"


def is_cuda(device: Any) -> bool:
    """Whether `device` names a CUDA device: "cuda", "cuda:1", torch.device("cuda", i), or a
    device index (an int: a CUDA device to .to() and factories)."""
    if isinstance(device, bool):
        return False
    if isinstance(device, int):
        return device >= 0
    if isinstance(device, str):
        return device.split(":")[0].strip().lower() == "cuda"
    return isinstance(device, torch.device) and device.type == "cuda"


def refusal(name: str) -> str:
    return (
        f"ddp_verify_trace: --device cpu cannot run torch.cuda.{name} on the CPU; take the call out of the "
        "script, or run without --device cpu on a machine with CUDA"
    )


def _mapped_kwargs(label: str, kwargs: dict[str, Any]) -> None:
    """A call's `device=` (CUDA -> "cpu") and `pin_memory=True` (-> False), noted."""
    if is_cuda(kwargs.get("device")):
        kwargs["device"] = "cpu"
        MET.note(CPU, f"{label}(device=)")
    if kwargs.get("pin_memory"):
        kwargs["pin_memory"] = False
        MET.note("no-ops", f"{label}(pin_memory=True)")


def _factory(label: str, original: Callable[..., Any]) -> Callable[..., Any]:
    def factory(*args: Any, **kwargs: Any) -> Any:
        if MET.live:
            _mapped_kwargs(label, kwargs)
        return original(*args, **kwargs)

    return factory


def _to(label: str, original: Callable[..., Any]) -> Callable[..., Any]:
    def to(self: Any, *args: Any, **kwargs: Any) -> Any:
        if MET.live:
            if args and is_cuda(args[0]):
                args = ("cpu", *args[1:])
                MET.note(CPU, label)
            if is_cuda(kwargs.get("device")):
                kwargs["device"] = "cpu"
                MET.note(CPU, label)
        return original(self, *args, **kwargs)

    return to


def _tensor_cuda(original: Callable[..., Any]) -> Callable[..., Any]:
    def cuda(self: torch.Tensor, device: Any = None, non_blocking: bool = False, **kwargs: Any) -> torch.Tensor:
        if not MET.live:
            return original(self, device, non_blocking, **kwargs)
        MET.note(CPU, "Tensor.cuda")
        return self.cpu(**{k: v for k, v in kwargs.items() if k == "memory_format"})

    return cuda


def _module_cuda(original: Callable[..., Any]) -> Callable[..., Any]:
    def cuda(self: torch.nn.Module, device: Any = None) -> torch.nn.Module:
        if not MET.live:
            return original(self, device)
        MET.note(CPU, "Module.cuda")
        return self.cpu()

    return cuda


def _pin_memory(original: Callable[..., Any]) -> Callable[..., Any]:
    def pin_memory(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if not MET.live:
            return original(self, *args, **kwargs)
        MET.note("no-ops", "Tensor.pin_memory")
        return self

    return pin_memory


def _no_op(name: str, original: Callable[..., Any], value: Any = None) -> Callable[..., Any]:
    def no_op(*args: Any, **kwargs: Any) -> Any:
        if not MET.live:
            return original(*args, **kwargs)
        # Noted where the script (or a library) called it: torch.manual_seed's own call of
        # torch.cuda.manual_seed_all is no CUDA the script hard-coded.
        if not sys._getframe(1).f_globals.get("__name__", "").startswith("torch"):
            MET.note("no-ops", f"torch.cuda.{name}" + ("" if value is None else f" ({value})"))
        return value

    return no_op


def _answer(name: str, original: Callable[..., Any], value: Callable[[], Any]) -> Callable[..., Any]:
    """torch.cuda.`name`() answered `value()` to the script's own code; torch and installed
    libraries (site-packages) get the truth, so they take no CUDA-only path of their own."""

    def answer(*args: Any, **kwargs: Any) -> Any:
        caller = str(sys._getframe(1).f_globals.get("__file__") or "")
        if not MET.live or _library(caller):
            return original(*args, **kwargs)
        said = value()
        MET.note(ANSWERS, f"torch.cuda.{name}() -> {said}")
        return said

    return answer


def _library(path: str) -> bool:
    """Code of torch's or of an installed package (not a script or its own modules)."""
    parts = path.replace("\\", "/").split("/")
    return "site-packages" in parts or "dist-packages" in parts or path.startswith(os.path.dirname(torch.__file__))


def _local_ranks() -> int:
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def _bound(original: Callable[..., Any], edit: Callable[[dict[str, Any]], None]) -> Callable[..., Any]:
    """`original`, its arguments (by name, positional or not) edited first by `edit`."""
    signature = inspect.signature(original)

    def bound(*args: Any, **kwargs: Any) -> Any:
        if not MET.live:
            return original(*args, **kwargs)
        try:
            call = signature.bind(*args, **kwargs)
        except TypeError:  # the original says what is wrong
            return original(*args, **kwargs)
        edit(call.arguments)
        return original(*call.args, **call.kwargs)

    return bound


def _drop(arguments: dict[str, Any], name: str, label: str) -> None:
    if arguments.get(name) is not None:
        arguments[name] = None
        MET.note("dropped", label)


def without(
    original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], names: tuple[str, ...], label: str
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """`original`'s arguments with those in `names` (device ids) set to None where the run
    maps and they were given, each noted as dropped ("DDP device_ids"): for an engine's own
    patch of a call it makes through (DDP's device_ids: `engines/ddp.py`)."""
    if not MET.live:
        return args, kwargs
    try:
        call = inspect.signature(original).bind(*args, **kwargs)
    except (TypeError, ValueError):  # the original says what is wrong
        return args, kwargs
    for name in names:
        _drop(call.arguments, name, f"{label} {name}")
    return call.args, call.kwargs


def _backend(label: str) -> Callable[[dict[str, Any]], None]:
    def edit(arguments: dict[str, Any]) -> None:
        backend = arguments.get("backend")
        if backend is not None and "nccl" in str(backend).lower():
            arguments["backend"] = "gloo"
            MET.note("nccl -> gloo", label)
        _drop(arguments, "device_id", f"{label} device_id")

    return edit


def _autocast(arguments: dict[str, Any]) -> None:
    if not is_cuda(arguments.get("device_type")):
        return
    dtype, enabled = arguments.get("dtype"), arguments.get("enabled", True)
    arguments["device_type"] = "cpu"
    if not enabled:
        MET.note("", "autocast(cuda, disabled) -> cpu")
    elif dtype == torch.bfloat16:
        MET.note("", "autocast(cuda, bfloat16) -> autocast(cpu, bfloat16)")
    elif dtype in (None, torch.float16) and _cpu_runs(torch.float16):
        arguments["dtype"] = torch.float16
        MET.note("", "autocast(cuda, float16) -> autocast(cpu, float16)")
    else:
        arguments["enabled"], arguments["dtype"] = False, None
        MET.note("", f"autocast(cuda, {str(dtype or torch.float16).replace('torch.', '')}) -> off (float32 on the CPU)")


@functools.lru_cache(maxsize=None)
def _cpu_runs(dtype: torch.dtype) -> bool:
    """Whether this torch's CPU autocast runs `dtype` (float16 came to it in 2.x; an older
    one warns, and runs float32): one tiny product under it, its warning kept from the user."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with torch.autocast("cpu", dtype=dtype):
                return (torch.ones(1, 1) @ torch.ones(1, 1)).dtype == dtype
        except (RuntimeError, TypeError):
            return False


def _cpu_scaler() -> bool:
    """Whether this torch has a GradScaler for the CPU (torch.amp.GradScaler("cpu"), with the
    CPU's inf check and unscale kernels)."""
    try:
        return hasattr(torch, "_amp_foreach_non_finite_check_and_unscale_") and torch.amp.GradScaler is not None
    except AttributeError:
        return False


def _scaler(arguments: dict[str, Any]) -> None:
    if not is_cuda(arguments.get("device", "cuda")):
        return
    arguments["device"] = "cpu"
    if not arguments.get("enabled", True):
        MET.note("", "GradScaler(cuda, disabled) -> cpu")
    elif _cpu_scaler():
        MET.note("", "GradScaler(cuda) -> GradScaler(cpu)")
    else:
        arguments["enabled"] = False
        MET.note("", "GradScaler(cuda) -> disabled")


def _load(arguments: dict[str, Any]) -> None:
    if is_cuda(arguments.get("map_location")):
        arguments["map_location"] = "cpu"
        MET.note(CPU, "torch.load(map_location=)")


def _mesh(arguments: dict[str, Any]) -> None:
    if is_cuda(arguments.get("device_type")):
        arguments["device_type"] = "cpu"
        MET.note(CPU, "init_device_mesh")


def _default_device(arguments: dict[str, Any]) -> None:
    if is_cuda(arguments.get("device")):
        arguments["device"] = "cpu"
        MET.note(CPU, "torch.set_default_device")


def _refused(name: str, original: Any) -> Any:
    """What raises the refusal when called: a subclass for a class (isinstance still works)."""
    message = refusal(name)
    if isinstance(original, type):

        def __new__(cls: Any, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(message)

        return type(original)(name, (original,), {"__new__": __new__, "__module__": original.__module__})

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(message)

    return refused


def _replace(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
    """owner.name replaced by make(original), where there is one; a builtin's replacement
    stays the builtin to TorchScript (`_patches.keep_builtin`)."""
    original = getattr(owner, name, None)
    if original is None:
        return
    try:
        replacement = make(original)
    except Exception:  # noqa: BLE001 - a class torch will not let be subclassed: left as it is
        return
    _patches.replace(owner, name, replacement)
    _patches.keep_builtin(replacement, original)


def patch() -> None:
    """The mapping, from now until the patches come out, where the run asks for it."""
    if not enabled():
        return
    MET.groups = {}
    MET.live = True
    _patches.on_undo(lambda: setattr(MET, "live", False))
    for name in FACTORIES:
        _replace(torch, name, lambda f, n=name: _factory(f"torch.{n}", f))
    for name in TENSOR_FACTORIES:
        _replace(torch.Tensor, name, lambda f, n=name: _factory(f"Tensor.{n}", f))
    _replace(torch.Tensor, "to", lambda f: _to("Tensor.to", f))
    _replace(torch.nn.Module, "to", lambda f: _to("Module.to", f))
    _replace(torch.nn.Module, "to_empty", lambda f: _factory("Module.to_empty", f))
    _replace(torch.Tensor, "cuda", _tensor_cuda)
    _replace(torch.nn.Module, "cuda", _module_cuda)
    _replace(torch.Tensor, "pin_memory", _pin_memory)
    _replace(torch, "load", lambda f: _bound(f, _load))
    _replace(torch, "set_default_device", lambda f: _bound(f, _default_device))
    for name in NO_OPS:
        _replace(torch.cuda, name, lambda f, n=name: _no_op(n, f))
    _replace(torch.cuda, "current_device", lambda f: _no_op("current_device", f, 0))
    _replace(torch.cuda, "is_available", lambda f: _answer("is_available", f, lambda: True))
    _replace(torch.cuda, "device_count", lambda f: _answer("device_count", f, _local_ranks))
    _replace(torch.cuda, "is_bf16_supported", lambda f: _answer("is_bf16_supported", f, lambda: True))
    for name in REFUSED:
        _replace(torch.cuda, name, lambda f, n=name: _refused(n, f))
    from torch.amp.autocast_mode import autocast
    from torch.amp.grad_scaler import GradScaler

    _replace(autocast, "__init__", lambda f: _bound(f, _autocast))
    _replace(GradScaler, "__init__", lambda f: _bound(f, _scaler))
    _patch_distributed()


def _patch_distributed() -> None:
    import torch.distributed as dist

    if not dist.is_available():
        return
    from torch.distributed import distributed_c10d as c10d

    # One wrapper at both names, as the recorder's other patches of torch.distributed.
    edits = {"init_process_group": _backend("init_process_group"), "new_group": _backend("new_group"),
             "barrier": lambda a: _drop(a, "device_ids", "barrier device_ids")}  # fmt: skip
    for name, edit in edits.items():
        original = getattr(c10d, name, None)
        if original is not None:
            wrapper = _bound(original, edit)
            _patches.replace(c10d, name, wrapper)
            if getattr(dist, name, None) is original:
                _patches.replace(dist, name, wrapper)
    try:
        from torch.distributed import device_mesh
    except ImportError:
        return
    original = getattr(device_mesh, "init_device_mesh", None)
    if original is not None:
        wrapper = _bound(original, _mesh)
        _patches.replace(device_mesh, "init_device_mesh", wrapper)
        if getattr(dist, "init_device_mesh", None) is original:
            _patches.replace(dist, "init_device_mesh", wrapper)


def header() -> dict[str, str]:
    """The device_mapped key where the run mapped anything: what, in one line."""
    if not enabled() or not MET.groups:
        return {}
    met = [(g, MET.groups[g]) for g in GROUPS if g in MET.groups]
    parts = [f"{group}: {', '.join(what)}" if group else ", ".join(what) for group, what in met]
    return {_schema.Key.DEVICE_MAPPED: "; ".join(parts)}
