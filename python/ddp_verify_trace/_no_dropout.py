"""`--no-dropout` (`_schema.NO_DROPOUT_ENV` set to 1): every dropout of the run is the
identity, so the one-process run and the W ranks no longer draw masks of their own (each
rank's generator draws other masks than one process drawing for all of them), and what is
left to compare is the arithmetic of accumulation and the all-reduce.

Made the identity, through the registry (`_patches`: out when the last recording closes):
- torch.nn.functional's dropout, dropout1d/2d/3d, alpha_dropout and feature_alpha_dropout:
  called as in eval mode (`training=False`), which returns the input as it is (an `inplace`
  call too: the input was to be changed in place, and is left unchanged). nn.Dropout and its
  kin call these, and so does nn.MultiheadAttention;
- torch.dropout, torch.alpha_dropout, torch.feature_dropout, torch.feature_alpha_dropout and
  their in-place forms, called with `train=False`;
- scaled_dot_product_attention with `dropout_p` > 0: called with `dropout_p=0.0`;
- nn.RNN, nn.LSTM and nn.GRU's dropout between layers: 0 for the call.
A name imported by the script (`from torch.nn.functional import dropout`) is the patched one,
as the patches go in at start-up, before the script runs. The dropout layers' forwards are
patched too, only to count the layers met.

What was met (`header`: the dropout_off key, one line) is kept from the patches going in
until the next round's, so a trace written after they came out still says it."""
from __future__ import annotations

import os
from typing import Any, Callable

import torch

from . import _patches, _schema

# torch.nn.functional's, as (input, p, training, inplace).
FUNCTIONAL = ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout")
# torch's own, as (input, p, train).
TORCH = ("dropout", "dropout_", "alpha_dropout", "alpha_dropout_", "feature_dropout", "feature_dropout_",
         "feature_alpha_dropout", "feature_alpha_dropout_")  # fmt: skip
LAYERS = ("Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "FeatureAlphaDropout")
RNNS = ("RNN", "LSTM", "GRU")


class _Met:
    """What the patches met since they went in: each counted only where it would have
    dropped something (training, p > 0)."""

    def __init__(self) -> None:
        self.live = False  # the patches make the identity (else they pass calls through)
        self.reset()

    def reset(self) -> None:
        self.layers: dict[int, float] = {}  # id of a dropout layer: its p
        self.calls: dict[str, float] = {}  # a function called outside the layers: its largest p
        self.inside = 0  # depth of dropout layers' forwards (their F.dropout is the layer's)


MET = _Met()


def enabled() -> bool:
    """Whether this run asks for it: the variable set to 1 (unset, empty or 0: no)."""
    text = os.environ.get(_schema.NO_DROPOUT_ENV, "").strip()
    if text not in ("", "0", "1"):
        raise ValueError(
            f"ddp_verify_trace: {_schema.NO_DROPOUT_ENV}={text!r}: set it to 1 (every dropout the identity) or leave it unset"
        )
    return text == "1"


def unless_off(fact: str | None) -> str | None:
    """The `dropout` header fact (the dropout layers that train), or None where dropout is
    off: those layers drew no masks, and the judge must not name them."""
    return None if enabled() else fact


def _note(name: str, p: Any) -> None:
    try:
        p = float(p)
    except (TypeError, ValueError):
        return
    if p > 0 and not MET.inside:
        MET.calls[name] = max(p, MET.calls.get(name, 0.0))


def _functional(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    default = original.__defaults__[1] if original.__defaults__ and len(original.__defaults__) > 1 else True

    def dropout(input: Any, p: float = 0.5, training: bool = default, inplace: bool = False) -> Any:
        if not MET.live:
            return original(input, p, training, inplace)
        if training:
            _note(f"F.{name}", p)
        return original(input, p, False, inplace)

    return dropout


def _torch(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    def dropout(*args: Any, **kwargs: Any) -> Any:
        if not MET.live:
            return original(*args, **kwargs)
        train = args[2] if len(args) > 2 else kwargs.get("train", False)
        if train:
            _note(f"torch.{name}", args[1] if len(args) > 1 else kwargs.get("p"))
        if len(args) > 2:
            args = (*args[:2], False, *args[3:])
        else:
            kwargs["train"] = False
        return original(*args, **kwargs)

    return dropout


def _attention(original: Callable[..., Any]) -> Callable[..., Any]:
    def scaled_dot_product_attention(*args: Any, **kwargs: Any) -> Any:
        if MET.live:
            p = args[4] if len(args) > 4 else kwargs.get("dropout_p", 0.0)
            if p:
                _note("scaled_dot_product_attention dropout_p", p)
                if len(args) > 4:
                    args = (*args[:4], 0.0, *args[5:])
                else:
                    kwargs["dropout_p"] = 0.0
        return original(*args, **kwargs)

    return scaled_dot_product_attention


def _layer(original: Callable[..., Any]) -> Callable[..., Any]:
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not MET.live:
            return original(self, *args, **kwargs)
        if self.training and self.p > 0:
            MET.layers[id(self)] = float(self.p)
        MET.inside += 1
        try:
            return original(self, *args, **kwargs)
        finally:
            MET.inside -= 1

    return forward


def _rnn(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        p = getattr(self, "dropout", 0)
        if not (MET.live and self.training and isinstance(p, (int, float)) and p > 0):
            return original(self, *args, **kwargs)
        _note(f"{name} dropout", p)
        self.dropout = 0.0
        try:
            return original(self, *args, **kwargs)
        finally:
            self.dropout = p

    return forward


def patch() -> None:
    """Every dropout the identity from now until the patches come out, where the run asks."""
    if not enabled():
        return
    MET.reset()
    MET.live = True
    _patches.on_undo(lambda: setattr(MET, "live", False))
    F = torch.nn.functional
    for name in FUNCTIONAL:
        if hasattr(F, name):
            _patches.replace(F, name, _functional(name, getattr(F, name)))
    # torch's builtins stay builtins to TorchScript (`keep_builtin`).
    for name in TORCH:
        if hasattr(torch, name):
            original = getattr(torch, name)
            _patches.replace(torch, name, _torch(name, original))
            _patches.keep_builtin(getattr(torch, name), original)
    if hasattr(F, "scaled_dot_product_attention"):
        original = F.scaled_dot_product_attention
        _patches.replace(F, "scaled_dot_product_attention", _attention(original))
        _patches.keep_builtin(F.scaled_dot_product_attention, original)
    for name in LAYERS:
        cls = getattr(torch.nn, name, None)
        if cls is not None and "forward" in vars(cls):
            _patches.replace(cls, "forward", _layer(cls.forward))
    for name in RNNS:
        cls = getattr(torch.nn, name, None)
        if cls is not None and "forward" in vars(cls):
            _patches.replace(cls, "forward", _rnn(name, cls.forward))


def header() -> dict[str, str]:
    """The dropout_off key where dropout is off: what was made the identity, and met."""
    if not enabled():
        return {}
    met = []
    if MET.layers:
        n = len(MET.layers)
        met.append(f"{n} dropout layer{'s' if n > 1 else ''}, p up to {max(MET.layers.values()):g}")
    met += [f"{name}{'' if name.endswith('_p') else ' p'} up to {p:g}" for name, p in MET.calls.items()]
    said = "; ".join(met) if met else "no dropout met"
    return {_schema.Key.DROPOUT_OFF: f"every dropout made the identity (--no-dropout): {said}"}
