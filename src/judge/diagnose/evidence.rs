//! What every locator looks at: both traces, their comparison, what is known of the runs, and
//! the first step whose gradients diverged (flattened once, on first use).

use std::cell::OnceCell;

use super::parting::{Parting, Side};
use super::Context;
use crate::evidence::{Params, Trace};
use crate::judge::{Agreement, Comparison};

/// Which two legs are compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pair {
    /// Accumulation against DDP.
    Runs,
    /// Accumulation against one big batch of each step's samples; `shared`: DDP agreed with
    /// accumulation and the steps match, so what both runs share is asked first.
    BigBatch { shared: bool },
    /// One run judged by its stages' contracts (`ddp-verify watch`): both legs are the run,
    /// and `first` is the step judged.
    OneRun,
}

pub struct Evidence<'a> {
    pub a: &'a Trace,
    pub b: &'a Trace,
    pub c: &'a Comparison,
    pub cx: &'a Context,
    pub pair: Pair,
    /// The first optimizer step whose gradients diverged, if any did.
    pub first: Option<usize>,
    grads: OnceCell<Option<(Vec<f64>, Vec<f64>)>>,
    /// The stage walk's parting, once walked (`locate` asks it for two tiers).
    pub walked: OnceCell<Option<Parting>>,
}

impl<'a> Evidence<'a> {
    pub fn new(a: &'a Trace, b: &'a Trace, c: &'a Comparison, cx: &'a Context, pair: Pair) -> Self {
        let first = c.steps.iter().position(|g| g.verdict == Agreement::Diverged);
        Evidence { a, b, c, cx, pair, first, grads: OnceCell::new(), walked: OnceCell::new() }
    }

    /// What reports call each side.
    pub fn left(&self) -> &str {
        &self.c.left
    }

    pub fn right(&self) -> &str {
        &self.c.right
    }

    /// Both legs, left first.
    pub fn sides(&self) -> [(Side, &'a Trace); 2] {
        [(Side::Left, self.a), (Side::Right, self.b)]
    }

    /// Both sides' gradients at the first diverged step, flattened; None where no step
    /// diverged or the steps were compared as they came and not kept (ours, streamed).
    pub fn grads(&self) -> Option<(&[f64], &[f64])> {
        let kept = self.grads.get_or_init(|| {
            let s = self.first?;
            Some((flat(self.a.steps.get(s)?), flat(self.b.steps.get(s)?)))
        });
        kept.as_ref().map(|(x, y)| (x.as_slice(), y.as_slice()))
    }
}

/// Every tensor's elements in order, as float64.
pub fn flat(p: &Params) -> Vec<f64> {
    p.iter().flat_map(|(_, t)| t.to_f64()).collect()
}
