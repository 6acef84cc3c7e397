"""accumulation.py with a classic mistake: the loss is not divided by ACC_STEPS, so each
step's gradient is the sum of the micro-batch gradients, ACC_STEPS times DDP's average.
`ddp-verify compare` on its trace and ddp.py's reports the two runs NOT EQUIVALENT.

  python examples/own-loop/accumulation_mistake.py --out DIR   # DIR/accumulation.safetensors
"""
import argparse
import os
import random

import numpy as np
import torch
import torch.backends.cudnn as cudnn
import torch.nn as nn
import torch.optim as optim
from torch.utils.data import DataLoader, Dataset, Sampler

from ddp_verify_trace import TraceRecorder  # ddp-verify


class data_set(Dataset):

    def __init__(self, df):
        self.df = df

    def __len__(self):
        return len(self.df)

    def __getitem__(self, index):
        sample = self.df[index]
        return index, sample


class NeuralNetwork(nn.Module):
    def __init__(self, dsize):
        super().__init__()
        self.linear = nn.Linear(dsize, 1, bias=False)
        self.linear.weight.data[:] = 1.

    def forward(self, x):
        x = self.linear(x)
        loss = x.sum()
        return loss


class DummySampler(Sampler):
    def __init__(self, data, batch_size, n_gpus=2):
        self.num_samples = len(data)
        self.b_size = batch_size
        self.n_gpus = n_gpus

    def __iter__(self):
        ids = []
        for i in range(0, self.num_samples, self.b_size * self.n_gpus):
            ids.append(np.arange(self.num_samples)[i: i + self.b_size*self.n_gpus :self.n_gpus])
            ids.append(np.arange(self.num_samples)[i+1: (i+1) + self.b_size*self.n_gpus :self.n_gpus])
        return iter(np.concatenate(ids))

    def __len__(self):
        return self.num_samples


def main(args=None):

    d_size = args.data_size
    device = "cuda:0" if torch.cuda.is_available() else "cpu"

    # fix the seed for reproducibility
    seed = args.seed

    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
    cudnn.benchmark = True

    # generate data
    data = torch.rand(d_size, d_size)

    model = NeuralNetwork(args.data_size)
    model = model.to(device)

    optimizer = optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    dataset = data_set(data)

    # we define `DummySampler` for exact reproducibility with `DistributedSampler`
    # which splits the data as described in the article.
    sampler = DummySampler(dataset, args.batch_size)

    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        num_workers=0,
        pin_memory=torch.cuda.is_available(),
        sampler=sampler,
        shuffle=False,
        collate_fn=None,
    )

    # ACC_STEPS same as GPU as we need to divide the loss by this number
    # to obtain the same gradient as from multiple GPUs that are
    # averaged together
    ACC_STEPS = args.acc_steps
    optimizer.zero_grad()
    rec = TraceRecorder(model, os.path.join(args.out, "accumulation.safetensors"), overwrite=args.force, acc_steps=ACC_STEPS, steps_per_epoch=len(loader) // ACC_STEPS)  # ddp-verify

    for epoch in range(args.epochs):

        for i, (idxs, row) in enumerate(loader):

            row = row.to(device, non_blocking=True)

            loss = model(row)

            # MISTAKE: missing `loss = loss/ACC_STEPS`; the gradients sum instead of averaging
            loss.backward()

            if i == 0:
                print(f"Epoch {epoch} {100 * '='}")

            if (i + 1) % ACC_STEPS == 0:  # only step when we have done ACC_STEPS
                # acumulate grads for entire epoch
                rec.step()  # ddp-verify
                optimizer.step()
                optimizer.zero_grad()

    rec.close()  # ddp-verify
    if args.verbose:
        print(100 * "=")
        print("Model weights : ", model.linear.weight)
        print(100 * "=")


if __name__ == "__main__":

    parser = argparse.ArgumentParser()
    parser.add_argument('--seed', default=0, type=int)
    parser.add_argument('--epochs', default=2, type=int)
    parser.add_argument('--batch_size', default=4, type=int)
    parser.add_argument('--data_size', default=16, type=int)
    parser.add_argument('--acc_steps', default=3, type=int)
    parser.add_argument('--verbose', action='store_true',)
    parser.add_argument('--out', default="out/own-loop", help="writes OUT/accumulation.safetensors")  # ddp-verify
    parser.add_argument('--force', action='store_true', help="replace an existing trace")  # ddp-verify

    args = parser.parse_args()

    print(args)

    main(args)
