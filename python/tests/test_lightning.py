"""Lightning under DDP (gloo, two CPU ranks), recorded by `record()`: each optimizer step's
micro-batches (`micro.<s>`) and each one's all-reduce flag (`ddp_sync.<s>`) as DDP ran them.

Under manual optimization `training_step` runs inside DDP's forward, backwards and steps
included, and Lightning ends that forward with require_backward_grad_sync cleared: the flag
DDP's forward ends with decides nothing there (it said "0 of 2 reduced" of a run that
reduced both, and gave the last micro-batch's flag to the next step). Each `manual_backward`
decides where Lightning prepares DDP's reducer, and that is where the flags are taken.
The models are examples/lightning/train.py's, as ddp-verify runs them."""
import importlib.util
import os
import pathlib

import pytest
import torch

from _world import run_world

pytest.importorskip("lightning")

_EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "lightning" / "train.py"
K = 2  # micro-batches per optimizer step on each rank
# name: (--manual, --bug), and the flags each step of a rank records
RUNS = {
    "automatic": (None, None, [False, True]),  # Lightning's own no_sync on all but the last
    "manual-every": ("every", None, [True, True]),  # the docs' plain example: every backward reduced
    "manual-last": ("last", None, [False, True]),  # toggle_model(sync_grad=False) but the last
    "manual-sync-first": ("last", "sync-first", [True, False]),  # the bug: the last stays local
}


def _example():
    spec = importlib.util.spec_from_file_location("lightning_example", _EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fit(example, manual, bug):
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    L.seed_everything(0, verbose=False)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(16, 8, generator=g)
    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True).sin()), batch_size=2, shuffle=True)
    model = example.ManualRegressor(bug, K, manual) if manual else example.Regressor(bug)
    trainer = L.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, accumulate_grad_batches=1 if manual else K,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(model, loader)


def _worker(rank, world, folder):
    import ddp_verify_trace

    # As torchrun starts a rank: Lightning joins the process group already made.
    os.environ.update(
        TORCHELASTIC_RUN_ID="test", RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), GROUP_RANK="0",
        LOCAL_WORLD_SIZE=str(world),
    )
    example = _example()
    for name, (manual, bug, _) in RUNS.items():
        session = ddp_verify_trace.record(os.path.join(folder, f"{name}.safetensors"), overwrite=True)
        _fit(example, manual, bug)
        session.close()


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lightning")
    run_world(_worker, 2, str(folder))
    return folder


@pytest.mark.parametrize("name", list(RUNS))
def test_each_micro_batch_and_its_reduce_flag_belong_to_the_step_that_applied_it(traces, name):
    from safetensors import safe_open

    with safe_open(str(traces / f"{name}.safetensors"), "pt") as f:
        meta, t = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    flags = RUNS[name][2]
    # 16 samples, batch 2, two ranks: 4 micro-batches per rank, K=2 per step.
    assert meta["steps"] == "2" and meta["world_size"] == "2" and meta["framework"] == "lightning"
    for s in (0, 1):
        assert int(t[f"micro.{s}"]) == K, (name, s)
        assert t[f"ddp_sync.{s}"].tolist() == [int(x) for x in flags], (name, s)
    assert meta["ddp_forward"] == "seen" and meta["engine"] == "ddp"
    # Ranks hold the same gradients where the last micro-batch was all-reduced, else not.
    same = all(bool((t[k] == t[k][0]).all()) for k in t if k.startswith("rank_bits.0."))
    assert same == flags[-1], name
