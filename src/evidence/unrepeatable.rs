//! What a machine whose kernels do not repeat themselves leaves behind (`train::repeat_check`
//! finds it): the report's reason for no verdict (exit 4).

use serde::Serialize;

/// Kernels that gave other bits for the same micro-batch.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Unrepeatable {
    /// What computed: "bfloat16", or "float32 under --amp bfloat16".
    pub dtype: String,
    /// The gradient that jumped the most, and by how much (inf where one was NaN; JSON
    /// writes that as null).
    pub tensor: String,
    pub jump: f64,
    /// How many of the model's gradients differed, of how many.
    pub differing: usize,
    pub gradients: usize,
    /// Where: the CPU, GPU and kernels (`Platform::describe`).
    pub platform: String,
    /// What avoids it.
    pub fix: String,
}

impl Unrepeatable {
    /// The report's one line.
    pub fn line(&self) -> String {
        format!(
            "NO VERDICT: this machine's kernels are not deterministic for {}: the same micro-batch computed twice \
             gave {}'s gradient a jump of {:.3e} ({} of {} gradients differ) on {}; {}",
            self.dtype, self.tensor, self.jump, self.differing, self.gradients, self.platform, self.fix
        )
    }
}
