"""Minimal reproduction: Accelerate's `accelerator.backward` divides every loss by the configured
gradient_accumulation_steps, while `accelerator.accumulate()` (sync_with_dataloader=True, the
default) steps the optimizer at the end of the dataloader after a shorter window. The last
window's update is then held/K of its micro-batches' mean gradient.

  pip install torch==2.15.0 accelerate==1.15.0 && python docs/findings/accelerate_short_window.py

One process, CPU, seconds. Prints the gradient each optimizer step applied against the mean
of its micro-batches' gradients (what a loop dividing by the window's own count applies).
"""
import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

K = 4  # micro-batches per optimizer step
accelerator = Accelerator(cpu=True, gradient_accumulation_steps=K)
torch.manual_seed(0)
x, y = torch.randn(10, 3), torch.randn(10, 1)  # 5 batches of 2: a window of 4, then one of 1
model = torch.nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: every step sees the same weights
loader = DataLoader(TensorDataset(x, y), batch_size=2)
model, opt, loader = accelerator.prepare(model, opt, loader)


def mean_gradient(batches):
    """The mean of the micro-batches' gradients, each computed alone."""
    grads = []
    for xb, yb in batches:
        model.zero_grad()
        torch.nn.functional.mse_loss(model(xb), yb).backward()
        grads.append(model.weight.grad.clone())
    model.zero_grad()
    return torch.stack(grads).mean(0)


window, step = [], 0
for xb, yb in loader:
    window.append((xb, yb))
    with accelerator.accumulate(model):
        accelerator.backward(torch.nn.functional.mse_loss(model(xb), yb))
        if accelerator.sync_gradients:
            applied = model.weight.grad.clone()
            held = list(window)
            want = mean_gradient(held)  # clobbers .grad: read `applied` first
        opt.step()
        opt.zero_grad()
    if accelerator.sync_gradients:
        ratio = (applied.norm() / want.norm()).item()
        print(f"step {step}: {len(held)} of {K} micro-batches, applied/mean = {ratio:.4f}")
        window, step = [], step + 1
