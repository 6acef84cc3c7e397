"""The trace format ddp-verify reads, generated from src/evidence/schema.rs and the header keys in
src/evidence/header.rs: do not edit.

Regenerate with `UPDATE_SCHEMA=1 cargo test --lib evidence::schema`; a Rust test holds this file to
the Rust tables and python/tests/test_schema.py holds what the recorder writes to this file.
"""

FORMAT = "ddp-verify-trace/2"
# sample="auto": whole tensors up to this many parameters, else SAMPLE_SIZE positions each
SAMPLE_SIZE = 1024
SAMPLE_FROM_PARAMETERS = 4000000
# How a recording stopped by an exception says so on stderr (ddp-verify quotes the line)
STOPPED = "ddp_verify_trace: recording stopped"
# The control run's nudge: each step's gradients moved by this fraction of each tensor's largest |g|
PERTURB_ENV = "DDP_VERIFY_PERTURB"
# The precision control: each backward seeded by W and each gradient divided back
DIVISOR_ENV = "DDP_VERIFY_DIVISOR"
# --no-dropout: every dropout of the run is the identity where this is 1
NO_DROPOUT_ENV = "DDP_VERIFY_NO_DROPOUT"
# --device cpu: a script's hard-coded CUDA and NCCL run on the CPU with gloo
DEVICE_ENV = "DDP_VERIFY_DEVICE"
# watch --stop-on-fault: the folder rank 0 writes each step's small trace into
STEP_FILE_ENV = "DDP_VERIFY_STEP_FILE"

# key: (value type, allowed values or None, required)
HEADER = {
    "format": ("text", None, True),
    "run": ("one of", ("accumulation", "single", "ddp",), True),
    "world_size": ("count", None, True),
    "dtype": ("one of", ("float32", "float64", "bfloat16", "float16",), True),
    "leg": ("one of", ("accumulation", "ddp", "big-batch",), False),
    "acc_steps": ("count", None, False),
    "steps_per_epoch": ("count", None, False),
    "steps": ("count", None, False),
    "magnitudes": ("one of", ("true", "per tensor", "false",), False),
    "framework": ("one of", ("plain", "transformers", "lightning", "colossalai", "accelerate", "deepspeed",), False),
    "ddp_forward": ("one of", ("seen", "none",), False),
    "ddp_built_by": ("one of", ("plain", "transformers", "lightning", "colossalai", "accelerate", "deepspeed",), False),
    "ddp_settings": ("text", None, False),
    "dropout": ("text", None, False),
    "start_weights": ("text", None, False),
    "dropout_off": ("text", None, False),
    "device_mapped": ("text", None, False),
    "coupled": ("text", None, False),
    "unrecorded_optimizers": ("text", None, False),
    "written_by": ("text", None, False),
    "recorded_by": ("text", None, False),
    "torch_version": ("text", None, False),
    "optimizer": ("text", None, False),
    "sample": ("count", None, False),
    "parameters": ("count", None, False),
    "engine": ("one of", ("ddp", "fsdp2", "deepspeed-zero0", "deepspeed-zero1", "deepspeed-zero2", "deepspeed-zero3",), False),
    "grad_divide": ("number", None, False),
    "compute_dtype": ("one of", ("float32", "float64", "bfloat16", "float16",), False),
    "autocast": ("one of", ("float32", "float64", "bfloat16", "float16",), False),
    "reduce_dtype": ("one of", ("float32", "float64", "bfloat16", "float16",), False),
    "divisor_control": ("number", None, False),
    "engine_accumulation": ("count", None, False),
    "versions": ("text", None, False),
    "loss_api": ("one of", ("plain", "transformers", "lightning", "colossalai", "accelerate", "deepspeed",), False),
    "loss_handed_by": ("one of", ("plain", "transformers", "lightning", "colossalai", "accelerate", "deepspeed",), False),
    "backward_by": ("one of", ("plain", "transformers", "lightning", "colossalai", "accelerate", "deepspeed",), False),
    "zeroed_by": ("one of", ("plain", "transformers", "lightning", "colossalai", "accelerate", "deepspeed",), False),
    "boundary_by": ("one of", ("plain", "transformers", "lightning", "colossalai", "accelerate", "deepspeed",), False),
    "first_step": ("count", None, False),
    "loss_reduction": ("text", None, False),
    "samples_from": ("text", None, False),
    "loss_dtype": ("one of", ("float32", "float64", "bfloat16", "float16",), False),
    "normalised_by": ("one of", ("plain", "transformers", "lightning", "colossalai", "accelerate", "deepspeed",), False),
    "normaliser_scope": ("one of", ("world", "rank",), False),
    "normaliser_scope_by": ("one of", ("plain", "transformers", "lightning", "colossalai", "accelerate", "deepspeed",), False),
    "framework_accumulation": ("count", None, False),
    "planned_steps": ("count", None, False),
    "planned_loader": ("count", None, False),
    "planned_accumulation": ("count", None, False),
    "planned_epochs": ("number", None, False),
    "planned_by": ("one of", ("plain", "transformers", "lightning", "colossalai", "accelerate", "deepspeed",), False),
    "sampler_dataset": ("count", None, False),
    "sampler_padded": ("count", None, False),
    "sampler_repeated": ("text", None, False),
    "sampler_dropped": ("count", None, False),
    "loader_dropped": ("count", None, False),
    "short_batches": ("count", None, False),
    "perturbed": ("number", None, False),
    "warnings": ("text", None, False),
    "betas": ("numbers", None, False),
    "eps": ("number", None, False),
    "weight_decay": ("number", None, False),
    "momentum": ("number", None, False),
    "amsgrad": ("flag", None, False),
    "nesterov": ("flag", None, False),
    "dampening": ("number", None, False),
    "maximize": ("flag", None, False),
}
OPTIMIZER_SETTINGS = ("betas", "eps", "weight_decay", "momentum", "amsgrad", "nesterov", "dampening", "maximize",)
# The columns of a batches.<step> row (stage facts), in order
BATCH_FIELDS = ("rank", "fingerprint", "forward", "peeled", "root", "handed", "normaliser", "samples", "every",)
# The columns of a groups.<step> row (one per param group of every optimizer; NaN: no such setting)
GROUP_FIELDS = ("optimizer", "group", "params", "lr", "weight_decay", "beta1", "beta2", "eps", "momentum",)


class Key:
    """Every header key, named as the Rust const: what the recorder writes the header through."""

    FORMAT = "format"
    RUN = "run"
    WORLD_SIZE = "world_size"
    DTYPE = "dtype"
    LEG = "leg"
    ACC_STEPS = "acc_steps"
    STEPS_PER_EPOCH = "steps_per_epoch"
    STEPS = "steps"
    MAGNITUDES = "magnitudes"
    FRAMEWORK = "framework"
    DDP_FORWARD = "ddp_forward"
    DDP_BUILT_BY = "ddp_built_by"
    DDP_SETTINGS = "ddp_settings"
    DROPOUT = "dropout"
    START_WEIGHTS = "start_weights"
    DROPOUT_OFF = "dropout_off"
    DEVICE_MAPPED = "device_mapped"
    COUPLED = "coupled"
    UNRECORDED_OPTIMIZERS = "unrecorded_optimizers"
    WRITTEN_BY = "written_by"
    RECORDED_BY = "recorded_by"
    TORCH_VERSION = "torch_version"
    OPTIMIZER = "optimizer"
    SAMPLE = "sample"
    PARAMETERS = "parameters"
    ENGINE = "engine"
    GRAD_DIVIDE = "grad_divide"
    COMPUTE_DTYPE = "compute_dtype"
    AUTOCAST = "autocast"
    REDUCE_DTYPE = "reduce_dtype"
    DIVISOR_CONTROL = "divisor_control"
    ENGINE_ACCUMULATION = "engine_accumulation"
    VERSIONS = "versions"
    LOSS_API = "loss_api"
    LOSS_HANDED_BY = "loss_handed_by"
    BACKWARD_BY = "backward_by"
    ZEROED_BY = "zeroed_by"
    BOUNDARY_BY = "boundary_by"
    FIRST_STEP = "first_step"
    LOSS_REDUCTION = "loss_reduction"
    SAMPLES_FROM = "samples_from"
    LOSS_DTYPE = "loss_dtype"
    NORMALISED_BY = "normalised_by"
    NORMALISER_SCOPE = "normaliser_scope"
    NORMALISER_SCOPE_BY = "normaliser_scope_by"
    FRAMEWORK_ACCUMULATION = "framework_accumulation"
    PLANNED_STEPS = "planned_steps"
    PLANNED_LOADER = "planned_loader"
    PLANNED_ACCUMULATION = "planned_accumulation"
    PLANNED_EPOCHS = "planned_epochs"
    PLANNED_BY = "planned_by"
    SAMPLER_DATASET = "sampler_dataset"
    SAMPLER_PADDED = "sampler_padded"
    SAMPLER_REPEATED = "sampler_repeated"
    SAMPLER_DROPPED = "sampler_dropped"
    LOADER_DROPPED = "loader_dropped"
    SHORT_BATCHES = "short_batches"
    PERTURBED = "perturbed"
    WARNINGS = "warnings"
    BETAS = "betas"
    EPS = "eps"
    WEIGHT_DECAY = "weight_decay"
    MOMENTUM = "momentum"
    AMSGRAD = "amsgrad"
    NESTEROV = "nesterov"
    DAMPENING = "dampening"
    MAXIMIZE = "maximize"


# The words a key may hold, a class per Rust enum: each word upper-cased, '-' and ' ' as '_'
class RunKind:
    """The words the run key holds."""

    ACCUMULATION = "accumulation"
    SINGLE = "single"
    DDP = "ddp"


class Dtype:
    """The words the dtype and compute_dtype and autocast and reduce_dtype and loss_dtype keys hold."""

    FLOAT32 = "float32"
    FLOAT64 = "float64"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"


class Leg:
    """The words the leg key holds."""

    ACCUMULATION = "accumulation"
    DDP = "ddp"
    BIG_BATCH = "big-batch"


class Magnitudes:
    """The words the magnitudes key holds."""

    TRUE = "true"
    PER_TENSOR = "per tensor"
    FALSE = "false"


class Framework:
    """The words the framework and ddp_built_by and loss_api and loss_handed_by and backward_by and zeroed_by and boundary_by and normalised_by and normaliser_scope_by and planned_by keys hold."""

    PLAIN = "plain"
    TRANSFORMERS = "transformers"
    LIGHTNING = "lightning"
    COLOSSALAI = "colossalai"
    ACCELERATE = "accelerate"
    DEEPSPEED = "deepspeed"


class DdpForward:
    """The words the ddp_forward key holds."""

    SEEN = "seen"
    NONE = "none"


class Engine:
    """The words the engine key holds."""

    DDP = "ddp"
    FSDP2 = "fsdp2"
    DEEPSPEED_ZERO0 = "deepspeed-zero0"
    DEEPSPEED_ZERO1 = "deepspeed-zero1"
    DEEPSPEED_ZERO2 = "deepspeed-zero2"
    DEEPSPEED_ZERO3 = "deepspeed-zero3"


class NormaliserScope:
    """The words the normaliser_scope key holds."""

    WORLD = "world"
    RANK = "rank"


# kind: (name pattern, elements, shape)
TENSORS = {
    "grads": ("grads.{step}.{param}", "float", "param"),
    "scale": ("scale.{step}.{param}", "float", "param"),
    "final": ("final.{param}", "float", "param"),
    "peak": ("peak.{param}", "float", "param"),
    "buffer": ("buffer.{param}", "any", "param"),
    "lr": ("lr.{step}", "finite", "some"),
    "micro": ("micro.{step}", "i64", "one"),
    "clips": ("clips.{step}", "i64", "one"),
    "clip": ("clip.{step}", "f64", "two"),
    "rank_bits": ("rank_bits.{step}.{param}", "i64", "vector"),
    "ddp_sync": ("ddp_sync.{step}", "i64", "vector"),
    "comm": ("comm.{step}", "i64", "two"),
    "seconds": ("seconds.{step}", "finite", "one"),
    "batches": ("batches.{step}", "f64", "vector"),
    "samples": ("samples.{step}", "f64", "vector"),
    "autocast": ("autocast.{step}", "f64", "vector"),
    "local": ("local.{step}.{param}", "f64", "one"),
    "step_calls": ("step_calls.{step}", "i64", "one"),
    "zeroed": ("zeroed.{step}", "i64", "one"),
    "groups": ("groups.{step}", "f64", "vector"),
    "rank_weights": ("rank_weights.{step}.{param}", "i64", "vector"),
    "rank_final": ("rank_final.{param}", "i64", "vector"),
    "loss_scale": ("loss_scale.{step}", "finite", "one"),
    "found_inf": ("found_inf.{step}", "finite", "one"),
    "unscales": ("unscales.{step}", "finite", "one"),
    "scaler_updates": ("scaler_updates.{step}", "finite", "one"),
    "range_part": ("range_part.{step}", "finite", "one"),
    "positions": ("positions.{param}", "i64", "vector"),
    "shape": ("shape.{param}", "i64", "vector"),
    "summary": ("summary.{step}.{param}", "f64", "three"),
    "final_summary": ("final_summary.{param}", "f64", "three"),
}


class Tensor:
    """Every tensor kind, by its name's prefix (what name() takes)."""

    GRADS = "grads"
    SCALE = "scale"
    FINAL = "final"
    PEAK = "peak"
    BUFFER = "buffer"
    LR = "lr"
    MICRO = "micro"
    CLIPS = "clips"
    CLIP = "clip"
    RANK_BITS = "rank_bits"
    DDP_SYNC = "ddp_sync"
    COMM = "comm"
    SECONDS = "seconds"
    BATCHES = "batches"
    SAMPLES = "samples"
    AUTOCAST = "autocast"
    LOCAL = "local"
    STEP_CALLS = "step_calls"
    ZEROED = "zeroed"
    GROUPS = "groups"
    RANK_WEIGHTS = "rank_weights"
    RANK_FINAL = "rank_final"
    LOSS_SCALE = "loss_scale"
    FOUND_INF = "found_inf"
    UNSCALES = "unscales"
    SCALER_UPDATES = "scaler_updates"
    RANGE_PART = "range_part"
    POSITIONS = "positions"
    SHAPE = "shape"
    SUMMARY = "summary"
    FINAL_SUMMARY = "final_summary"


def name(kind, step=None, param=None):
    """A tensor's name in a trace: name("grads", 3, "fc.weight") is "grads.3.fc.weight"."""
    return TENSORS[kind][0].format(step=step, param=param)
