//! Users' traces under AdamW (and Adam without weight decay, the same steps): what the
//! optimizer makes of each step's allowance, carried to the final weights as our own runs
//! carry theirs (`train::AdamWTrack`).
//!
//! Adam divides by √v, so where a true gradient is zero (a softmax's key bias: a constant
//! added to every score changes nothing) the recorded values are rounding noise of opposite
//! signs in the two runs, and each step moves the weight by up to lr whatever the noise's
//! size. The fixed tolerance on final weights cannot know that; the carried bound does. Each
//! step's gradient allowance is the fixed tolerance's (at the magnitudes the gradients are
//! measured at), the moments are rebuilt in float64 from the accumulation trace's gradients,
//! and |weight| is bounded by the recorded peaks.

use crate::bounds::{AdamWParams, AdamWTrack};
use crate::evidence::{OptimizerKind, Params, Trace, Values};
use crate::spec::{Dtype, Tolerance};

/// AdamW's settings as both headers give them, or why the bound cannot be carried.
fn settings(a: &Trace, b: &Trace, dtype: Dtype) -> Result<AdamWParams, String> {
    let (x, y) = (&a.header.optimizer, &b.header.optimizer);
    let kind = match (&x.kind, &y.kind) {
        (Some(k), Some(l)) if k == l => k,
        (Some(k), Some(l)) => return Err(format!("the traces' optimizer differ ({} vs {})", k.name(), l.name())),
        _ => return Err("a trace does not record optimizer".into()),
    };
    // Both traces must say the same of a setting the bound uses.
    fn same<T: PartialEq + std::fmt::Debug + Clone>(key: &str, x: &Option<T>, y: &Option<T>) -> Result<T, String> {
        match (x, y) {
            (Some(x), Some(y)) if x == y => Ok(x.clone()),
            (Some(x), Some(y)) => Err(format!("the traces' {key} differ ({x:?} vs {y:?})")),
            _ => Err(format!("a trace does not record {key}")),
        }
    }
    let weight_decay = same("weight_decay", &x.weight_decay, &y.weight_decay);
    if !x.carries_adamw_bound() {
        let with = if *kind == OptimizerKind::Adam { " with weight decay" } else { "" };
        return Err(format!("the optimizer is {}{with}", kind.name()));
    }
    if same("amsgrad", &x.amsgrad, &y.amsgrad) == Ok(true) {
        return Err(format!("{} runs with amsgrad", kind.name()));
    }
    let betas = same("betas", &x.betas, &y.betas)?;
    let [b1, b2] = betas[..] else { return Err("betas are not two numbers".into()) };
    if a.facts.lrs.len() != a.steps.len() || b.facts.lrs.len() != b.steps.len() {
        return Err("a trace does not record each step's learning rate".into());
    }
    Ok(AdamWParams {
        betas: (b1, b2),
        eps: same("eps", &x.eps, &y.eps)?,
        weight_decay: weight_decay?,
        u: dtype.unit_roundoff(),
        lockstep: false,
    })
}

/// The learning rates a parameter may have stepped at in step `s` (low, high): the step's
/// param groups' (a trace records each group's rate, not which group holds a parameter),
/// else the one recorded.
fn step_lrs(t: &Trace, s: usize) -> (f64, f64) {
    let lr = t.facts.lrs[s];
    let groups = t.facts.groups.get(s).into_iter().flatten().filter_map(|g| g.lr);
    groups.fold((lr, lr), |(lo, hi), x| (lo.min(x), hi.max(x)))
}

/// What the fixed tolerance allows each element, measured at `at` (an ulp of x is at most
/// ε·|x|).
fn tolerance_allowance(tol: &Tolerance, at: &[f64], eps: f64) -> Vec<f64> {
    at.iter().map(|&x| tol.allowance(x, x * eps)).collect()
}

/// `at` raised to |m| per element (or to |m| everywhere where `m` is one number: the
/// recorder's per-tensor magnitudes).
fn raise(at: &mut [f64], m: &Values) {
    match m.numel() {
        1 => {
            let m = m.get(0).abs();
            at.iter_mut().for_each(|x| *x = x.max(m));
        }
        n if n == at.len() => at.iter_mut().enumerate().for_each(|(k, x)| *x = x.max(m.get(k).abs())),
        _ => {}
    }
}

fn abs(v: &Values) -> Vec<f64> {
    v.to_f64().into_iter().map(f64::abs).collect()
}

/// Per final weight and element, what AdamW makes of the steps' fixed-tolerance allowances,
/// or why nothing can be carried (another optimizer, missing settings or learning rates).
///
/// Where nothing is carried, [`finals_judged`] says whether the fixed tolerance may judge
/// the final weights at all.
pub fn adamw_finals(a: &Trace, b: &Trace, tol: &Tolerance, dtype: Dtype) -> Result<Params, String> {
    let p = settings(a, b, dtype)?;
    let eps = dtype.epsilon();
    let names: Vec<String> = a.finals.iter().map(|(n, _)| n.clone()).collect();
    let mut track = AdamWTrack::new(names.len());
    // Per parameter: AdamW's first and second moments and its step count, in float64.
    type Moments = Option<(Vec<f64>, Vec<f64>, u32)>;
    let mut moments: Vec<Moments> = names.iter().map(|_| None).collect();
    // Each weight's peak in either run, per element.
    let peak = |n: &str| {
        let f = |t: &Trace| t.peaks.iter().find(|(m, _)| m == n).map(|(_, t)| t.clone());
        match (f(a), f(b)) {
            (Some(x), Some(y)) => {
                let mut at = x.to_f64();
                raise(&mut at, &y);
                Some(at)
            }
            (x, y) => x.or(y).map(|t| t.to_f64()),
        }
    };
    let (b1, b2) = p.betas;
    for (s, grads) in a.steps.iter().enumerate() {
        let other = b.steps.get(s);
        for (i, n) in names.iter().enumerate() {
            let Some((_, g)) = grads.iter().find(|(m, _)| m == n) else { continue };
            // Measured where the gradient comparison measures: the tensor's peak in either
            // run, and the recorded micro-batch magnitudes where larger.
            let mut peak_abs = g.abs_max();
            if let Some((_, h)) = other.and_then(|o| o.iter().find(|(m, _)| m == n)) {
                peak_abs = peak_abs.max(h.abs_max());
            }
            let g = g.to_f64();
            if g.len() != a.finals[i].1.numel() {
                return Err(format!("{n}'s gradient at step {s} and its final weight differ in size"));
            }
            let mut at: Vec<f64> = g.iter().map(|x| x.abs().max(peak_abs)).collect();
            for t in [a, b] {
                if let Some((_, m)) = t.scales.get(s).and_then(|sc| sc.iter().find(|(m, _)| m == n)) {
                    raise(&mut at, m);
                }
            }
            let allow = tolerance_allowance(tol, &at, eps);
            track.before_step(i, allow, g.iter().map(|x| x.abs()).collect());
            let (m, v, t) = match moments[i].take() {
                Some((m, v, t)) => (
                    m.iter().zip(&g).map(|(m, g)| m * b1 + g * (1.0 - b1)).collect::<Vec<f64>>(),
                    v.iter().zip(&g).map(|(v, g)| v * b2 + g * g * (1.0 - b2)).collect::<Vec<f64>>(),
                    t + 1,
                ),
                None => (g.iter().map(|g| g * (1.0 - b1)).collect(), g.iter().map(|g| g * g * (1.0 - b2)).collect(), 1),
            };
            let w = peak(n).filter(|p| p.len() == g.len()).unwrap_or_else(|| abs(&a.finals[i].1));
            track.after_step_within(i, &p, t, step_lrs(a, s), &m, &v, &w);
            moments[i] = Some((m, v, t));
        }
    }
    let shapes: Vec<Vec<usize>> = a.finals.iter().map(|(_, w)| w.shape().to_vec()).collect();
    let carried = track.finals(&names, &shapes, 1.0, 0.0);
    // Never stricter than the fixed tolerance at the weights' peaks: the carried bound adds
    // what AdamW amplifies, it does not replace what rounding alone explains.
    Ok(names
        .iter()
        .zip(&a.finals)
        .filter_map(|(n, (_, w))| {
            let (_, c) = carried.iter().find(|(m, _)| m == n)?;
            let mut at = peak(n).unwrap_or_else(|| abs(w));
            raise(&mut at, w);
            let fixed = tolerance_allowance(tol, &at, eps);
            let both = c.to_f64().iter().zip(&fixed).map(|(c, f)| c.max(*f)).collect();
            Some((n.clone(), Values::f64s_shaped(w.shape(), both)))
        })
        .collect())
}

/// Whether final weights without a carried bound can be held to the fixed tolerance: under
/// SGD (linear in the gradients, so rounding is not amplified) or where the traces do not
/// say which optimizer ran. Any other optimizer (RMSprop, Adagrad, Adam with weight decay,
/// NAdam, Lion, one of the user's) may divide by a running magnitude, which turns a zero
/// gradient's rounding noise into full steps: its final weights are not judged, the
/// gradients are.
pub fn finals_judged(a: &Trace, b: &Trace) -> bool {
    [a, b].iter().all(|t| t.header.optimizer.is_sgd_or_unknown())
}
