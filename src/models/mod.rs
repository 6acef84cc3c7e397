//! Models trained by both runs. Parameters carry PyTorch's `state_dict` names, because
//! those names are how our traces meet the ones PyTorch writes.

mod linear;
mod resnet;

pub use linear::Linear;
pub use resnet::{ResNet, ResNetSpec};

use tch::Tensor;

pub trait Model {
    /// Trainable parameters, sorted by name.
    fn parameters(&self) -> &[(String, Tensor)];
    /// The micro-batch's loss before any accumulation scaling.
    fn loss(&self, x: &Tensor) -> Tensor;
}
