"""DeepSpeed ZeRO 1/2/3: `find_zero` recognises the engine's inner optimizer in its step
hooks, and `Zero.full_grad` gathers the gradient it applies, the same at W=1 (K=4 micro-
batches) and W=2 (K/W=2 each) and equal to plain torch's mean of the micro-batch gradients."""
import pytest
import torch

from _deepspeed_runs import BF16, K, RECORDED, _reference


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
    """session.py's Session under ZeRO: one step of the whole gradient the engine applied (the
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


def _within_bf16(got, ref):
    """`got` is the gradient of the micro-batches `ref` (each its bfloat16 gradient, as float32)
    summed, within bfloat16 rounding: no element further from the float32 sum than two
    roundings of the sum of the terms' magnitudes (one of each rank's partial sum, one of
    the reduced sum: DeepSpeed accumulates or reduces in bfloat16), 2 * 2^-8 * sum |g|."""
    for k in ref[0]:
        total = sum(m[k] for m in ref)
        magnitude = sum(m[k].abs() for m in ref)
        assert ((got[k] - total).abs() <= 2 * 2**-8 * magnitude).all(), k


@pytest.mark.parametrize("stage", sorted(BF16))
def test_bf16_wrappers_gather_the_gradient_they_applied_at_one_and_two_ranks(deepspeed_runs, stage):
    """bfloat16 parameters: ZeRO 1 with float32 accumulation steps through BF16_Optimizer
    (flat fp32 partitions, one inner step for both parameter groups), stage 0 through
    FP16_UnfusedOptimizer (a whole fp32 copy per parameter): the gradient the inner step
    applied is the plain bfloat16 micro-batches' accumulation, at W=1 and W=2 alike."""
    wrapper = BF16[stage][0]
    for world in (1, 2):
        run, gas = deepspeed_runs[world][(stage, "bf16")], K // world
        same, name, got_stage, got_gas, names = run["found"][0]
        assert same and name == f"deepspeed-zero{stage}" and (got_stage, got_gas) == (stage, gas)
        assert run["kind"] == (wrapper, "bf16" if stage == 1 else "copies", 1)
        assert set(run["post"]) == set(names) and run["lrs"] == {0: 1e-2, 1: 5e-3}
        assert all(run["post"][k].dtype == torch.float32 for k in names)
        assert _rel(run["pre"], run["post"]) == 0
        # Each rank's micro-batches' losses divided by GAS, their gradients averaged over ranks.
        ref = [{k: g / world for k, g in m.items()} for m in _reference(bf16=True, scale=1 / gas)]
        _within_bf16(run["post"], ref)
    one, two = deepspeed_runs[1][(stage, "bf16")], deepspeed_runs[2][(stage, "bf16")]
    assert _rel(two["params"], one["params"]) < 1e-6  # AdamW's first step: about lr, in fp32


@pytest.mark.parametrize("stage", sorted(BF16))
def test_a_session_records_bf16_wrappers_as_it_records_zero(deepspeed_runs, stage):
    """session.py's Session under BF16_Optimizer and FP16_UnfusedOptimizer: every step (no
    AttributeError at the first), the gradients as the step applied them, both groups'
    learning rates, the engine's accumulation and the bfloat16 compute in the header, and
    a trace that holds to the schema; the training made its two steps."""
    from test_schema import check_trace

    wrapper = BF16[stage][0]
    finals = {}
    for world in (1, 2):
        path = deepspeed_runs["folder"] / f"w{world}-bf16-zero{stage}.safetensors"
        kinds, meta = check_trace(path)
        _, t = _trace(path)
        assert deepspeed_runs[world][("wrapper", stage)] == (wrapper, 2)
        assert (meta["steps"], meta["world_size"], meta["framework"]) == ("2", str(world), "deepspeed")
        assert (meta["engine"], meta["engine_accumulation"]) == (f"deepspeed-zero{stage}", str(K // world))
        assert meta["compute_dtype"] == "bfloat16" and meta["dtype"] == "float32"
        assert meta["warnings"] == "DeepSpeed: no per-micro-batch magnitudes (its partitions are flat)"
        assert [int(t[f"micro.{s}"]) for s in (0, 1)] == [K // world] * 2
        assert t["lr.0"].tolist() == t["lr.1"].tolist() == [1e-2, 5e-3]
        assert {"grads", "final", "peak", "lr", "micro"} <= kinds
        ref = [{k: g / world for k, g in m.items()} for m in _reference(bf16=True, scale=1 / (K // world))]
        _within_bf16({k: t[f"grads.0.{k}"] for k in ref[0]}, ref)
        finals[world] = {k: t[f"final.{k}"] for k in ref[0]}
        # The fp32 master weights, not the model's bfloat16 copies of them.
        assert all(f.dtype == torch.float32 and not torch.equal(f, f.bfloat16().float()) for f in finals[world].values())
    # Two AdamW steps on gradients within bf16 rounding: each moves an element by at most
    # about its learning rate (1e-2), whichever way rounding tipped a tiny gradient.
    assert max((finals[2][k] - finals[1][k]).abs().max().item() for k in finals[1]) <= 2 * 2 * 1e-2


def test_an_unknown_wrapper_is_recorded_without_its_gradients_and_says_so(deepspeed_runs):
    """A DeepSpeed optimizer wrapper the recorder does not know (here ZeRO 1's, made
    unknown): no exception reaches the training (it made its two steps) and the recording
    goes on: its steps, micro-batches, learning rates and final weights, no gradient, and
    a header warning that says which wrapper and what is missing."""
    from test_schema import check_trace

    for world in (1, 2):
        path = deepspeed_runs["folder"] / f"w{world}-other.safetensors"
        kinds, meta = check_trace(path)
        _, t = _trace(path)
        assert deepspeed_runs[world]["other_steps"] == 2
        assert meta["steps"] == "2" and meta["engine"] == "deepspeed-zero1"
        assert "DeepSpeedZeroOptimizer (ZeRO stage 1) is not one the recorder knows" in meta["warnings"]
        assert "grads" not in kinds and {"final", "peak", "lr", "micro"} <= kinds
        assert [int(t[f"micro.{s}"]) for s in (0, 1)] == [K // world] * 2


def test_wrappers_are_told_apart_by_where_they_keep_their_master_weights():
    """No DeepSpeed needed: the kind is read from the wrapper's attributes, and a wrapper
    with none of the known ones is "other" (recorded without its gradients)."""
    from types import SimpleNamespace as Ns

    from ddp_verify_trace.engines.deepspeed import kind_of

    assert kind_of(Ns(fp32_partitioned_groups_flat=[], fp16_groups=[])) == "zero3"
    assert kind_of(Ns(single_partition_of_fp32_groups=[], bit16_groups=[])) == "zero"
    assert kind_of(Ns(fp32_groups_flat_partition=[], bf16_groups=[])) == "bf16"
    assert kind_of(Ns(fp32_groups_flat=[], fp16_groups=[])) == "flat"
    assert kind_of(Ns(fp32_groups=[], fp16_groups=[])) == "copies"
    assert kind_of(Ns(optimizer=None)) == "other"


def test_whole_copies_are_read_where_they_are_and_a_parameter_left_out_keeps_its_own_weight():
    """FP16_UnfusedOptimizer's layout (a whole fp32 copy per parameter, every rank) and
    FP16_Optimizer's (one whole flat fp32 tensor per group): each parameter's gradient and
    master weight read from its copy, no collective; a parameter the optimizer does not
    step (left out of its groups) has no gradient and its own weight."""
    from types import SimpleNamespace as Ns

    from ddp_verify_trace.engines.deepspeed import Zero

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).bfloat16()
    w32 = model.weight.detach().float().clone().requires_grad_()
    w32.grad = torch.randn(2, 3)
    flat = torch.cat([w32.detach().reshape(-1), torch.ones(2)]).requires_grad_()
    flat.grad = torch.arange(8.0)
    for wrapper, want in (
        (Ns(fp16_groups=[[model.weight]], fp32_groups=[[w32]]), w32.grad),
        (Ns(fp16_groups=[[model.weight, model.bias]], fp32_groups_flat=[flat]), torch.arange(6.0).view(2, 3)),
    ):
        wrapper.optimizer = torch.optim.SGD([w32] if hasattr(wrapper, "fp32_groups") else [flat], lr=0.1)
        zero = Zero(Ns(optimizer=wrapper, module=model), 0)
        assert zero.name == "deepspeed-zero0" and zero.groups() == 1 and zero.warnings == []
        assert zero.stepping(wrapper.optimizer)[0] is model.weight
        assert zero.lrs(wrapper.optimizer) == {0: 0.1}
        assert torch.equal(zero.full_grad(model.weight), want)
        assert torch.equal(zero.full_param(model.weight), w32.detach())
    zero = Zero(Ns(optimizer=Ns(fp16_groups=[[model.weight]], fp32_groups=[[w32]], optimizer=None), module=model), 0)
    assert zero.full_grad(model.bias) is None
    assert torch.equal(zero.full_param(model.bias), model.bias.detach().float())
