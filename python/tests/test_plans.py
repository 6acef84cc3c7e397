"""A framework's plan of the run's optimizer steps, recorded as header facts (`planned_*`):
Trainer's max_steps from its loader, as its callbacks are told when training begins."""
import pytest
import torch
from safetensors import safe_open

import ddp_verify_trace

transformers = pytest.importorskip("transformers")


class _Rows(torch.utils.data.Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 3, generator=g), torch.randn(n, 1, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"inputs": self.x[i], "targets": self.y[i]}


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 1)

    def forward(self, inputs, targets=None):
        return {"loss": torch.nn.functional.mse_loss(self.fc(inputs), targets)}


def _train(tmp_path, **extra):
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, gradient_accumulation_steps=4,
        num_train_epochs=1, report_to=[], save_strategy="no", logging_strategy="no", use_cpu=True,
        disable_tqdm=True, remove_unused_columns=False, **extra,
    )
    path = tmp_path / "t.safetensors"
    with ddp_verify_trace.recording(path):
        transformers.Trainer(model=_Model(), args=args, train_dataset=_Rows(28)).train()
    with safe_open(str(path), "pt") as f:
        return f.metadata()


def test_trainers_plan_from_its_loader_is_recorded(tmp_path):
    meta = _train(tmp_path)
    # 14 batches of 2 at 4 per step: 4 windows, the last of 2 (this release rounds up).
    assert (meta["planned_loader"], meta["planned_accumulation"], meta["planned_epochs"]) == ("14", "4", "1.0")
    assert meta["planned_by"] == "transformers" and meta["planned_steps"] == meta["steps"] == "4"
    # Whose tokens num_items_in_batch counts, as the setting resolved (this release: all ranks').
    assert (meta["normaliser_scope"], meta["normaliser_scope_by"]) == ("world", "transformers")


def test_a_plan_is_its_trainings_alone(tmp_path):
    _train(tmp_path)
    path = tmp_path / "later.safetensors"
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ddp_verify_trace.recording(path):
        model(torch.ones(2, 3)).sum().backward()
        opt.step()
    with safe_open(str(path), "pt") as f:
        assert not [k for k in f.metadata() if k.startswith("planned")]


def test_steps_the_script_set_itself_are_no_plan(tmp_path):
    meta = _train(tmp_path, max_steps=2, average_tokens_across_devices=False)
    assert not [k for k in meta if k.startswith("planned")]
    # The normaliser's scope is a setting, recorded however the steps were planned.
    assert (meta["normaliser_scope"], meta["normaliser_scope_by"]) == ("rank", "plain")
