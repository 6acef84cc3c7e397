//! The locators: each reads recorded facts (or the gradients' shape) and returns a parting,
//! naming no owner and writing no words. One family a file, and none uses another
//! (`tests/it/architecture.rs`): what they share is measured in `measure`. Here, which tier
//! each serves when two legs are compared, and in which order inside it (the most specific
//! first: a whole factor before any factor, the walk's stage before the shape's guesses).

mod big_batch;
mod cautions;
mod contracts;
mod dropout;
mod precision;
mod rounding;
mod samples;
mod shape;
mod steps;
mod sync;
mod update;
mod walk;

pub use cautions::hidden_factor;
pub use precision::{apart as precision_apart, ranks_apart as ranks_precision_apart};
pub use walk::{facts_at, scaling_at, weight_rel};

use super::evidence::{Evidence, Pair};
use super::parting::{Parting, Side};
use super::source::{Source, Tier, Words};
use crate::evidence::Trace;

type Locator = fn(&Evidence) -> Option<Parting>;

/// Accumulation against DDP (or against the big batch, after what both share), tier by tier.
fn runs(tier: Tier) -> &'static [Locator] {
    match tier {
        Tier::SharedFacts | Tier::SharedShapes => &[],
        Tier::Launch => &[sync::one_process],
        Tier::Structure => &[
            precision::apart,
            precision::ranks_apart,
            steps::other_start,
            samples::epoch_cut_short,
            samples::uneven_data,
            sync::unreduced_tail,
            steps::step_count,
            steps::engine_boundary,
        ],
        Tier::Synchronisation => &[sync::rank_drift, sync::configured_divide],
        Tier::LibraryStage | Tier::ScriptStage => &[walked],
        Tier::Recorded => &[
            update::lr_schedule,
            update::settings,
            update::loss_scaler,
            rounding::non_finite,
            update::clip_count,
            update::clipped_before_reduction,
            dropout::keys,
        ],
        Tier::Dropout => &[masks],
        Tier::AfterGradients => &[update::after_the_gradients],
        Tier::Rounding => &[rounding::chaos, rounding::explicit_tolerance, rounding::not_kept],
        Tier::Unseen => &[steps::stale, shape::clipped_factor],
        Tier::Shape => &[
            shape::one_factor,
            shape::tensor_factor,
            samples::token_count_per_rank,
            samples::epoch,
            samples::different_samples,
            shape::unexplained,
        ],
    }
}

/// Accumulation against the big batch where DDP agrees and the steps match: a mistake both
/// make alike, asked before the rest.
fn shared(tier: Tier) -> &'static [Locator] {
    match tier {
        Tier::SharedFacts => &[update::clip_count, big_batch::window_divided, dropout::keys, dropout::on],
        Tier::SharedShapes => {
            &[big_batch::short_window, big_batch::token_count, big_batch::loss_scaling, big_batch::per_micro_batch_mean]
        }
        _ => &[],
    }
}

/// One run judged by its stages' contracts at the step `ev.first`: the facts that need no
/// reference run. Dropout draws each rank's masks, which no contract compares.
fn one_run(tier: Tier) -> &'static [Locator] {
    match tier {
        Tier::Structure => &[
            precision::ranks_apart,
            contracts::shared_samples,
            samples::epoch_cut_short,
            steps::stepped_early,
            sync::unreduced_tail,
            steps::engine_boundary,
        ],
        Tier::Synchronisation => &[sync::rank_drift, sync::configured_divide],
        Tier::LibraryStage | Tier::ScriptStage => &[walked],
        _ => &[],
    }
}

/// Dropout's masks, where the walk found no fact masks cannot move apart (a script's scaling
/// under dropout is still the script's, named in its later tier).
fn masks(ev: &Evidence) -> Option<Parting> {
    walked(ev).is_none().then(|| dropout::on(ev))?
}

/// The walk's parting, walked once for both of its tiers (the pipeline keeps it where its
/// owner puts it).
fn walked(ev: &Evidence) -> Option<Parting> {
    let walk = match ev.pair {
        Pair::OneRun => contracts::walk,
        _ => walk::walk,
    };
    ev.walked.get_or_init(|| walk(ev)).clone()
}

impl Source for Evidence<'_> {
    fn locate(&self, tier: Tier) -> Option<Parting> {
        let own = match self.pair {
            Pair::BigBatch { shared: true } => shared(tier),
            // A parting at a later step than the one judged is found at its own.
            Pair::OneRun => {
                let later = |p: &Parting| p.step.zip(self.first).is_some_and(|(at, judged)| at > judged);
                // Both legs are the run: every parting points at it, at the run's own step
                // (a trace of the latest steps of a run still training starts later).
                let first = self.b.header.first_step.unwrap_or(0);
                let run =
                    |p: Parting| Parting { leg: Some(Side::Right), step: p.step.map(|s| s.saturating_add(first)), ..p };
                return one_run(tier).iter().filter_map(|l| l(self)).find(|p| !later(p)).map(run);
            }
            _ => &[],
        };
        own.iter().chain(runs(tier)).find_map(|l| l(self))
    }

    fn trace(&self, side: Side) -> &Trace {
        match side {
            Side::Left => self.a,
            Side::Right => self.b,
        }
    }

    fn words(&self) -> Words<'_> {
        Words { left: self.left(), right: self.right(), ours: self.cx.ours(), framework: self.cx.framework() }
    }
}
