/// Which program starts the user's script, as `lower` read it from the command after `--`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LauncherKind {
    /// `python train.py ARGS`: the DDP leg runs it under `python -m torch.distributed.run`.
    Python,
    /// `torchrun [OPTIONS] train.py ARGS` (or `python -m torch.distributed.run ...`).
    Torchrun,
    /// `accelerate launch [OPTIONS] train.py ARGS`.
    Accelerate,
}

/// The command after `--`, split where each leg changes it: the launcher's own options are
/// kept, its process count is set per leg.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launcher {
    pub kind: LauncherKind,
    /// The words that start the launcher (`torchrun`, `accelerate launch`, `python`).
    pub head: Vec<String>,
    /// The launcher's options, between the head and the script.
    pub options: Vec<String>,
    /// The script (or `-m module`) and its arguments, placeholders not yet filled in.
    pub script: Vec<String>,
    /// The Python that runs the script, which must import the recorder.
    pub python: String,
    /// Machines the DDP leg spans (torchrun's `--nnodes`; 1 elsewhere).
    pub nodes: usize,
    /// This machine's node as the command says (torchrun's `--node-rank`), if it does.
    pub node_rank: Option<usize>,
}
