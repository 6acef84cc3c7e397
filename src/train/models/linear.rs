use tch::{Device, Kind, Tensor};

use super::Model;
use crate::train::data::Batch;

/// The seed article's model: `nn.Linear(D, 1, bias=False)` with its weight set to 1.0,
/// whose forward returns the sum of its outputs as the loss.
pub struct Linear {
    params: Vec<(String, Tensor)>,
}

impl Linear {
    pub fn new(features: usize, kind: Kind, device: Device) -> Self {
        let weight = Tensor::ones([1, features as i64], (kind, device)).set_requires_grad(true);
        Linear { params: vec![("linear.weight".to_string(), weight)] }
    }
}

impl Model for Linear {
    fn parameters(&self) -> &[(String, Tensor)] {
        &self.params
    }

    fn loss(&self, batch: &Batch) -> Tensor {
        // F.linear then .sum(): the same ATen calls nn.Linear and the article make.
        batch.x.linear(&self.params[0].1, None::<Tensor>).sum(None)
    }
}
