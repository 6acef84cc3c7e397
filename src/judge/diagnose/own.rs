//! Whose code owns a parting, from recorded facts: one rule per mechanism, whichever locator
//! found it. A library owns what its API did at the version the run imported; the rest is
//! the script's.

use super::measure::legs::{engine_accumulates, ran_backward};
use super::owner::{library_of, Owner};
use super::parting::{Numbers, Parting, Scaled, Side, Synced};
use super::source::Source;
use crate::evidence::{DdpForward, Framework, NormaliserScope, Trace};

/// The owner of `p`: the leg it points at (else the right one, the DDP leg) read for who
/// did what there.
pub fn own(p: &Parting, src: &dyn Source) -> Owner {
    let t = src.trace(p.leg.unwrap_or(Side::Right));
    let framework = |f: Option<Framework>, api: &str| Owner::of_framework(t, f.unwrap_or(Framework::Plain), api);
    match &p.numbers {
        Numbers::DealtUnevenly(_)
        | Numbers::DifferentInputs { .. }
        | Numbers::Regrouped { .. }
        | Numbers::SharedSamples { .. } => dealer(src.trace(Side::Right)),
        Numbers::EpochCutShort { .. } => framework(t.header.planned_by, "its steps-per-epoch arithmetic"),
        Numbers::SteppedEarly { .. } => framework(t.header.framework, "its optimizer wrapper's step()"),
        // A DDP module a framework built decides, with that framework, when it reduces.
        Numbers::Unsynced { synced, .. } if *synced != Synced::NoDdpForward => {
            engine_reducer(src).or_else(|| ddp_builder(t)).unwrap_or(Owner::Script)
        }
        Numbers::Unsynced { .. } | Numbers::RanksDiffer { .. } => engine_reducer(src).unwrap_or(Owner::Script),
        Numbers::Reduction { configured: true, .. } => Owner::Script,
        Numbers::Reduction { .. } | Numbers::Lost { .. } => reducer(t),
        // Each rank counting its own because the script set it so (Trainer's
        // average_tokens_across_devices=False): the script's choice, not the framework's.
        Numbers::NormaliserPerRank { .. } | Numbers::NormalisersApart { .. }
            if t.header.normaliser_scope == Some(NormaliserScope::Rank)
                && t.header.normaliser_scope_by == Some(Framework::Plain) =>
        {
            Owner::Script
        }
        Numbers::NormaliserPerRank { .. }
        | Numbers::NormalisersApart { .. }
        | Numbers::ScaledPerRank { .. }
        | Numbers::NormalisedPerMicroBatch { .. } => {
            framework(t.header.normalised_by, "the num_items_in_batch it passes the model's loss")
        }
        Numbers::WindowDivided { .. } => divider(t),
        // A framework's code handed the loss to backward for the user (Trainer's
        // training_step), and nothing between the loss and backward divided it: the division
        // it owes is missing, whatever the script returned.
        Numbers::Scaling { how: Scaled::Own { dev, handed, .. }, .. } if *dev > 1.0 && *handed != Framework::Plain => {
            framework(Some(*handed), "its training step's hand-over of the loss to backward")
        }
        Numbers::PrecisionApart { .. } | Numbers::RanksPrecision { .. } => {
            framework(t.header.framework, "its precision setting")
        }
        Numbers::ZeroedInWindow { .. } => framework(t.header.zeroed_by, "zero_grad inside the accumulation window"),
        Numbers::ScaledInBackward { .. } => framework(ran_backward(t), "its backward's own scaling of the gradients"),
        Numbers::Scaling { how: Scaled::NormalisedTwice { .. }, .. } => {
            framework(t.header.loss_handed_by, "its hand-over of a normalised loss to a backward that divides")
        }
        Numbers::Scaling { how: Scaled::ByApi { api, .. }, .. } => {
            framework(Some(*api), "its backward's division of the loss")
        }
        _ => Owner::Script,
    }
}

/// The framework whose code built the DistributedDataParallel module (Lightning's strategy,
/// Accelerate's prepare, Trainer), with its settings: the reduction it drives is its. None
/// where the script built it, or it was not recorded.
fn ddp_builder(t: &Trace) -> Option<Owner> {
    let f = t.header.ddp_built_by.filter(|f| *f != Framework::Plain)?;
    // The settings are the header's words, not the pipeline's: joined, not written.
    let api = match &t.header.ddp_settings {
        Some(s) => ["the DistributedDataParallel it built: ", s].concat(),
        None => "the DistributedDataParallel it built".to_string(),
    };
    Some(Owner::of_framework(t, f, api)).filter(Owner::is_library)
}

/// Whose code divided each loss by the accumulation steps: the code that chose the factor.
/// A framework that hands the loss to another's API owns the division it made before
/// handing it, and one that API applied where the framework told it how many to divide by
/// (the API named as where); a backward API the script called owns its own division.
fn divider(t: &Trace) -> Owner {
    let api = t.header.loss_api.filter(|f| *f != Framework::Plain);
    let handed = t.header.loss_handed_by.filter(|f| *f != Framework::Plain);
    match (api, handed) {
        (Some(a), Some(h)) if a != h => match api_divided(t) {
            // The API's words are the header's, joined, not written (advise writes causes).
            Some(true) => Owner::of_framework(
                t,
                h,
                [
                    "its division of the loss by its accumulation steps, applied in ",
                    library_of(a).unwrap_or("the API"),
                    "'s backward",
                ]
                .concat(),
            ),
            _ => Owner::of_framework(t, h, "its division of the loss by its accumulation steps before its backward"),
        },
        (Some(f), _) if t.header.framework_accumulation.is_some() => {
            Owner::of_framework(t, f, "its backward's division of the loss by its accumulation steps")
        }
        (_, Some(f)) => Owner::of_framework(t, f, "its division of the loss by its accumulation steps"),
        (Some(f), None) => Owner::of_framework(t, f, "its backward's division of the loss by its accumulation steps"),
        (None, None) => Owner::Script,
    }
}

/// Whether the backward API divided what it was handed (the roots a fraction of the handed
/// values), from every recorded micro-batch; None where nothing was handed.
fn api_divided(t: &Trace) -> Option<bool> {
    let by_api: Vec<f64> = t
        .facts
        .stages
        .iter()
        .flat_map(|s| &s.batches)
        .filter_map(|b| Some(b.root? / b.handed?).filter(|r| r.is_finite()))
        .collect();
    let mid = super::measure::median(by_api)?;
    Some(!super::measure::near(mid, 1.0, super::measure::FACTOR_REL))
}

/// Who dealt the samples: a framework that shards the data loader, else the script.
fn dealer(t: &Trace) -> Owner {
    match t
        .header
        .framework
        .filter(|f| matches!(f, Framework::Transformers | Framework::Accelerate | Framework::Lightning))
    {
        Some(f) => Owner::of_framework(t, f, "its sharding of the data loader"),
        None => Owner::Script,
    }
}

/// Whose code reduces a run's gradients: its engine's library, DeepSpeed where the loss went
/// through its engine.backward in one process (no engine named), the script where several
/// ranks ran and no DistributedDataParallel forward did (it all-reduced by hand), else
/// torch's DDP.
fn reducer(t: &Trace) -> Owner {
    let by_hand = t.header.ddp_forward == Some(DdpForward::None) && t.header.world_size.unwrap_or(1) > 1;
    match (t.header.engine, t.header.loss_api) {
        (None, Some(Framework::DeepSpeed)) => {
            Owner::library(t, "deepspeed", "ZeRO's gradient accumulation and reduction")
        }
        (None, _) if by_hand => Owner::Script,
        (e, _) => Owner::of_engine(t, e),
    }
}

/// Ranks that part under an engine whose reduction no script controls (DeepSpeed's ZeRO
/// reduces inside its own backward and step): that engine's library.
fn engine_reducer(src: &dyn Source) -> Option<Owner> {
    [Side::Right, Side::Left]
        .into_iter()
        .map(|s| src.trace(s))
        .find_map(|t| (engine_accumulates(t) && t.header.world_size.unwrap_or(1) > 1).then(|| reducer(t)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evidence::{Batch, StageStep};

    /// One step's micro-batches: each handed `handed` and run backward on `root`.
    fn divided(handed: Framework, api: Framework, root_over_handed: f64) -> Trace {
        let mut t = Trace::default();
        t.header.loss_handed_by = Some(handed);
        t.header.loss_api = Some(api);
        t.header.versions = Some("torch==2.13.0, transformers==4.54.0, accelerate==1.9.0".into());
        let batches = (0..3)
            .map(|i| Batch {
                handed: Some(0.25 * (i + 1) as f64),
                root: Some(0.25 * (i + 1) as f64 * root_over_handed),
                ..Batch::default()
            })
            .collect();
        t.facts.stages = vec![StageStep { batches, ..StageStep::default() }];
        t
    }

    #[test]
    fn a_short_windows_division_belongs_to_the_code_that_chose_the_factor() {
        // Trainer divided by K before accelerator.backward, which divided by 1.
        let o = divider(&divided(Framework::Transformers, Framework::Accelerate, 1.0));
        assert_eq!((o.name(), o.version()), ("transformers", Some("4.54.0")));
        // Trainer told the API to divide: Trainer's factor, applied in Accelerate's backward.
        let o = divider(&divided(Framework::Transformers, Framework::Accelerate, 0.25));
        assert_eq!(o.name(), "transformers");
        assert!(o.describe().contains("applied in accelerate's backward"), "{}", o.describe());
        // The script called accelerator.backward under accumulate(): the API's own count.
        let mut t = divided(Framework::Plain, Framework::Accelerate, 0.25);
        t.header.framework_accumulation = Some(4);
        assert_eq!(divider(&t).name(), "accelerate");
    }
}
