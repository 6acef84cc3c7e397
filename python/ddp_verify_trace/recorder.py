"""The recording core: what one run's optimizer steps applied, and everything around them that
decides whether two runs are the same training. It names no engine: where engines differ
(how a whole gradient or weight is read, what reduced it, how backwards are counted) it asks
the run's engine (`engines/`), found once for the run.

What a trace holds, tensor by tensor and header key by header key, is `_schema.py`,
generated from the tables `ddp-verify compare` reads by (src/evidence/schema.rs; its docs in
docs/architecture.md, "The trace schema"). Per optimizer step: the gradient it applied, the
micro-batches' magnitudes, the learning rates, backward passes, clip calls and the last
clip's norms, under several ranks each rank's gradient checksum and each micro-batch's reduce
flag, under a GradScaler its scale and skips; once: the peaks, final weights and buffers, and
a header with the world size, the optimizer's kind and settings, the framework that called
the step, and the dropout layers that train (runs with dropout draw their own masks).

Sampled traces (`sample=N`, or "auto" for a model of more than `_schema.SAMPLE_FROM_PARAMETERS`
parameters): see `_positions.py`. A step reads each sampled gradient once (its summaries) and,
under CUDA, sends what it keeps of all of them to the host in one copy.
"""
from __future__ import annotations

import os
from typing import Any

import torch

from . import _collectives, _cpu_device, _deal, _extras, _groups, _no_dropout, _owners, _perturb, _progress, _schema
from . import _patches, _step_file, _torch_patches, _watch, engines, frameworks
from ._args import Magnitudes, PathLike, Sample, check_magnitudes, check_path, check_sample, rank_world
from ._detect import active_dropout, coupled, unwrap
from ._followed import Followed
from ._magnitudes import Backwards
from ._positions import Sampling, Summaries, numel, to_host
from ._stages.exchange import Exchange, Packed, all_gather
from ._stream import Stream, writable
from ._tensors import DTYPES, bits, host, max_abs_into, owns_memory

FORMAT = _schema.FORMAT
K = _schema.Key


class Recorder(Followed):
    """One run's record. `step()` takes the gradients as they are now; every rank calls it
    at every optimizer step, and `close()` at the end; rank 0 alone writes `path`.
    `sample`: N, "auto" or None (whole tensors): see `_positions.py`. `engine`: the run's,
    where the caller found it (by the optimizer); else found from the parameters."""

    def __init__(
        self,
        module: torch.nn.Module,
        path: PathLike,
        *,
        overwrite: bool = False,
        magnitudes: Magnitudes = True,
        meta: dict[str, str] | None = None,
        params: list[tuple[str, torch.nn.Parameter]] | None = None,
        watch: _watch.Watch | None = None,
        sample: Sample = None,
        engine: engines.Engine | None = None,
    ) -> None:
        self._module = unwrap(module)
        self.path = check_path(path, overwrite)
        how = check_magnitudes(magnitudes)
        sample = check_sample(sample)
        main = params or [(n, p) for n, p in self._module.named_parameters() if p.requires_grad]
        if not main:
            raise ValueError("ddp_verify_trace: the model has no parameters that require grad; nothing to record")
        self.engine = engine if engine is not None else engines.find(None, [p for _, p in main])
        dtypes = self.engine.dtypes(main)
        if len(dtypes) > 1:
            raise ValueError(
                f"ddp_verify_trace: the parameters mix dtypes ({', '.join(dtypes)}); a trace holds one float "
                "dtype, so cast the model to one (model.to(dtype)) before recording"
            )
        self._dtype = self.engine.dtype(main)
        if self._dtype not in DTYPES:
            raise ValueError(f"ddp_verify_trace: parameters are {self._dtype}; ddp-verify reads {', '.join(DTYPES.values())}")
        # The module's other parameters (frozen ones) are followed too, where the engine's
        # parameters hold their gradients (`_extras`); those of another dtype are left out.
        rest, self._left_out = _extras.module_rest(self._module, main, self._dtype) if self.engine.whole_params else ([], [])
        self._params = main + rest
        # Whose final weights are written: those that train now, and any that gets a gradient.
        self._trained = {n for n, p in self._params if p.requires_grad} | {n for n, _ in main}
        self._shapes = {n: self.engine.shape(p) for n, p in self._params}
        self._meta = dict(meta or {})
        numels = {n: numel(shape) for n, shape in self._shapes.items() if n in self._trained}
        total = sum(numels.values())
        self._meta[K.PARAMETERS] = str(total)
        if sample == "auto":
            sample = _schema.SAMPLE_SIZE if total > _schema.SAMPLE_FROM_PARAMETERS else None
        if sample is not None and all(v <= sample for v in numels.values()):
            sample = None  # nothing to sample: a whole trace, as any reader takes it
        self._sampling = Sampling(sample, self._shapes, {n: self.engine.device(p) for n, p in self._params})  # type: ignore[arg-type]
        self._summaries = Summaries()
        if self._sampling.size is not None:
            self._meta[K.SAMPLE] = str(self._sampling.size)
            # Magnitudes per element at the positions (one gather per backward), whatever was
            # asked: a per-tensor maximum of a sampled tensor would cost a read of all of it.
            if how:
                how = "element"
        # What this recorder could not record (the header's `warnings`, one per line).
        self._warnings: list[str] = []
        if self.engine.no_magnitudes is not None:
            if how:
                self._warnings.append(self.engine.no_magnitudes)
            how = None
        self._meta.update(self.engine.start(self._params, self._sampling))  # collectives
        for key, fact in ((K.DROPOUT, _no_dropout.unless_off(active_dropout(self._module))), (K.COUPLED, coupled(self._module))):
            if fact:  # dropout draws its own masks (none under --no-dropout); BatchNorm mixes samples
                self._meta[key] = fact
        self._world = rank_world()[1]
        # Opened by rank 0 at its first step, when the process group says which rank is 0.
        self._stream: Stream | None = None
        self._tensors: dict[str, torch.Tensor] = {}
        self._steps = 0
        self.state = "open"
        # Peaks start from the initial weights: SGD rounds a weight at the largest size it took.
        # A sampled parameter's at its positions only; where each rank keeps its own part, that.
        self._peaks = {n: self._peak_part(n, p).abs() for n, p in self._params if n in self._trained}
        self._last_step: float | None = None  # perf_counter at the previous step
        self._closed_at_destroy = False
        self._scratch: dict[str, torch.Tensor] = {}
        # Magnitudes add up in at least float32, so that many half-precision terms keep their sum.
        self._backwards = Backwards(how, torch.promote_types(self._dtype, torch.float32))
        # Per parameter, whether the loop set its gradient to None after the last step (so the
        # step's gradient can be lent to the writer instead of copied: nothing changes it).
        self._nulled: dict[str, bool] = {}
        self._seen: set[str] = set()
        self._exchange = Exchange()
        module = {id(p) for p in self._module.parameters()}
        self._others = _extras.Others({id(p) for _, p in self._params}, module, self._dtype, self.engine.whole_params)
        # The weights' checksums as the step about to be recorded found them: (step, the
        # names written, one int64 per followed parameter); at destroy, the final weights'.
        self._weights: tuple[int, list[str], torch.Tensor] | None = None
        self._rank_final: tuple[int, list[str], torch.Tensor] | None = None
        self._perturb, bad = _perturb.scale()
        self._warnings += [bad] if bad else []
        self._nudged = -1  # the last step whose gradients were nudged
        # Last, once nothing above can refuse: what torch's patched calls see from now on
        # (a `record()` session's watch, opened when it started, or one of this recorder's own).
        self._own_watch = watch is None
        self._watch = _torch_patches.open_watch() if watch is None else watch
        hooked = self.engine.backward_hooks
        local = self.engine.local_hooks and not (self._world == 1 and self.engine.local_is_applied)
        # Where both are wanted, this recorder's hooks also add the local sums for the watch.
        self._local = self._watch.local if hooked and local else None
        # Magnitudes of the parameters that train now (a hook needs requires_grad); one
        # unfrozen later has none, and its steps carry no `scale`.
        self._measured = [(n, p) for n, p in self._params if p.requires_grad]
        self._hooks = [p.register_hook(self._summer(n, p)) for n, p in self._measured] if hooked else []
        if local:
            self._watch.hook_local(self._module)
            if hooked:
                self._watch.unhook_local({id(p) for _, p in self._params})
        else:
            self._watch.no_local_hooks()
            if self.engine.local_hooks:  # one process: what the watch's hooks summed goes too
                self._watch.local.clear()
        if self.engine.write_at_destroy:
            self._watch.on_destroy = self._on_destroy
        elif self.engine.weights_replicated:
            self._watch.on_destroy = self._final_checksums

    @property
    def _magnitudes(self) -> str | None:
        return self._backwards.how

    @property
    def params(self) -> list[tuple[str, torch.nn.Parameter]]:
        """The recorded parameters, by name."""
        return self._params

    def _peak_part(self, name: str, p: torch.Tensor) -> torch.Tensor:
        """The part of the weight this rank's peaks follow: its own part where the engine
        keeps one per rank, else the kept elements of the whole weight."""
        part = self.engine.local_weight(name, p)
        return part if part is not None else self._sampling.kept(name, self.engine.weight(name, p))

    def _summer(self, name: str, param: torch.nn.Parameter) -> Any:
        # A tensor hook on a leaf sees each backward's own gradient before it is added to .grad
        # (under DDP: this rank's, before the all-reduce; under no_sync too). Called for every
        # parameter of every backward: what does not change is looked up once, here.
        key = id(param)
        add_local = self._local.add if self._local is not None else None
        add = self._backwards.add
        take = (lambda g: self._sampling.take(name, g)) if name in self._sampling else None

        def hook(grad: torch.Tensor) -> None:
            if add_local is not None:
                add_local(key, grad)
            if self._steps and name not in self._seen:
                self._seen.add(name)
                self._nulled[name] = param.grad is None
            # A gradient about to be added to in place may be one the writer still reads.
            if param.grad is not None:
                stream = self._stream
                if stream is not None and stream.busy():
                    stream.settle()
            add(name, grad, take)

        return hook

    def take_sums(self, sums: dict[str, Any], counts: dict[str, int]) -> None:
        """Magnitudes gathered before this recorder existed (the zero-edit hook's), as
        `magnitudes=` said: see `Backwards.take_early`. Where no tensor hook sees backwards,
        only their counts."""
        if not self.engine.backward_hooks:
            self._backwards.counts.update(counts)
            return
        self._backwards.take_early(sums, counts, self._sampling, dict(self._params))

    @property
    def steps(self) -> int:
        """Optimizer steps recorded so far."""
        return self._steps

    def check_open(self, what: str) -> None:
        if self.state != "open":
            raise RuntimeError(f"ddp_verify_trace({self.path!r}): {what} called after the recorder was {self.state}")

    def track_peaks(self, later: bool = False) -> None:
        """|w| into the peaks. `later`: on the writer thread, from weights that nothing changes
        until the caller's `settle()` (the hooks settle before the next optimizer step)."""
        # Into a scratch buffer kept from step to step: a fresh one per step costs more in
        # page faults than the arithmetic. Rank 0's alone are written (DDP's weights agree),
        # unless every rank keeps its own part.
        if rank_world()[0] != 0 and not self.engine.peaks_on_every_rank:
            return
        if later and self._stream is not None and not self.engine.peaks_now:
            self._stream.later(self._peaks_now)
        else:
            self._peaks_now()

    def settle(self) -> None:
        """Waits for the writer's work on the weights (before an optimizer step moves them)."""
        if self._stream is not None:
            self._stream.settle()

    def _peaks_now(self) -> None:
        # Whole weights by device, for three foreach operations each (`max_abs_into`).
        plain: dict[torch.device, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = {}
        self._others.track_peaks()
        for n, p in self._params:
            if n not in self._peaks:  # not trained (yet): a frozen base's peaks are not kept
                continue
            part = self.engine.local_weight(n, p)
            if part is not None:
                torch.maximum(self._peaks[n], part.abs(), out=self._peaks[n])
                continue
            if n in self._sampling:
                torch.maximum(self._peaks[n], self._sampling.take(n, self.engine.weight(n, p)).abs_(), out=self._peaks[n])
                continue
            scratch = self._scratch.get(n)
            if scratch is None:
                scratch = self._scratch[n] = torch.empty_like(self._peaks[n])
            w = self.engine.weight(n, p)
            plain.setdefault(w.device, []).append((self._peaks[n], scratch, w))
        for group in plain.values():
            max_abs_into(group)

    def _on_destroy(self) -> None:
        """The process group is about to go: the trace is written now, while the engine can
        still gather (a later close() has nothing left to do)."""
        if self.state == "open" and self._steps:
            self.close()
            self._closed_at_destroy = True

    def _gather(
        self,
        s: int,
        world: int,
        grads: dict[str, torch.Tensor | None] | None,
        packed: Packed,
        largest: torch.Tensor | None,
        weights: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        """The step's one collective of its own, under several ranks: every rank's stage
        facts; its per-tensor magnitudes (`largest`, where taken: summed over ranks here
        instead of in an all_reduce of their own, whose round trip cost a small model's
        DDP step 12%, measured); and its checksum of every gradient where `grads` are to be
        checked, and of every weight as the step found it (`weights`, `_take_weights`).
        Each part's bits as int64, side by side. Returns the checksums [W, P], the
        magnitudes averaged over ranks, as DDP averages gradients, and the weights'
        checksums [W, len(weights)] (None where not taken)."""
        every = rank_bits = averaged = rank_weights = None
        if world > 1:
            payload = packed.payload
            parts = [payload.view(torch.int64)]
            if largest is not None:
                parts.append(largest.to(payload.device, torch.float64).view(torch.int64))
            if grads is not None:
                zero = torch.zeros((), dtype=torch.int64, device=payload.device)
                parts.append(torch.stack([bits(g).to(payload.device) if (g := grads[n]) is not None else zero for n, _ in self._params]))
            if weights is not None:
                parts.append(weights.to(payload.device))
            got = all_gather(torch.cat(parts) if len(parts) > 1 else parts[0], world)
            every, rest = got.split([payload.numel(), got.shape[1] - payload.numel()], dim=1)
            every = every.contiguous().view(torch.float64)
            if largest is not None:
                mags, rest = rest.split([largest.numel(), rest.shape[1] - largest.numel()], dim=1)
                averaged = mags.contiguous().view(torch.float64).sum(0).div_(world).to(largest.device, largest.dtype)
            if grads is not None:
                rank_bits, rest = rest.split([len(self._params), rest.shape[1] - len(self._params)], dim=1)
            if weights is not None:
                rank_weights = rest
        rows, autocast, hashes, sums = self._exchange.finish(packed, every, world)
        for kind, t in (("batches", rows), ("autocast", autocast), ("samples", hashes)):
            if t is not None and t.numel():
                self._tensors[_schema.name(kind, s)] = t
        if sums[0]:  # a backward was seen on some rank
            # Views of one tensor, not a tensor each (the writer reads each view's own bytes).
            for (n, _), v in zip(self._params, sums[1:].split(1)):
                if n in self._trained:  # not a frozen base's zeros
                    self._tensors[_schema.name("local", s, n)] = v
        return rank_bits, averaged, rank_weights

    def step(
        self,
        optimizer: torch.optim.Optimizer | None = None,
        skipped: bool = False,
        *,
        grads: dict[str, torch.Tensor | None] | None = None,
        lrs: list[float] | None = None,
        after: bool = False,
    ) -> None:
        """Records the gradients as they are now: the ones this optimizer step applies (or,
        `skipped`, the ones a GradScaler found inf/NaN in and did not apply). `grads`: each
        parameter's whole gradient as the step applied it, where the engine gathered them
        (`Engine.applied`; None or missing: not stepped), instead of reading them now;
        `lrs`: the learning rates per parameter group, where the optimizer's `param_groups`
        do not say them all at the call (ZeRO narrows them). `after`: called once the
        optimizer applied the step (its pre-hook ran `before_step`); else before it."""
        self.check_open("step()")
        if not after:  # the weights as this step finds them; after, only as the pre-hook took them
            self._take_weights()
        if not skipped:  # a skipped step applies nothing: nothing to nudge
            self._nudge_at_step(grads is not None, after)
        scale = self._watch.scale
        if scale is not None:
            self._tensors[_schema.name("loss_scale", self._steps)] = torch.tensor([scale], dtype=torch.float32)
            self._tensors[_schema.name("found_inf", self._steps)] = torch.tensor([float(skipped)], dtype=torch.float32)
        # The first step after a second epoch was set: the steps before it made one epoch.
        if K.STEPS_PER_EPOCH not in self._meta and self._steps and self._watch.several_epochs():
            self._meta[K.STEPS_PER_EPOCH] = str(self._steps)
        _, world = rank_world()
        self._world = max(self._world, world)
        # Per-tensor magnitudes of several ranks go with the step's gather (`_gather`).
        measured = self._measured
        largest = self._backwards.local_largest(measured) if world > 1 and self._magnitudes == "tensor" and measured else None
        sums: Any = self._backwards.reduced(world, measured, self._sampling) if self._magnitudes and largest is None else {}
        s = self._steps
        syncs = self._watch.take_syncs()
        micro = self.engine.backwards(self._backwards.take_counts(), syncs)
        self._tensors[_schema.name("micro", s)] = torch.tensor([micro], dtype=torch.int64)
        self._engine_facts(s, world, syncs)
        if optimizer is not None:
            if lrs is None:
                lrs = [float(g["lr"]) for g in optimizer.param_groups]
            self._tensors[_schema.name("lr", s)] = torch.tensor(lrs, dtype=torch.float64)
            self._settings(optimizer)
            self._groups(s, optimizer, lrs)
        calls, last = self._watch.take_clips()
        if not calls and (inside := self.engine.clipped()) is not None:
            calls, last = 1, inside
        self._tensors[_schema.name("clips", s)] = torch.tensor([calls], dtype=torch.int64)
        if calls:
            self._tensors[_schema.name("clip", s)] = torch.tensor(last, dtype=torch.float64)
        if syncs:
            self._tensors[_schema.name("ddp_sync", s)] = torch.tensor(syncs, dtype=torch.int64)
        packed = self._stage_facts(s, world)
        # Each parameter's gradient as the trace keeps it: as the engine gathered it (every
        # rank takes part), or kept positions and summaries gathered where sampled.
        if grads is not None:
            grads, gathered = {n: grads.get(n) for n, _ in self._params}, {}
        else:
            grads, gathered = self.engine.gradients(self._params, self._sampling, self._summaries)
        for n, p in self._params:  # a parameter unfrozen since: followed to the end from now
            if grads[n] is not None and n not in self._trained:
                self._trained.add(n)
                self._peaks[n] = self._peak_part(n, p).abs()
        checked = world > 1 and self.engine.rank_checksums(bool(self._sampling.positions))
        weights = self._weights if self._weights is not None and self._weights[0] == s else None
        rank_bits, averaged, rank_weights = self._gather(
            s, world, grads if checked else None, packed, largest, weights[2] if weights else None
        )
        if rank_weights is not None and weights is not None and rank_world()[0] == 0:
            self._keep_columns(rank_weights, weights[1], lambda n: _schema.name("rank_weights", s, n))
        self._weights = None
        if averaged is not None:
            sums = averaged
        # Only rank 0 writes: the others take part in the collectives and keep nothing (no copies).
        if rank_world()[0] != 0:
            self._tensors = {}
            self._steps += 1
            return
        self._keep_step(s, grads, gathered, sums, rank_bits)
        _step_file.flush(self, s, grads)  # watch --stop-on-fault only
        self._steps += 1
        self._seen = set()
        _progress.tick(self._steps)

    def _stage_facts(self, s: int, world: int) -> Packed:
        """The step's stage facts (`_stages`): every rank's micro-batches and the local
        gradients' sums (packed here for `_gather`, which every rank calls), and the step
        calls a framework's wrapper took."""
        w = self._watch
        rank = rank_world()[0]
        device = self.engine.device(self._params[0][1]) if world > 1 else torch.device("cpu")
        packed = self._exchange.pack(w.batches.take(rank), w.local.take(self._params, device), device)
        if w.zeroed_in_window:
            self._tensors[_schema.name("zeroed", s)] = torch.tensor([w.zeroed_in_window], dtype=torch.int64)
            w.zeroed_in_window = 0
        calls = w.take_wrapper_calls()
        if calls or w.framework_accumulation is not None:
            self._tensors[_schema.name("step_calls", s)] = torch.tensor([calls], dtype=torch.int64)
        b = w.batches
        facts = ((K.LOSS_API, b.api), (K.LOSS_HANDED_BY, b.handed_by), (K.BACKWARD_BY, b.backward_by),
                 (K.NORMALISED_BY, b.normalised_by), (K.ZEROED_BY, w.zeroed_by),
                 (K.BOUNDARY_BY, w.boundary_by), (K.LOSS_REDUCTION, b.loss_reduction),
                 (K.LOSS_DTYPE, DTYPES.get(b.loss_dtype)), (K.SAMPLES_FROM, b.samples_from))  # fmt: skip
        for key, word in facts:
            if word is not None:
                self._meta[key] = word
        if w.framework_accumulation is not None:
            self._meta[K.FRAMEWORK_ACCUMULATION] = str(w.framework_accumulation)
        self._meta.update(frameworks.planned())
        return packed

    def _keep_step(
        self,
        s: int,
        grads: dict[str, Any],
        gathered: dict[str, tuple[torch.Tensor, torch.Tensor]],
        sums: Any,
        rank_bits: torch.Tensor | None,
    ) -> None:
        """Rank 0 hands step `s`'s tensors to the writer."""
        big: list[tuple[str, torch.Tensor]] = []
        lent: list[tuple[str, torch.Tensor]] = []
        # Per sampled parameter: (name, values at its positions, magnitudes there or None),
        # and the whole gradients' summaries, all on the device until one copy to the host.
        sampled: list[tuple[str, torch.Tensor, torch.Tensor | None]] = []
        sampling = self._sampling
        count = sum(grads[n] is not None for n, _ in self._params if n in sampling and n not in gathered)
        summaries = self._summary_rows(count)
        if self._magnitudes == "tensor":  # one small tensor for all parameters, split at close
            sums = dict(zip((n for n, _ in self._measured), sums.to("cpu", self._dtype).unbind()))
        # Each parameter's checksums of every rank: one row each of one transposed copy.
        columns = rank_bits.t().contiguous().unbind(0) if rank_bits is not None else None
        for i, (n, p) in enumerate(self._params):
            g = grads[n]
            if g is None:  # no gradient: the optimizer leaves this parameter alone
                continue
            if columns is not None:
                self._tensors[_schema.name("rank_bits", s, n)] = columns[i]
            if n in gathered:
                kept, summary = gathered[n]
                big.append((_schema.name("grads", s, n), kept.to(self._dtype)))
                self._tensors[_schema.name("summary", s, n)] = summary
                continue
            if n in sampling:
                g = g.detach()
                self._summaries(g, summaries[len(sampled)])
                sampled.append((n, sampling.take(n, g), sums.get(n) if self._magnitudes else None))
                continue
            grad = (_schema.name("grads", s, n), g)
            (lent if self._nulled.get(n) and g is p.grad and owns_memory(g) else big).append(grad)
            if n not in sums:  # unfrozen since the recording started: no hook measured it
                continue
            if self._magnitudes == "element":
                big.append((_schema.name("scale", s, n), sums[n].to(g.dtype)))
            elif self._magnitudes:
                self._tensors[_schema.name("scale", s, n)] = sums[n]
        for n, kept, scale, summary in to_host(sampled, summaries, self._dtype):
            big.append((_schema.name("grads", s, n), kept))
            if scale is not None:
                big.append((_schema.name("scale", s, n), scale))
            self._tensors[_schema.name("summary", s, n)] = summary
        self._open().put(big, lent)
        self._keep()

    def _summary_rows(self, count: int) -> torch.Tensor:
        """[count, 3] float64 where the engine's whole tensors are, a row per sampled tensor."""
        return torch.empty(count, 3, dtype=torch.float64, device=self.engine.device(self._params[0][1]))

    def _open(self) -> Stream:
        if self._stream is None:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            self._stream = Stream(self.path)
        return self._stream

    def _keep(self) -> None:
        stream = self._open()
        for name, t in self._tensors.items():
            stream.keep(name, t)
        self._tensors = {}

    def close(self) -> None:
        """Records the final weights and buffers and writes the file (rank 0 only)."""
        if self.state == "closed" and self._closed_at_destroy:
            return  # written when the process group went
        self.check_open("close()")
        self.finish("closed")
        self.settle()
        self.track_peaks()
        self._keep_finals()
        if rank_world()[0] == 0:
            self._keep()
            self._open().close(self._header())
            self._stream = None
        self._tensors = {}
        _collectives.settle()
        if rank_world()[0] == 0:
            _progress.tick(self._steps, force=True)

    def _keep_finals(self) -> None:
        """The final weights, peaks and buffers into the tensors to write."""
        sampling, name = self._sampling, _schema.name
        sampled: list[tuple[str, torch.Tensor, torch.Tensor | None]] = []
        # Those that trained: a base frozen from start to end is not written.
        params = [(n, p) for n, p in self._params if n in self._trained]
        finals = self.engine.finals(params, self._peaks, sampling, self._summaries)  # collectives
        summaries = self._summary_rows(len([n for n, _ in params if n in sampling and n not in finals]))
        for n, p in params:
            if n in finals:
                final, peak, summary = finals[n]
                self._tensors[name("final", param=n)] = final
                self._tensors[name("peak", param=n)] = peak
                if summary is not None:
                    self._tensors[name("final_summary", param=n)] = summary
                    self._tensors[name("positions", param=n)] = sampling.cpu[n]
                    self._tensors[name("shape", param=n)] = torch.tensor(list(p.shape), dtype=torch.int64)
                continue
            if n in sampling:
                w = self.engine.weight(n, p)
                self._summaries(w, summaries[len(sampled)])
                sampled.append((n, sampling.take(n, w), self._peaks[n]))
                continue
            self._tensors[name("peak", param=n)] = host(self._peaks[n])
            self._tensors[name("final", param=n)] = host(self.engine.weight(n, p))
        for n, final, peak, summary in to_host(sampled, summaries, self._dtype):
            self._tensors[name("final", param=n)] = final
            self._tensors[name("peak", param=n)] = peak  # type: ignore[assignment]
            self._tensors[name("final_summary", param=n)] = summary
            self._tensors[name("positions", param=n)] = sampling.cpu[n]
            self._tensors[name("shape", param=n)] = torch.tensor(list(self._shapes[n]), dtype=torch.int64)
        self._summaries.clear()
        self._others.track_peaks()
        for n, p in self._others.params:
            self._tensors[name("final", param=n)] = host(p)
            self._tensors[name("peak", param=n)] = host(self._others.peaks[n])
        got = self._rank_final
        if got is not None and got[0] == self._steps:  # no step since destroy_process_group gathered them
            self._keep_columns(got[2], got[1], lambda n: name("rank_final", param=n))
        for n, p in self._left_out:
            if p.grad is not None or p.requires_grad:
                self._warn(f"parameter {n}: its dtype {p.dtype} is not the trace's {self._dtype}; not recorded")
        for n, b in self._module.named_buffers():
            if not writable(b.dtype):
                self._warnings.append(f"buffer {n}: its dtype {b.dtype} is not one a trace holds; not recorded")
                continue
            self._tensors[name("buffer", param=n)] = host(b)

    def _header(self) -> dict[str, str]:
        magnitudes = {"element": _schema.Magnitudes.TRUE, "tensor": _schema.Magnitudes.PER_TENSOR}
        meta = {
            K.FORMAT: FORMAT,
            K.RUN: _schema.RunKind.DDP if self._world > 1 else _schema.RunKind.SINGLE,
            K.WORLD_SIZE: str(self._world),
            K.DTYPE: DTYPES[self._dtype],
            K.TORCH_VERSION: torch.__version__,
            K.VERSIONS: _owners.versions(),
            K.STEPS: str(self._steps),
            K.MAGNITUDES: magnitudes.get(self._magnitudes or "", _schema.Magnitudes.FALSE),
            **self._meta,
        }
        facts = (self.engine.closing_facts(self._world), _deal.header(self._watch.deal, self._world))
        for key, value in [kv for d in (*facts, _no_dropout.header(), _cpu_device.header()) for kv in d.items()]:
            meta.setdefault(key, value)
        warnings = self._warnings + self.engine.warnings() + _patches.missing()
        if warnings:
            meta[K.WARNINGS] = "\n".join(warnings)
        if self._others.unrecorded:
            meta[K.UNRECORDED_OPTIMIZERS] = ", ".join(sorted(self._others.unrecorded.values()))
        return meta

    def finish(self, state: str) -> None:
        """Records nothing more (`state` says why); a trace not "closed" is not written."""
        self.state = state
        if state != "closed":
            _collectives.settle()
        if state != "closed" and self._stream is not None:
            self._stream.abandon()
            self._stream = None
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self.engine.close()
        frameworks.forget_plan()  # that training's: none for a recording after it
        if self._own_watch:
            self._watch.close()
