"""Stage facts: what each micro-batch went through between its samples and the gradient the
optimizer applied, so that the judge can name the first stage where two trainings part and
whose code owns it (docs/stages.md).

Per backward (one micro-batch), on each rank, kept as tensors until the step (no device sync
per micro-batch):
- the fingerprint of the first tensor input of the outermost module calls since the previous
  backward (the samples this micro-batch saw);
- `num_items_in_batch`, where the forward was passed one (the loss normaliser);
- the loss the model's forward returned, where it returned one;
- the value backward ran on (the root), and the root with its constant scalar factors
  peeled off the autograd graph (the loss before scaling);
- the value handed to a framework's backward API (`frameworks/`: each names its own, such
  as `accelerator.backward` or Lightning's `manual_backward`), where one was called.
Per step, per parameter: the sum of each backward's own gradient before any reduction (tensor
hooks, or the engine's own point before it reduces), added over ranks. Who handed the loss on
and who passed the normaliser are header words (`_schema.Framework`).

Here, one module each: `fingerprint` (the samples), `loss` (the normaliser, the forward's
loss, the factors peeled), `batches` (each micro-batch's row, per rank), `local_sums` (each
backward's own gradient, per rank), `exchange` (every rank's rows and sums in the step's one
collective). The functions are pure; the per-rank state is `Batches` and `LocalSums`, which
each recording's watch holds (`_watch`). This file imports none of them."""
