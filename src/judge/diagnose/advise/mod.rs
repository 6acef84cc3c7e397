//! The one place a cause's words are written: a parting and its owner in, the advice out,
//! aimed the way the facts point (a factor too large or too small, the script's code or a
//! library's). One family a file.

mod ran;
mod shape;
mod stages;
mod update;

use super::annotate::KnownFix;
use super::owner::Owner;
use super::parting::Parting;
use super::source::Words;
use crate::evidence::Framework;

/// What to say of `p`, owned by `owner`: the one family that has words for its mechanism.
pub fn advice(p: &Parting, owner: &Owner, w: &Words) -> String {
    ran::advice(p, owner, w)
        .or_else(|| stages::advice(p, owner, w))
        .or_else(|| update::advice(p, w))
        .or_else(|| shape::advice(p, w))
        .unwrap_or_else(|| format!("the runs part here ({})", p.mechanism.name()))
}

/// A known upstream fix, said after the cause it annotates.
pub fn known(f: &KnownFix) -> String {
    format!(" (known: {} {} to {}: {}; fixed in {}, {})", f.library, f.from, f.fixed_in, f.what, f.fixed_in, f.tracker)
}

/// The setting with which a framework divides each micro-batch's loss by its accumulation
/// steps itself, where it does (`measure::divides_loss` says whether).
pub fn loss_division(f: Framework) -> Option<&'static str> {
    match f {
        Framework::Lightning => Some("Lightning's Trainer(accumulate_grad_batches=K)"),
        Framework::Accelerate => Some("Accelerate's accelerator.backward under accumulate()"),
        Framework::Transformers => Some("Transformers' Trainer (gradient_accumulation_steps)"),
        Framework::DeepSpeed => Some("DeepSpeed's engine.backward (gradient_accumulation_steps)"),
        Framework::Plain | Framework::ColossalAi => None,
    }
}

/// What to do about a whole-number factor: divide by K, or not again where a framework does.
fn loss_scaling_fix(w: &Words) -> String {
    match w.framework.and_then(loss_division) {
        Some(how) => format!(
            "loss scaling; {how} already divides each loss by the accumulation steps, so a loss divided by K \
             in your own step is divided twice: return the plain mean loss"
        ),
        None => "loss scaling (divide each loss by K in accumulation, by K/W on each rank)".into(),
    }
}

/// The step a parting names, for words that need one (every locator that sets none says
/// no step).
fn step(p: &Parting) -> usize {
    p.step.unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::judge::diagnose::measure::divides_loss;

    /// A framework that divides the loss has the words for how, and only it.
    #[test]
    fn the_frameworks_that_divide_are_the_ones_named() {
        for f in Framework::ALL {
            assert_eq!(loss_division(*f).is_some(), divides_loss(*f), "{f:?}");
        }
    }
}
