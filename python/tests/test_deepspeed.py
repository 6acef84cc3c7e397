"""DeepSpeed ZeRO 1/2/3: `find_zero` recognises the engine's inner optimizer in its step
hooks, and `Zero.full_grad` gathers the gradient it applies, the same at W=1 (K=4 micro-
batches) and W=2 (K/W=2 each) and equal to plain torch's mean of the micro-batch gradients."""
import pytest
import torch

from _deepspeed_runs import K, RECORDED, _reference


def _rel(a, b):
    return max((a[k] - b[k]).abs().max().item() for k in b) / max(v.abs().max().item() for v in b.values())


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_full_grad_equal_at_one_and_two_ranks(deepspeed_runs, stage):
    ref = _reference()
    mean = {k: sum(m[k] for m in ref) / K for k in ref[0]}
    one, two = deepspeed_runs[1][(stage, None)], deepspeed_runs[2][(stage, None)]
    for run, gas in ((one, K), (two, K // 2)):
        same, name, got_stage, got_gas, names = run["found"][0]
        assert same and name == f"deepspeed-zero{stage}" and got_stage == stage and got_gas == gas
        assert names == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
        assert set(run["post"]) == set(names)
        assert all(run["post"][k].dtype == torch.float32 and run["post"][k].shape == mean[k].shape for k in names)
        assert _rel(run["pre"], run["post"]) == 0  # the optimizer leaves the gradient it applied
        assert _rel(run["post"], mean) < 1e-6  # averaged over ranks and divided by GAS
    assert _rel(two["post"], one["post"]) < 1e-6
    assert _rel(two["params"], one["params"]) < 1e-6


def test_reset_every_backward_keeps_only_the_last_micro_batch(deepspeed_runs):
    ref = _reference()
    one, two = deepspeed_runs[1][(2, "reset-every-backward")], deepspeed_runs[2][(2, "reset-every-backward")]
    # ZeRO-2, GAS=1: no division, and each backward's boundary drops the gradients before it
    # (ZeRO-1 alike; ZeRO-3 instead keeps the sum of all of them, undivided).
    assert _rel(one["post"], ref[K - 1]) < 1e-6
    # Each rank keeps its last micro-batch; the ranks average.
    assert _rel(two["post"], {k: (ref[1][k] + ref[3][k]) / 2 for k in ref[0]}) < 1e-6


def _trace(path):
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return f.metadata(), {k: f.get_tensor(k) for k in f.keys()}


@pytest.mark.parametrize("stage", RECORDED)
def test_session_records_the_whole_gradient_and_weights_at_one_and_two_ranks(deepspeed_runs, stage):
    """hook.py's Session under ZeRO: one step of the whole gradient the engine applied (the
    mean of the K micro-batches'), the backwards of this rank, the engine and its
    accumulation in the header, and the same final weights at W=1 and W=2."""
    ref = _reference()
    mean = {k: sum(m[k] for m in ref) / K for k in ref[0]}
    finals = {}
    for world in (1, 2):
        meta, t = _trace(deepspeed_runs["folder"] / f"w{world}-zero{stage}.safetensors")
        assert (meta["steps"], meta["world_size"], meta["framework"]) == ("1", str(world), "deepspeed")
        assert (meta["engine"], meta["engine_accumulation"]) == (f"deepspeed-zero{stage}", str(K // world))
        assert meta["magnitudes"] == "false" and "ddp_forward" not in meta
        assert int(t["micro.0"]) == K // world and t["lr.0"].tolist() == [1e-2]
        assert not any(k.startswith("rank_bits") for k in t)
        assert _rel({k: t[f"grads.0.{k}"] for k in mean}, mean) < 1e-6
        finals[world] = {k: t[f"final.{k}"] for k in mean}
        assert all(t[f"peak.{k}"].shape == mean[k].shape for k in mean)
    assert _rel(finals[2], finals[1]) < 1e-6


def test_a_failing_gather_stops_the_recording_not_the_training(deepspeed_runs):
    assert deepspeed_runs[1]["stopped"].startswith("ddp_verify_trace: recording stopped at optimizer step 0 (in post)")
    assert "ZeroDivisionError" in deepspeed_runs[1]["stopped"]
    assert deepspeed_runs[1]["stopped_steps"] == 2  # the training went on
    assert not (deepspeed_runs["folder"] / "stopped.safetensors").exists()
