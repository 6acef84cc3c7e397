//! What explore draws: random valid configurations of each model (proptest strategies,
//! so failures shrink and replay), and how a bug is planted in one.

use proptest::prelude::*;

use crate::spec::{
    Amp, AmpConfig, Bug, Dtype, LmConfig, ModelKind, OptimConfig, Optimizer, Schedule, Shape, TrainConfig,
};

/// Random valid configurations of the given models (linear three times as often as a
/// ResNet or tiny-lm when several are asked for: it is 20 times faster).
pub fn strategy(max_gpus: usize, models: &[ModelKind]) -> BoxedStrategy<TrainConfig> {
    let mut arms: Vec<(u32, BoxedStrategy<TrainConfig>)> = Vec::new();
    if models.contains(&ModelKind::Linear) {
        arms.push((3, linear_strategy(max_gpus).boxed()));
    }
    if models.iter().any(|m| m.is_resnet()) {
        arms.push((1, resnet_strategy(max_gpus).boxed()));
    }
    if models.contains(&ModelKind::TinyLm) {
        arms.push((1, tiny_lm_strategy(max_gpus).boxed()));
    }
    let models = match arms.len() {
        0 => linear_strategy(max_gpus).boxed(),
        1 => arms.pop().expect("one arm").1,
        _ => proptest::strategy::Union::new_weighted(arms).boxed(),
    };
    // Narrow dtypes keep SGD: AdamW's state in bfloat16 or float16 is what AMP avoids
    // (float32 moments), and what this tool checks there is the reduction. So do free-running
    // deep nets, held to a fixed tolerance: AdamW turns a rounding difference in a noise
    // gradient into a whole step, which only the derived (lockstep) bound follows.
    let narrow = |c: &TrainConfig| c.precision.dtype.is_narrow() || !c.bounds_hold();
    // tiny-lm drops out in one draw of three.
    let dropout = prop_oneof![2 => Just(0.0), 1 => 0.05f64..0.5];
    (models, optim_strategy(), dropout, amp_strategy())
        .prop_map(move |(c, optim, dropout, amp)| {
            // The drawn model's learning rate, momentum and weight decay; the step's the rest.
            let (lr, momentum, weight_decay) = (c.optim.lr, c.optim.momentum, c.optim.weight_decay);
            let optim = OptimConfig { lr, momentum, weight_decay, ..optim };
            let optim = if narrow(&c) { OptimConfig { optimizer: Optimizer::Sgd, ..optim } } else { optim };
            let dropout = if c.model.kind.token_loss() { dropout } else { 0.0 };
            // Autocast over float32 weights only; an overflow planted in a step that runs.
            let amp = match c.precision.dtype {
                Dtype::Float32 => {
                    let steps = crate::plan::optimizer_steps(&c);
                    AmpConfig { overflow_step: amp.overflow_step.filter(|&s| s < steps), ..amp }
                }
                _ => AmpConfig::default(),
            };
            let mut c = TrainConfig { optim, ..c };
            c.model.lm.dropout = dropout;
            c.precision.amp = amp;
            c
        })
        .boxed()
}

/// Mixed precision in one draw of three: bfloat16 autocast, or float16 with a GradScaler
/// from 2^4-2^16 growing every 1-6 steps, and one micro-batch made to overflow in one of
/// those draws of three.
pub fn amp_strategy() -> impl Strategy<Value = AmpConfig> {
    (0usize..6, 4i32..=16, 1u32..=6, prop_oneof![2 => Just(None), 1 => (0usize..4).prop_map(Some)]).prop_map(
        |(draw, scale, growth_interval, overflow_step)| match draw {
            0 => AmpConfig { amp: Some(Amp::Bfloat16), ..AmpConfig::default() },
            1 => AmpConfig { amp: Some(Amp::Float16), init_scale: 2f64.powi(scale), growth_interval, overflow_step },
            _ => AmpConfig::default(),
        },
    )
}

/// The optimizer step: SGD or AdamW (half each), clipping in one draw of three at a norm
/// that may or may not engage, and a constant, warmup or cosine schedule.
pub fn optim_strategy() -> impl Strategy<Value = OptimConfig> {
    (
        any::<bool>(),
        prop_oneof![2 => Just(None), 1 => (0.01f64..5.0).prop_map(Some)],
        prop_oneof![
            Just(Schedule::Constant),
            (1usize..6).prop_map(Schedule::Warmup),
            (1usize..6).prop_map(Schedule::Cosine)
        ],
        prop_oneof![Just(1e-8), Just(1e-6)],
    )
        .prop_map(|(adamw, clip_grad_norm, lr_schedule, eps)| OptimConfig {
            optimizer: if adamw { Optimizer::AdamW } else { Optimizer::Sgd },
            clip_grad_norm,
            lr_schedule,
            eps,
            ..OptimConfig::default()
        })
}

/// Plants `bug` in a drawn configuration, with what it misuses (`plan::bugs::need`: clipping
/// that always engages, a warmup, AdamW, dropout, a loss scaler). The other bugs are drawn
/// without clipping: clipping that engages at every step renormalises a wrongly scaled
/// gradient, which hides a scaling bug in a way no plan can foresee (it depends on the
/// gradients' norms).
pub fn plant(cfg: &mut TrainConfig, bug: Option<Bug>) {
    cfg.inject = bug;
    let Some(b) = bug else { return };
    // Bugs that only the big batch shows (both runs make them) need it, and --amp turns it off.
    if crate::plan::planted::in_both_runs(b) {
        cfg.precision.amp = AmpConfig::default();
    }
    cfg.optim.clip_grad_norm = None;
    if let Some(need) = crate::plan::bugs::need(b) {
        (need.give)(cfg);
    }
}

/// tiny-lm: W 1-4, K a multiple of W up to 12, short sequences of any lengths, float32 or
/// float64, in lockstep (its default), a short window at an epoch's end stepping.
pub fn tiny_lm_strategy(max_gpus: usize) -> impl Strategy<Value = TrainConfig> {
    let w_max = max_gpus.clamp(1, 4);
    (
        (1..=w_max, 1usize..=3, 1usize..=4, 1usize..=32, 1usize..=2, 2usize..=12, 0usize..=10),
        (any::<bool>(), any::<bool>(), 0u64..1000, 0.001f64..0.1, 0.0f64..0.95, prop_oneof![Just(0.0), 1e-4f64..1e-2]),
        (4usize..=64, any::<bool>(), 1usize..=4),
    )
        .prop_map(
            |(
                (gpus, local, batch_size, data_size, epochs, seq_len, shorter),
                (shuffle, drop_last, seed, lr, momentum, weight_decay),
                (vocab, double, steps),
            )| {
                let mut c = drawn(
                    Shape {
                        data_size: data_size.max(gpus),
                        seed,
                        batch_size,
                        acc_steps: local * gpus,
                        gpus,
                        shuffle,
                        drop_last,
                    },
                    (ModelKind::TinyLm, 8),
                    epochs,
                    (lr, momentum, weight_decay),
                );
                c.model.lm = LmConfig { vocab, seq_len, min_len: seq_len.saturating_sub(shorter).max(2), dropout: 0.0 };
                c.run.partial_window = crate::spec::PartialWindow::Step;
                c.run.max_steps = Some(steps);
                c.precision.dtype = if double { Dtype::Float64 } else { Dtype::Float32 };
                c.run.lockstep = true;
                c
            },
        )
        .prop_filter("a valid config", |c| crate::plan::checks::check_train(c).is_ok())
}

/// resnet-tiny: W 1-8, K a multiple of W up to 16, micro-batches BatchNorm accepts, every
/// dtype in lockstep, and float64 free-running for at most 2 steps (its chaos grows 10^3 to
/// 10^6-fold per step, so the fixed float64 bound holds for two).
pub fn resnet_strategy(max_gpus: usize) -> impl Strategy<Value = TrainConfig> {
    let w_max = max_gpus.clamp(1, 8);
    (
        (1..=w_max, 1usize..=16, 2usize..=4, 1usize..=64, prop_oneof![Just(8usize), Just(16)], 1usize..=2),
        (any::<bool>(), any::<bool>(), 0u64..1000, 0.001f64..0.05, 0.0f64..0.95, prop_oneof![Just(0.0), 1e-4f64..1e-2]),
        (0usize..5, 1usize..=4),
    )
        .prop_map(
            |(
                (gpus, local, batch_size, data_size, image_size, epochs),
                (shuffle, drop_last, seed, lr, momentum, weight_decay),
                (mode, steps),
            )| {
                // Mode 4 is float64 free-running; 0-3 are the dtypes in lockstep.
                let free = mode == 4;
                let acc_steps = (local.min(16 / gpus).max(1)) * gpus;
                let data_size = data_size.max(gpus * batch_size);
                let mut c = drawn(
                    Shape { data_size, seed, batch_size, acc_steps, gpus, shuffle, drop_last },
                    (ModelKind::ResnetTiny, 8),
                    epochs,
                    (lr, momentum, weight_decay),
                );
                c.model.resnet.image_size = image_size;
                c.run.max_steps = Some(if free { steps.min(2) } else { steps });
                c.precision.dtype = if free { Dtype::Float64 } else { Dtype::ALL[mode] };
                c.run.lockstep = !free;
                c
            },
        )
        .prop_filter("a valid config whose micro-batches BatchNorm accepts, planted bugs included", |c| {
            crate::plan::checks::check_train(c).is_ok()
                && std::iter::once(None)
                    .chain(Bug::ALL.map(Some))
                    .all(|b| crate::plan::bugs::micro_batches_hold(c, b, 2))
        })
}

/// A drawn shape, model (and D), epochs and (lr, momentum, weight decay); the rest the article's.
fn drawn(shape: Shape, (kind, features): (ModelKind, usize), epochs: usize, step: (f64, f64, f64)) -> TrainConfig {
    let mut c = TrainConfig { shape, ..TrainConfig::article() };
    (c.model.kind, c.model.linear.features, c.run.epochs) = (kind, features, epochs);
    (c.optim.lr, c.optim.momentum, c.optim.weight_decay) = step;
    c
}

/// The linear model; K is drawn as a multiple of W so every draw is usable.
pub fn linear_strategy(max_gpus: usize) -> impl Strategy<Value = TrainConfig> {
    (
        1..=max_gpus.max(1),
        1usize..=4,
        1usize..=48,
        1usize..=16,
        1usize..=8,
        1usize..=3,
        any::<bool>(),
        any::<bool>(),
        0u64..1000,
        0.001f64..0.1,
        0.0f64..0.95,
        any::<bool>(),
    )
        .prop_map(
            |(gpus, local, data_size, features, batch_size, epochs, shuffle, drop_last, seed, lr, momentum, step)| {
                let shape = Shape { data_size, seed, batch_size, acc_steps: local * gpus, gpus, shuffle, drop_last };
                let mut c = drawn(shape, (ModelKind::Linear, features), epochs, (lr, momentum, 0.0));
                c.run.partial_window =
                    if step { crate::spec::PartialWindow::Step } else { crate::spec::PartialWindow::Carry };
                c
            },
        )
        .prop_filter("a valid config with at least one optimizer step", |c| crate::plan::checks::check_train(c).is_ok())
}
