//! proptest's shrink loop, run by hand: each candidate is a real run (our models' or a
//! user's script's), so it is driven here rather than by proptest's test runner, within a
//! budget of runs set by what a run costs.

use proptest::strategy::ValueTree;

use crate::error::Result;

/// Most runs spent shrinking one finding, by subject: a budget of time, counted in runs.
/// One of our linear cases runs in about 10 ms (docs/speed.md: 6092 a minute), so 512 runs
/// cost seconds and shrink as far as the tree goes; a case of a user's script starts Python
/// for two or three legs and trains (about 13 s for examples/uneven, docs/speed.md), so 64
/// runs already cost up to a quarter of an hour, and `--max-time` may stop them sooner.
pub mod budget {
    /// Our own models' runs.
    pub const OUR_MODELS: usize = 512;
    /// A user's script's runs.
    pub const A_SCRIPT: usize = 64;
}

/// Simplifies while the property still shows, else complicates; the simplest value seen to
/// show it. `budget` caps the runs (each candidate is one).
pub fn shrink<T: ValueTree>(
    tree: &mut T,
    budget: usize,
    mut still_shows: impl FnMut(&T::Value) -> Result<bool>,
) -> Result<T::Value> {
    let mut best = tree.current();
    if !tree.simplify() {
        return Ok(best);
    }
    for _ in 0..budget {
        let c = tree.current();
        let more = if still_shows(&c)? {
            best = c;
            tree.simplify()
        } else {
            tree.complicate()
        };
        if !more {
            break;
        }
    }
    Ok(best)
}
