//! Words for the recorded facts of the loss and the update (learning rates, the loss scaler,
//! clips, dropout, the optimizer's step), and for what rounding and the comparison explain.

use super::step;
use crate::judge::diagnose::parting::{ControlPath, Numbers, Parting, Side, Told};
use crate::judge::diagnose::source::Words;
use crate::judge::{LrMismatch, ScalerEvent};

pub fn advice(p: &Parting, w: &Words) -> Option<String> {
    let (l, r) = (w.left, w.right);
    let s = step(p);
    let words = match &p.numbers {
        Numbers::LrSchedule { left, right, pace } => match pace {
            Some(pace) => {
                let (fast, slow) = if pace.ddp_ahead { (r, l) } else { (l, r) };
                let ahead = format!(
                    "{fast}'s learning-rate schedule is {:.0}x as far along as {slow}'s at step {s}, from the same \
                     start",
                    pace.by
                );
                match pace.per_rank_length {
                    true => format!(
                        "{ahead}: its length was counted from one rank's share of the data (a rank's loader holds \
                         1/W of the samples, so len(loader) // K gives W times fewer steps), or its scheduler ticks \
                         once per process; count the schedule's steps from the whole data set and tick once per \
                         optimizer step"
                    ),
                    false => format!(
                        "{ahead}: it ticks once per micro-batch (K times a step in one process, K/W on each rank), or \
                         its length counts micro-batches; tick once per optimizer step (scheduler.step() after \
                         optimizer.step())"
                    ),
                }
            }
            None => format!(
                "{l} applied lr {} at step {s} where {r} applied {}: their schedules ticked a different number of \
                 times by then; tick once per optimizer step in both (scheduler.step() after optimizer.step()), not \
                 once per micro-batch (K times faster) nor once per process (a scheduler prepared by Accelerate \
                 steps W times per step under DDP)",
                LrMismatch::shown(*left),
                LrMismatch::shown(*right)
            ),
        },
        Numbers::LossScaler(m) => {
            let why = match m.what {
                ScalerEvent::Unscales => {
                    "unscale once per optimizer step, after the last micro-batch's backward (and DDP's all-reduce): \
                     unscaling inside the accumulation loop divides earlier micro-batches' share by the scale again"
                }
                ScalerEvent::Updates | ScalerEvent::LossScale => {
                    "scaler.update() belongs once per optimizer step, after scaler.step(): updating after every \
                     micro-batch grows the scale K times as often, and a scale changed inside a window scales its \
                     micro-batches differently than the one unscale divides by"
                }
                ScalerEvent::Skipped => {
                    "every run must see the same overflow: one rank's inf/NaN reaches every rank through the \
                     all-reduce, and accumulation sums the same micro-batches; a run that checks other gradients \
                     (before the all-reduce, or per rank) skips alone"
                }
            };
            format!("{}: {why}", m.describe(l, r))
        }
        Numbers::NonFinite(problem) => format!(
            "{problem}: training blew up (learning rate too high, or bad data); nothing can be proven from NaN or Inf"
        ),
        Numbers::ClipCount { left, right } => format!(
            "{l} clipped its gradients {left} times in step {s} and {r} {right} times: clip once per step, on the \
             accumulated and synchronised gradient right before optimizer.step(), not after every micro-batch's \
             backward (which clips partial sums)"
        ),
        Numbers::ClippedBeforeReduction { norm, max } => format!(
            "{r} clipped its gradients to max_norm {max} at step {s}, yet the gradient it applied has norm {norm:.6}: \
             the clipped gradient changed before the step. Each rank clipped its own local gradient by its own norm \
             before the gradients were averaged (a hand-written all_reduce after clip_grad_norm_), so the average is \
             not the clipped average the one process applies; clip once per step, after the all-reduce, right \
             before optimizer.step()"
        ),
        Numbers::DropoutKeys => format!(
            "{l} and {r} drew step {s}'s dropout masks from different keys: masks must follow the samples (seed, \
             epoch, sample index, layer), not each rank's own counter or stream, or ranks repeat one another's masks"
        ),
        Numbers::DropoutOn { layers } => format!(
            "step {s} differs by more than rounding, and {}'s model trains with dropout on ({layers}): each run \
             draws its own masks (DDP's ranks from their own random streams, the one process from one stream), so \
             the runs apply different gradients whatever else is right, and no recorded fact besides the masks \
             parts them; run the check again with --no-dropout (every dropout the identity in both runs) to see \
             the rest, or draw each sample's mask from a generator seeded by the sample's index, which a rank and \
             the one process then share",
            w.label(p.leg.unwrap_or(Side::Right))
        ),
        Numbers::Buffers => "every gradient and final weight agrees but the buffers (BatchNorm's running \
                             statistics) differ: DDP keeps rank 0's (broadcast_buffers), so compare runs of one kind, \
                             or leave buffers out (no --strict-buffers)"
            .into(),
        Numbers::OptimizerStep { carried: false, amplifies: true } => {
            "every step's gradients agree within tolerance but the final weights do not: the optimizer made \
             different steps of the same gradients, or amplified their rounding (Adam and AdamW divide by √v, so a \
             parameter whose true gradient is zero, such as an attention key bias, moves a full step on rounding \
             noise); record with ddp_verify_trace.record() or TraceRecorder(optimizer=...) so the bound is carried \
             through the optimizer"
                .into()
        }
        Numbers::OptimizerStep { carried, .. } => {
            let held = match carried {
                true => "beyond what the optimizer makes of that agreement",
                false => "under SGD, which does not amplify rounding (it is linear in the gradients)",
            };
            format!(
                "every step's gradients agree but the final weights differ {held}: something besides the \
                 optimizer's steps changed the weights (an EMA or averaged copy loaded into the model at the end, a \
                 weight set by hand after training), or the runs' optimizers differ (their state, or a step applied \
                 to other parameters)"
            )
        }
        Numbers::Setting { optimizer, group, setting, left, right, steady } => {
            let whose = match optimizer {
                0 => format!("param group {group}"),
                k => format!("optimizer {k}'s param group {group}"),
            };
            let at = p.step.map_or("".into(), |s| format!(" at step {s}"));
            let why: String = match (*setting, steady) {
                (_, Some(ratio)) => format!(
                    "{r}'s is {ratio:.4}x {l}'s at every step, so it is a base value computed from what differs \
                     between one process and W ranks (the micro-batches or samples per process, the rank, the \
                     world size), not a schedule's pace; give both runs the same"
                ),
                ("lr", None) => "its learning rate was scheduled otherwise (a scheduler of that group stepped per \
                                 micro-batch or per process, or its length counted from one rank's share); tick \
                                 every group's schedule once per optimizer step"
                    .into(),
                ("params", None) => {
                    "the group holds other parameters in each run (a layer frozen or added on one side only)".into()
                }
                (_, None) => "a setting computed from what differs between one process and W ranks (the per-process \
                              batch, the rank, the micro-batches per process) or set on some ranks only; give every \
                              run the same optimizer settings"
                    .into(),
            };
            format!("{whose} was told {setting} = {} in {l} and {} in {r}{at}: {why}", told(left), told(right))
        }
        Numbers::GroupsDiffer { left, right } => format!(
            "{l}'s optimizers hold {left} param group(s) and {r}'s {right} at step {s}: the runs do not update the \
             same parameters the same way; build the same optimizers and groups in every run"
        ),
        Numbers::Unexplained { tensors, control, finals_exact: true } if p.step.is_some() => {
            let most: Vec<String> = tensors.iter().map(|(n, f)| format!("{n} ({f:.1}x the allowance)")).collect();
            format!(
                "{l} and {r}'s recorded gradients part from step {} ({}), yet every final weight agrees bit for \
                 bit: the recording moment is in doubt before the training is: those gradients were likely read \
                 at another moment than the update used them (a reduction by hand, or another optimizer's step, \
                 between the recorded optimizer's step and theirs); look at where the script changes them after \
                 backward",
                p.step.unwrap_or(0),
                most.join(", ")
            )
        }
        Numbers::Unexplained { tensors, control, .. } => {
            let at = match p.step {
                Some(s) => format!("from step {s}"),
                None => "in the final weights, though every step's gradients agree,".into(),
            };
            let most: Vec<String> = tensors.iter().map(|(n, f)| format!("{n} ({f:.1}x the allowance)")).collect();
            let most = match most.is_empty() {
                true => String::new(),
                false => format!(" (most: {})", most.join(", ")),
            };
            let proof = match control {
                Some(ControlPath::Left { ddp, control, margin }) => format!(
                    "; a control run (accumulation again, its gradients nudged by rounding's size) parted by {control:.1e} \
                     there and {r} by {ddp:.1e}, more than {margin:.0}x the control: not rounding"
                ),
                Some(ControlPath::NotAControl(why)) => format!("; no control could tell rounding from a bug: {why}"),
                Some(ControlPath::Precision(why)) => format!(
                    "; not proven to be rounding: a leg ran narrower than float32, and no precision control measured \
                     its rounding ({why}), so the runs were held to float32's tolerance"
                ),
                None => String::new(),
                Some(ControlPath::None) => "; not proven to be rounding: no control run measured how far this \
                     model amplifies it (ddp-verify -- COMMAND runs one; compare takes it as --control)"
                    .into(),
            };
            format!(
                "{l} and {r} part beyond rounding {at}{most}, and no recorded fact explains it: look for what the \
                 script does per process, per rank or per micro-batch to those tensors (an update, a normaliser, \
                 a copy of the weights){proof}"
            )
        }
        Numbers::Chaos { growth } => {
            let fix = match w.ours {
                true => "rerun with --lockstep (the default) or --dtype float64 to prove equivalence",
                false => "record fewer steps, or train in float64, to prove equivalence",
            };
            format!(
                "step 0 agrees to rounding, then the difference grows step by step (max rel {}): a deep net \
                 amplifies rounding, so equivalent free-running runs part like this; {fix}",
                growth_words(growth)
            )
        }
        Numbers::ExplicitTolerance { ulps, allowed } => {
            let (which, fix) = match w.ours {
                true => ("explicit", "drop --max-ulps/--rtol/--atol to judge by the bound derived from it"),
                false => (
                    "fixed",
                    "record micro-batch magnitudes per element (record(magnitudes=\"element\"), \
                     DDP_VERIFY_MAGNITUDES=element) or pass a looser --max-ulps/--rtol",
                ),
            };
            format!(
                "step {s} differs by only {ulps} ulp, which floating-point rounding explains (e.g. the order W \
                 partial gradients are summed in); the {which} tolerance ({allowed} ulp) is tighter than the \
                 arithmetic allows: {fix}"
            )
        }
        Numbers::NotKept => {
            format!("step {s}'s gradients differ by more than rounding (rerun with --save-trace to inspect them)")
        }
        _ => return None,
    };
    Some(words)
}

/// A setting's value in words.
fn told(t: &Told) -> String {
    match t {
        Told::Number(Some(x)) => format!("{x}"),
        Told::Number(None) => "unset".into(),
        Told::Numbers(xs) => format!("{xs:?}"),
        Told::Flag(f) => f.to_string(),
        Told::Name(n) => n.clone(),
    }
}

/// Each step's largest relative difference, "1e-7 -> 3e-5 -> ...".
pub(super) fn growth_words(growth: &[f64]) -> String {
    growth.iter().map(|g| format!("{g:.0e}")).collect::<Vec<_>>().join(" -> ")
}
