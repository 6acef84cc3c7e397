//! Scaling: the loss scaler's record, and one factor between the runs' gradients (a loss
//! divided by K, W or K/W in the wrong place, or multiplied in one run only).

use super::factor::{fitted_ratio, whole_ratio};
use super::{Context, Diagnosis, Evidence};
use crate::evidence::Framework;
use crate::judge::{Reason, ScalerEvent};

/// What the runs' loss scalers did differently, from their records.
pub fn loss_scaler(ev: &Evidence) -> Option<Diagnosis> {
    let m = ev.c.scaler?;
    let why = match m.what {
        ScalerEvent::Unscales => {
            "unscale once per optimizer step, after the last micro-batch's backward (and DDP's all-reduce): \
             unscaling inside the accumulation loop divides earlier micro-batches' share by the scale again"
        }
        ScalerEvent::Updates | ScalerEvent::LossScale => {
            "scaler.update() belongs once per optimizer step, after scaler.step(): updating after every \
             micro-batch grows the scale K times as often, and a scale changed inside a window scales its \
             micro-batches differently than the one unscale divides by"
        }
        ScalerEvent::Skipped => {
            "every run must see the same overflow: one rank's inf/NaN reaches every rank through the \
             all-reduce, and accumulation sums the same micro-batches; a run that checks other gradients \
             (before the all-reduce, or per rank) skips alone"
        }
    };
    Diagnosis::new(Reason::LossScaler, format!("{}: {why}", m.describe(ev.left(), ev.right())))
}

/// The right run's gradients are a whole multiple (or fraction) of the left's.
pub fn whole_factor(ev: &Evidence) -> Option<Diagnosis> {
    let (s, (x, y)) = (ev.first?, ev.grads()?);
    let r = whole_ratio(x, y, ev.cx.eps)?;
    let adam = match ev.cx.adam_family {
        true => {
            "; under AdamW the weights barely show it (Adam divides by √v, so a gradient K times too large makes \
             almost the same step), which is why the gradients are compared"
        }
        false => "",
    };
    Diagnosis::new(
        Reason::LossScaling,
        format!(
            "{} gradients are exactly {r:.2}x {}'s from step {s}: {}{adam}",
            ev.right(),
            ev.left(),
            loss_scaling_fix(ev.cx)
        ),
    )
}

/// One factor of any size: the same samples, scaled differently.
pub fn uniform_factor(ev: &Evidence) -> Option<Diagnosis> {
    let (s, (x, y)) = (ev.first?, ev.grads()?);
    let r = fitted_ratio(x, y, ev.cx.eps)?;
    Diagnosis::new(
        Reason::UniformFactor,
        format!(
            "{} gradients are a uniform {r:.4}x {}'s in every tensor at step {s}: the same samples, scaled \
             differently (a loss or gradient multiplied by a factor in one run only)",
            ev.right(),
            ev.left()
        ),
    )
}

/// The setting with which a framework divides each micro-batch's loss by its accumulation
/// steps itself, where it does.
pub fn loss_division(f: Framework) -> Option<&'static str> {
    match f {
        Framework::Lightning => Some("Lightning's Trainer(accumulate_grad_batches=K)"),
        Framework::Accelerate => Some("Accelerate's accelerator.backward under accumulate()"),
        Framework::Transformers => Some("Transformers' Trainer (gradient_accumulation_steps)"),
        Framework::DeepSpeed => Some("DeepSpeed's engine.backward (gradient_accumulation_steps)"),
        Framework::Plain | Framework::ColossalAi => None,
    }
}

/// Whether `f` divides the loss by its accumulation steps itself.
pub fn divides_loss(f: Framework) -> bool {
    loss_division(f).is_some()
}

/// What to do about a whole-number factor: divide by K, or not again where a framework does.
pub fn loss_scaling_fix(cx: &Context) -> String {
    match cx.framework().and_then(loss_division) {
        Some(how) => format!(
            "loss scaling; {how} already divides each loss by the accumulation steps, so a loss divided by K \
             in your own step is divided twice: return the plain mean loss"
        ),
        None => "loss scaling (divide each loss by K in accumulation, by K/W on each rank)".into(),
    }
}
