//! Low precision's rounding measured on the run itself, not assumed from an epsilon. DDP's
//! ranks backpropagate each micro-batch's loss divided by K/W where one process divides by
//! K; in a narrow dtype (bfloat16 autocast, float16, a bfloat16 model or an engine's
//! compute dtype) every op of the backward then rounds at another scale unless W is a power
//! of two, and nothing on paper bounds a whole backward rounding anew. So the one-process
//! leg runs once more as the precision control (`DIVISOR_ENV`): each backward seeded with W
//! and each parameter's gradient divided by W as it arrives, exactly the rounding DDP's ranks
//! do. Each step's and the final weights' tensors may then differ by `MARGIN` times the
//! control's distance from accumulation (the largest |Δ| of the tensor), on top of the fixed
//! tolerance of the gradients' own dtype (the reduction's order): docs/mixed-precision.md.

use crate::evidence::{Params, Trace, Values};
use crate::spec::{Dtype, Tolerance};

/// How far DDP may part from accumulation, per tensor, as a multiple of the control's
/// largest |Δ| there. DDP's rounding and the control's are draws of the same process (the
/// same ops at the same scale), and the largest of many elements' differences varies little
/// between two draws; measured on honest runs (docs/mixed-precision.md), DDP used at most
/// about a quarter of it.
pub const MARGIN: f64 = 4.0;

/// A control whose gradients are not those of accumulation to within this ratio of norms
/// did not replay it (its division was not applied where the gradients were made: an
/// engine's own parameters): it proves nothing.
const REPLAYED: f64 = 0.25;

/// Whether a trace ran some stage narrower than float32: autocast, its own dtype, an
/// engine's compute dtype, or float16 under a loss scaler.
pub fn narrow(t: &Trace) -> Option<Dtype> {
    let h = &t.header;
    let narrow = |d: &Dtype| matches!(d, Dtype::Bfloat16 | Dtype::Float16);
    [h.autocast, h.dtype, h.compute_dtype].into_iter().flatten().find(narrow)
}

/// Both legs reach their precision the same way (autocast, an engine's compute dtype and the
/// weights' dtype alike): then the same inputs at the same weights give the same forward,
/// and the control's rounding is DDP's. FSDP2's MixedPrecisionPolicy against one process's
/// autocast is not: each rounds other ops.
pub fn same_precision(a: &Trace, b: &Trace) -> bool {
    let (x, y) = (&a.header, &b.header);
    x.autocast == y.autocast && x.compute_dtype == y.compute_dtype && x.dtype == y.dtype
}

/// The divisor the precision control replays (DDP's world size: the ratio of the one
/// process's loss divisor K to a rank's K/W), where a leg ran narrow and that ratio is no
/// power of two (then every op rounds alike in both, and the fixed tolerance holds), and both
/// legs reach it the same way (else the control measures one leg's rounding alone, and the
/// fixed rule of the coarsest dtype holds).
pub fn wanted(acc: &Trace, ddp: &Trace) -> Option<f64> {
    narrow(acc).or_else(|| narrow(ddp)).filter(|_| same_precision(acc, ddp))?;
    let w = ddp.header.world_size.unwrap_or(1);
    (w > 1 && !w.is_power_of_two()).then_some(w as f64)
}

/// What the control set, for the report: the divisor it replayed and the dtype.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PrecisionHeld {
    pub divisor: f64,
    pub dtype: Dtype,
    pub margin: f64,
}

/// Each step's and the final weights' allowances from the control `ctl` (set as `acc`'s
/// allowances, the larger of them and any already there, elementwise), or why the control
/// cannot set them. `tol`: the fixed tolerance of the gradients' dtype; `regrouped`: per
/// step, the micro-batches a regrouped step was cut into (1: not).
pub fn hold(acc: &mut Trace, ctl: &Trace, tol: &Tolerance, regrouped: &[u32]) -> Result<PrecisionHeld, String> {
    let divisor = ctl.header.divisor_control.ok_or("the control trace was not recorded as one (no divisor_control)")?;
    if ctl.steps.len() != acc.steps.len() {
        return Err(format!("the control made {} steps where accumulation made {}", ctl.steps.len(), acc.steps.len()));
    }
    let none = Params::new();
    let mut steps = Vec::with_capacity(acc.steps.len());
    for (s, (a, c)) in acc.steps.iter().zip(&ctl.steps).enumerate() {
        let k = regrouped.get(s).copied().unwrap_or(1);
        let magnitudes = acc.scales.get(s).unwrap_or(&none);
        steps.push(allowances(a, c, &tol.times(k), magnitudes, s == 0)?);
    }
    let k = regrouped.iter().copied().max().unwrap_or(1);
    let finals = allowances(&acc.finals, &ctl.finals, &tol.times(k), &acc.peaks, false)?;
    let old = std::mem::take(&mut acc.allowances.steps);
    acc.allowances.steps = steps.into_iter().enumerate().map(|(s, p)| larger(p, old.get(s))).collect();
    let old = std::mem::take(&mut acc.allowances.finals);
    acc.allowances.finals = larger(finals, Some(&old));
    let dtype = narrow(acc).or_else(|| narrow(ctl)).unwrap_or(Dtype::Float32);
    Ok(PrecisionHeld { divisor, dtype, margin: MARGIN })
}

/// Per tensor of `a`: the fixed tolerance at the tensor's peak (its values and recorded
/// magnitudes) plus MARGIN times the control's largest |Δ|, the same for every element.
/// `first`: step 0, where the control starts from the same weights, so its gradients must be
/// accumulation's within a factor (else it did not replay).
fn allowances(a: &Params, c: &Params, tol: &Tolerance, magnitudes: &Params, first: bool) -> Result<Params, String> {
    let mut out = Params::new();
    for (name, x) in a {
        let Some((_, y)) = c.iter().find(|(n, t)| n == name && t.shape() == x.shape()) else {
            return Err(format!("the control has no {name} of that shape"));
        };
        let (xs, ys) = (x.to_f64(), y.to_f64());
        let norm = |v: &[f64]| v.iter().map(|e| e * e).sum::<f64>().sqrt();
        let (nx, ny) = (norm(&xs), norm(&ys));
        if first && nx > 0.0 && ((ny / nx).ln().abs() > (1.0 + REPLAYED).ln() || !ny.is_finite()) {
            return Err(format!(
                "its gradient of {name} is {:.3}x accumulation's at step 0: it did not replay",
                ny / nx
            ));
        }
        let d = xs.iter().zip(&ys).map(|(p, q)| (p - q).abs()).filter(|v| v.is_finite()).fold(0.0, f64::max);
        let given = magnitudes.iter().find(|(n, _)| n == name).map_or(0.0, |(_, m)| m.abs_max());
        let peak = x.abs_max().max(given);
        let eps = x.dtype().unwrap_or(Dtype::Float32).epsilon();
        let floor = tol.allowance(peak, eps * peak);
        out.push((name.clone(), Values::f64s_shaped(x.shape(), vec![floor + MARGIN * d; x.numel()])));
    }
    Ok(out)
}

/// `p`, each element at least `old`'s where `old` holds a tensor of that name and shape.
fn larger(p: Params, old: Option<&Params>) -> Params {
    let Some(old) = old.filter(|o| !o.is_empty()) else { return p };
    p.into_iter()
        .map(|(name, t)| match old.iter().find(|(n, o)| *n == name && o.shape() == t.shape()) {
            Some((_, o)) => {
                let v = t.to_f64().into_iter().zip(o.to_f64()).map(|(x, y)| x.max(y)).collect();
                (name, Values::f64s_shaped(t.shape(), v))
            }
            None => (name, t),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grads(v: Vec<f32>) -> Params {
        vec![("w".to_string(), Values::f32s(v))]
    }

    fn trace(steps: Vec<Vec<f32>>, finals: Vec<f32>) -> Trace {
        let mut t = Trace { steps: steps.into_iter().map(grads).collect(), finals: grads(finals), ..Trace::default() };
        t.header.world_size = Some(3);
        t
    }

    #[test]
    fn each_tensor_may_part_by_the_margin_times_the_controls_largest_difference() {
        let mut acc = trace(vec![vec![1.0, -2.0, 0.5]], vec![3.0, 4.0, 5.0]);
        let mut ctl = trace(vec![vec![1.0, -2.002, 0.5005]], vec![3.0, 4.01, 5.0]);
        ctl.header.divisor_control = Some(3.0);
        let tol = Tolerance { max_ulps: 0, rtol: 0.0, atol: 0.0 };
        let held = hold(&mut acc, &ctl, &tol, &[1]).unwrap();
        assert_eq!((held.divisor, held.margin), (3.0, MARGIN));
        let step = acc.allowances.steps[0][0].1.to_f64();
        assert!(step.iter().all(|&b| (b - MARGIN * 0.002).abs() < 1e-6), "{step:?}");
        let finals = acc.allowances.finals[0].1.to_f64();
        assert!(finals.iter().all(|&b| (b - MARGIN * 0.01).abs() < 1e-5), "{finals:?}");
    }

    #[test]
    fn a_control_that_did_not_divide_back_measures_nothing() {
        let mut acc = trace(vec![vec![1.0, 2.0]], vec![1.0, 1.0]);
        let mut ctl = trace(vec![vec![3.0, 6.0]], vec![1.0, 1.0]);
        ctl.header.divisor_control = Some(3.0);
        let why = hold(&mut acc, &ctl, &Tolerance::default(), &[]).unwrap_err();
        assert!(why.contains("did not replay"), "{why}");
        // Nor does a trace that is no precision control.
        ctl.header.divisor_control = None;
        assert!(hold(&mut acc, &ctl, &Tolerance::default(), &[]).is_err());
    }

    #[test]
    fn only_a_narrow_leg_at_a_ratio_no_power_of_two_asks_for_the_control() {
        let mut acc = trace(vec![], vec![]);
        let mut ddp = trace(vec![], vec![]);
        assert_eq!(wanted(&acc, &ddp), None);
        acc.header.autocast = Some(Dtype::Bfloat16);
        // Legs that reach their precision otherwise: the control would measure one alone.
        assert_eq!(wanted(&acc, &ddp), None);
        ddp.header.autocast = Some(Dtype::Bfloat16);
        assert_eq!(wanted(&acc, &ddp), Some(3.0));
        ddp.header.world_size = Some(4);
        assert_eq!(wanted(&acc, &ddp), None);
    }
}
