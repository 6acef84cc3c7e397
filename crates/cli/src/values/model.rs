//! Which network both runs train, and what it implies for the rest of a configuration.

values! {
    /// Which network both runs train (`--model`).
    #[derive(Default)]
    pub enum ModelKind {
        /// the seed article's nn.Linear(D, 1, bias=False)
        #[default]
        Linear = "linear",
        /// torchvision's
        Resnet18 = "resnet18",
        /// widths 8-16-32-64, one block per stage
        ResnetTiny = "resnet-tiny",
        /// a 2-block causal transformer with token-level loss
        TinyLm = "tiny-lm",
    }
}

impl ModelKind {
    pub fn is_resnet(self) -> bool {
        matches!(self, ModelKind::Resnet18 | ModelKind::ResnetTiny)
    }

    /// A deep net, whose gradients depend on its weights: rounding carries from step to
    /// step, so both runs default to lockstep.
    pub fn is_deep(self) -> bool {
        self != ModelKind::Linear
    }

    /// The loss is normalised by the step's number of target tokens, not by K.
    pub fn token_loss(self) -> bool {
        self == ModelKind::TinyLm
    }

    /// Whether one batch of a step's samples computes the same mathematics as its
    /// micro-batches: not with BatchNorm, whose statistics depend on the batch.
    pub fn has_big_batch(self) -> bool {
        !self.is_resnet()
    }
}

values! {
    /// A window of fewer than K micro-batches at an epoch's end (`--partial-window`).
    #[derive(Default)]
    pub enum PartialWindow {
        /// its gradient is kept and steps with the next epoch's first window (the article's loop)
        #[default]
        Carry = "carry",
        /// it takes an optimizer step of its own at the epoch's end, its loss normalised by
        /// what it holds (transformers' Trainer and most LM trainers)
        Step = "step",
    }
}

impl PartialWindow {
    /// tiny-lm's loss needs a window's token count before its first backward, which a
    /// window carried into the next epoch cannot have: LM trainers step it instead.
    pub fn default_for(model: ModelKind) -> Self {
        if model.token_loss() {
            PartialWindow::Step
        } else {
            PartialWindow::Carry
        }
    }
}
