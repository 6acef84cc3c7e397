//! Where the pipeline reads partings from, tier by tier: two legs compared (`Evidence`), and
//! next one run judged by its stages' contracts. A source owns its locators; the pipeline
//! owns the order of the tiers, the owner, the words and the known fixes.

use super::parting::{Parting, Side};
use crate::evidence::{Framework, Trace};

/// How strongly a parting decides, strongest first: the pipeline asks each tier in turn and
/// the first with a parting names the cause. Recorded facts outrank what the gradients'
/// shape suggests; inside a tier the source's locators run from the most specific to the
/// most general, and two that read one fact are one locator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tier {
    /// Against the big batch where DDP agrees: facts both runs share (clips, dropout).
    SharedFacts,
    /// Against the big batch where DDP agrees: what only a shared normalisation leaves.
    SharedShapes,
    /// The DDP leg never started its ranks: nothing else can be told.
    Launch,
    /// What ran differs: the deal, the steps and their cadence, micro-batches left
    /// unreduced, an engine's boundary. Step by step comparison means nothing then.
    Structure,
    /// The ranks' synchronisation as recorded: a rank apart from rank 0, the divide an
    /// engine was configured with.
    Synchronisation,
    /// A stage the walk located from recorded facts in a library's code.
    LibraryStage,
    /// Recorded facts of the loss and the update: learning rates, the loss scaler,
    /// non-finite values, clip counts, dropout keys. They part the runs' weights before the
    /// step the walk reads, which the walk takes as equal.
    Recorded,
    /// A model that trains with dropout on: each run draws its own masks.
    Dropout,
    /// Every gradient agrees: buffers, the optimizer's step.
    AfterGradients,
    /// What rounding and the comparison explain: chaos, a fixed tolerance, steps not kept.
    Rounding,
    /// Shapes the walk cannot see: a gradient never zeroed, a factor clipping put in one run.
    Unseen,
    /// A stage the walk located from recorded facts in the script.
    ScriptStage,
    /// The first differing step's shape: one factor, a count, a later epoch, other samples.
    Shape,
}

impl Tier {
    pub const ALL: [Tier; 13] = [
        Tier::SharedFacts,
        Tier::SharedShapes,
        Tier::Launch,
        Tier::Structure,
        Tier::Synchronisation,
        Tier::LibraryStage,
        Tier::Recorded,
        Tier::Dropout,
        Tier::AfterGradients,
        Tier::Rounding,
        Tier::Unseen,
        Tier::ScriptStage,
        Tier::Shape,
    ];
}

/// What the words may say of the legs: their labels and what is known of who ran them.
#[derive(Debug, Clone, Copy)]
pub struct Words<'a> {
    pub left: &'a str,
    pub right: &'a str,
    /// ddp-verify's own runs: its flags can be named in a fix.
    pub ours: bool,
    /// The framework that divides each loss by its accumulation steps itself, where one
    /// called the step.
    pub framework: Option<Framework>,
}

impl Words<'_> {
    pub fn label(&self, side: Side) -> &str {
        match side {
            Side::Left => self.left,
            Side::Right => self.right,
        }
    }
}

/// Partings and the facts behind them.
pub trait Source {
    /// The parting this source locates at `tier`, its most specific; None where nothing
    /// parts there. Asked lazily, strongest tier first: a weaker tier is never measured once
    /// a stronger one named the cause.
    fn locate(&self, tier: Tier) -> Option<Parting>;
    /// A leg's trace: its header and facts name the owner.
    fn trace(&self, side: Side) -> &Trace;
    fn words(&self) -> Words<'_>;
}
