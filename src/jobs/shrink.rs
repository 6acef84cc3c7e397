//! proptest's shrink loop, run by hand: each candidate is a real run (our models' or a
//! user's script), so it is driven here rather than by proptest's test runner.

use proptest::strategy::ValueTree;

use crate::error::Result;

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
