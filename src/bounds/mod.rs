//! Bounds derived from the arithmetic that need no tensor library: what an optimizer makes
//! of a gradient's allowance. Our own runs (`train`) and users' traces (`judge`) carry them
//! by this one definition.

mod adamw;

pub use adamw::{AdamWParams, AdamWTrack};
