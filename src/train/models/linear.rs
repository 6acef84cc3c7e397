use tch::{Device, Kind, Tensor};

use super::{Autocast, Model};
use crate::train::data::Batch;

/// The seed article's model: `nn.Linear(D, 1, bias=False)` with its weight set to 1.0,
/// whose forward returns the sum of its outputs as the loss.
pub struct Linear {
    params: Vec<(String, Tensor)>,
    cast: Autocast,
}

impl Linear {
    pub fn new(features: usize, kind: Kind, device: Device, cast: Autocast) -> Self {
        let weight = Tensor::ones([1, features as i64], (kind, device)).set_requires_grad(true);
        Linear { params: vec![("linear.weight".to_string(), weight)], cast }
    }
}

impl Model for Linear {
    fn parameters(&self) -> &[(String, Tensor)] {
        &self.params
    }

    fn loss(&self, batch: &Batch) -> Tensor {
        // F.linear then .sum(): the same ATen calls nn.Linear and the article make (under
        // autocast the sum stays in the autocast dtype, as it does on the CPU).
        let c = self.cast;
        c.low(&batch.x).linear(&c.low(&self.params[0].1), None::<Tensor>).sum(None)
    }
}
