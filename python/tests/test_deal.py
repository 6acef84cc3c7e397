"""How the data was dealt (`_deal.py`): DistributedSampler's padding and dropping, and a
loader's short or dropped last batch, as torch itself deals them; the recorder leaves both
classes as it found them."""
import torch
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, TensorDataset

from ddp_verify_trace import AccumulationBatchSampler, _deal, _torch_patches
from ddp_verify_trace._schema import Key as K


def data(n):
    return TensorDataset(torch.arange(n))


def test_padding_names_the_indices_torch_repeats():
    for shuffle in (False, True):
        s = DistributedSampler(data(11), num_replicas=3, rank=0, shuffle=shuffle, seed=5)
        s.set_epoch(2)
        facts = _deal.sampler(s)
        dealt = [i for r in range(3) for i in DistributedSampler(data(11), num_replicas=3, rank=r, shuffle=shuffle, seed=5)]
        # torch's own deal, epoch 0 (set_epoch on the others is not needed for shuffle=False)
        assert facts[K.SAMPLER_DATASET] == 11 and facts[K.SAMPLER_PADDED] == 1
        if not shuffle:
            repeated = [i for i in set(dealt) if dealt.count(i) > 1]
            assert facts[K.SAMPLER_REPEATED] == ",".join(map(str, repeated))


def test_dropping_and_the_last_batch():
    s = DistributedSampler(data(11), num_replicas=3, rank=0, drop_last=True)
    assert _deal.sampler(s) == {K.SAMPLER_DATASET: 11, K.SAMPLER_DROPPED: 2}
    assert _deal.loader(10, 4, False) == {K.LOADER_DROPPED: 0, K.SHORT_BATCHES: 1}
    assert _deal.loader(10, 4, True) == {K.LOADER_DROPPED: 2, K.SHORT_BATCHES: 0}
    assert _deal.header({K.LOADER_DROPPED: 2, K.SHORT_BATCHES: 0, K.SAMPLER_PADDED: 1}, 3) == {
        K.LOADER_DROPPED: "6",
        K.SAMPLER_PADDED: "1",
    }


def test_an_open_watch_notes_the_deal_and_the_classes_are_restored():
    before = (DistributedSampler.__iter__, BatchSampler.__iter__)
    watch = _torch_patches.open_watch()
    try:
        loader = DataLoader(data(11), batch_size=4, sampler=DistributedSampler(data(11), num_replicas=2, rank=0))
        assert [len(b[0]) for b in loader] == [4, 2]  # torch's own batches, unchanged
        assert watch.deal[K.SAMPLER_PADDED] == 1 and watch.deal[K.SHORT_BATCHES] == 1
    finally:
        watch.close()
    assert (DistributedSampler.__iter__, BatchSampler.__iter__) == before


def test_our_sampler_deals_as_w_ranks_do():
    watch = _torch_patches.open_watch()
    try:
        list(AccumulationBatchSampler(11, world=2, batch_size=4, shuffle=False))
        assert watch.deal[K.SAMPLER_PADDED] == 1 and watch.deal[K.SHORT_BATCHES] == 2
    finally:
        watch.close()


def test_accelerates_even_batches_are_padding():
    shard_mod = __import__("accelerate.data_loader", fromlist=["BatchSamplerShard"])
    watch = _torch_patches.open_watch()
    try:
        inner = BatchSampler(range(6), 2, False)
        dealt = [list(shard_mod.BatchSamplerShard(inner, num_processes=2, process_index=r)) for r in range(2)]
        assert dealt == [[[0, 1], [4, 5]], [[2, 3], [0, 1]]]  # accelerate's own deal, unchanged
        assert _deal.header(watch.deal, 2) == {K.SAMPLER_DATASET: "6", K.SAMPLER_PADDED: "2"}
    finally:
        watch.close()


def test_our_sampler_deals_a_step_as_one_big_batch_in_that_leg(monkeypatch):
    small = list(AccumulationBatchSampler(10, world=2, batch_size=2, shuffle=True, seed=3))
    monkeypatch.setenv("DDP_VERIFY_LEG", "big-batch")
    monkeypatch.setenv("DDP_VERIFY_ACC_STEPS", "2")
    big = list(AccumulationBatchSampler(10, world=2, batch_size=4, shuffle=True, seed=3))
    # Each big batch is the union of one step's K=2 micro-batches, in their order.
    assert big == [small[i] + small[i + 1] for i in range(0, len(small) - 1, 2)] + ([small[-1]] if len(small) % 2 else [])
