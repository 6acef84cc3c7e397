//! Whose code owns a parting, from recorded facts: one rule per mechanism, whichever locator
//! found it. A library owns what its API did at the version the run imported; the rest is
//! the script's.

use super::measure::legs::{engine_accumulates, ran_backward};
use super::owner::Owner;
use super::parting::{Numbers, Parting, Scaled, Side, Synced};
use super::source::Source;
use crate::evidence::{DdpForward, Framework, Trace};

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
        Numbers::SteppedEarly { .. } => framework(t.header.framework, "its optimizer wrapper's step()"),
        // A DDP module a framework built decides, with that framework, when it reduces.
        Numbers::Unsynced { synced, .. } if *synced != Synced::NoDdpForward => {
            engine_reducer(src).or_else(|| ddp_builder(t)).unwrap_or(Owner::Script)
        }
        Numbers::Unsynced { .. } | Numbers::RanksDiffer { .. } => engine_reducer(src).unwrap_or(Owner::Script),
        Numbers::Reduction { configured: true, .. } => Owner::Script,
        Numbers::Reduction { .. } | Numbers::Lost { .. } => reducer(t),
        Numbers::NormaliserPerRank { .. } | Numbers::NormalisersApart { .. } | Numbers::ScaledPerRank { .. } => {
            framework(t.header.normalised_by, "the num_items_in_batch it passes the model's loss")
        }
        Numbers::WindowDivided { .. } => divider(t),
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

/// Whose code divided each loss by the accumulation steps: a framework's backward API that
/// divides (the root a fraction of what was handed), else whoever handed the loss on.
fn divider(t: &Trace) -> Owner {
    let api = t.header.loss_api.filter(|f| *f != Framework::Plain);
    match (api, t.header.loss_handed_by.filter(|f| *f != Framework::Plain)) {
        (Some(f), _) if t.header.framework_accumulation.is_some() => {
            Owner::of_framework(t, f, "its backward's division of the loss by its accumulation steps")
        }
        (_, Some(f)) => Owner::of_framework(t, f, "its division of the loss by its accumulation steps"),
        (Some(f), None) => Owner::of_framework(t, f, "its backward's division of the loss by its accumulation steps"),
        (None, None) => Owner::Script,
    }
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
