//! The legs a judgement compares: accumulation against DDP, and one big batch where there is
//! one. Our own runs hand theirs over as they finish; traces recorded elsewhere are loaded
//! here and lined up first: DDP's `module.` prefix dropped, sampled alike, and refused
//! (exit 2, one line naming the first mismatch) where they do not hold the same tensors.

use std::path::{Path, PathBuf};

use super::trace::{Params, Trace};
use super::values::Elem;
use crate::error::{Error, Result};

/// The runs judged against each other: accumulation (a user's first trace), DDP (the
/// second), and the big batch where there is one.
pub struct Legs {
    pub accumulation: Trace,
    pub ddp: Trace,
    pub big: Option<BigLeg>,
    /// Which of accumulation and DDP was recorded sampled (lining up samples a whole trace at
    /// the other's positions); our own runs are never sampled.
    pub sampled: [bool; 2],
    /// The control run: the accumulation leg again, its gradients nudged
    /// (`judge::control`), where one ran or was given.
    pub control: Option<Trace>,
    /// The precision control: the accumulation leg again with DDP's loss divisor
    /// (`judge::precision`), where one ran or was given.
    pub precision: Option<Trace>,
    /// The DDP leg's own precision control, where the legs reach their precision otherwise.
    pub precision_ddp: Option<Trace>,
}

/// One big batch of each step's samples, with the accumulation leg as it is held against it.
pub struct BigLeg {
    /// Accumulation's trace as it lines up with the big batch: a user's sampled at the big
    /// batch's positions where only that was sampled; ours with the big batch's allowances.
    pub accumulation: Trace,
    pub trace: Trace,
}

impl Legs {
    /// Two traces recorded elsewhere, and a big batch's where given: loaded, named alike,
    /// sampled alike and lined up; else the first mismatch, exit 2.
    pub fn load(
        paths: &[PathBuf; 2],
        big: Option<&Path>,
        control: Option<&Path>,
        precision: [Option<&Path>; 2],
    ) -> Result<Legs> {
        let [pa, pb] = paths;
        let (mut a, mut b) = (Trace::load(pa)?, Trace::load(pb)?);
        strip_ddp_prefix(&mut a, &b);
        strip_ddp_prefix(&mut b, &a);
        let sampled = [a.sampling.is_some(), b.sampling.is_some()];
        same_sampling(&mut a, &mut b, pa, pb)?;
        line_up(&a, &b, pa, pb)?;
        let big = match big {
            Some(path) => Some(big_leg(&a, path, pa)?),
            None => None,
        };
        let control = match control {
            Some(path) => Some(big_leg(&a, path, pa)?.trace),
            None => None,
        };
        let [precision, precision_ddp] = precision;
        let precision = match precision {
            Some(path) => Some(big_leg(&a, path, pa)?.trace),
            None => None,
        };
        let precision_ddp = match precision_ddp {
            Some(path) => Some(big_leg(&b, path, pb)?.trace),
            None => None,
        };
        Ok(Legs { accumulation: a, ddp: b, big, sampled, control, precision, precision_ddp })
    }
}

/// The big-batch trace at `path`, lined up with the accumulation trace `a` (from `pa`).
fn big_leg(a: &Trace, path: &Path, pa: &Path) -> Result<BigLeg> {
    let mut big = Trace::load(path)?;
    strip_ddp_prefix(&mut big, a);
    let mut acc = a.without_steps();
    acc.steps = a.steps.clone();
    acc.scales = a.scales.clone();
    same_sampling(&mut acc, &mut big, pa, path)?;
    line_up(&acc, &big, pa, path)?;
    Ok(BigLeg { accumulation: acc, trace: big })
}

/// Both traces sampled at the same positions: a whole trace is sampled at the other's (so a
/// sampled leg compares with a whole one); two sampled at other positions are refused.
fn same_sampling(a: &mut Trace, b: &mut Trace, pa: &Path, pb: &Path) -> Result<()> {
    match (&a.sampling, &b.sampling) {
        (None, None) => {}
        (Some(x), Some(y)) => {
            if let Some(p) = x.mismatch(y) {
                return Err(not_lined_up(pa, pb, p));
            }
        }
        (Some(s), None) => *b = std::mem::take(b).sampled_like(s).map_err(|p| not_lined_up(pa, pb, p))?,
        (None, Some(s)) => *a = std::mem::take(a).sampled_like(s).map_err(|p| not_lined_up(pa, pb, p))?,
    }
    Ok(())
}

/// `pb` does not line up with `pa` (exit 2).
fn not_lined_up(pa: &Path, pb: &Path, problem: String) -> Error {
    Error::bad_file(
        pb,
        format!("does not line up with {}: {problem}", pa.display()),
        "record both runs of the same model with the same sample= (ddp-verify -- COMMAND: --sample)",
    )
}

/// A DDP module's parameters are named `module.<name>` when recorded from the wrapper: where
/// every name of `t` has that prefix and none of `other`'s, drop it.
fn strip_ddp_prefix(t: &mut Trace, other: &Trace) {
    const P: &str = "module.";
    let all = |t: &Trace| t.finals.iter().all(|(n, _)| n.starts_with(P));
    let none = |t: &Trace| !t.finals.iter().any(|(n, _)| n.starts_with(P));
    if !(all(t) && none(other)) {
        return;
    }
    let strip = |p: &mut Params| p.iter_mut().for_each(|(n, _)| *n = n[P.len()..].to_string());
    if let Some(s) = t.sampling.as_mut() {
        s.rename(|n| n.strip_prefix(P).unwrap_or(n).to_string());
    }
    t.steps.iter_mut().chain(t.scales.iter_mut()).for_each(strip);
    [&mut t.finals, &mut t.peaks].into_iter().for_each(strip);
    t.buffers.iter_mut().filter(|(n, _)| n.starts_with(P)).for_each(|(n, _)| *n = n[P.len()..].to_string());
}

/// Same steps, parameter names, shapes and dtypes; else the first mismatch, exit 2.
fn line_up(a: &Trace, b: &Trace, pa: &Path, pb: &Path) -> Result<()> {
    let refuse = |problem: String| {
        Err(Error::bad_file(
            pb,
            format!("does not line up with {}: {problem}", pa.display()),
            "record both runs of the same model (the same parameters, shapes and dtype)",
        ))
    };
    // Different numbers of optimizer steps are judged (NOT EQUIVALENT, with their cause),
    // not refused: the steps both made must hold the same tensors.
    // A step with no gradient at all (an engine that reduced none) is judged too.
    let steps = a.steps.iter().zip(&b.steps).enumerate().filter(|(_, (x, y))| !x.is_empty() && !y.is_empty());
    let groups = steps.map(|(s, (x, y))| (format!("step {s}"), x, y));
    let groups = groups.chain([("the final weights".to_string(), &a.finals, &b.finals)]).chain([(
        "the buffers".to_string(),
        &a.buffers,
        &b.buffers,
    )]);
    for (what, x, y) in groups {
        for (name, t) in x {
            let Some((_, u)) = y.iter().find(|(n, _)| n == name) else {
                return refuse(format!("{name} is in {what} there but not here"));
            };
            if t.size() != u.size() {
                return refuse(format!("{what}: {name} has shape {:?} there, {:?} here", t.size(), u.size()));
            }
            // Float tensors of runs recorded at other dtypes are judged, their precision apart a fact.
            let floats = |e: Elem| matches!(e, Elem::F32 | Elem::F64 | Elem::Bf16 | Elem::F16);
            let other_dtype = a.header.dtype.is_some() && a.header.dtype != b.header.dtype;
            if t.elem() != u.elem() && !(other_dtype && floats(t.elem()) && floats(u.elem())) {
                return refuse(format!("{what}: {name} is {} there, {} here", t.elem().name(), u.elem().name()));
            }
        }
        if let Some((name, _)) = y.iter().find(|(n, _)| !x.iter().any(|(m, _)| m == n)) {
            return refuse(format!("{name} is in {what} here but not there"));
        }
    }
    Ok(())
}
