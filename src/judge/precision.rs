//! Low precision's rounding measured on the run itself, not assumed from an epsilon. DDP's
//! ranks backpropagate each micro-batch's loss divided by K/W where one process divides by
//! K; in a narrow dtype (bfloat16 autocast, float16, a bfloat16 model or an engine's
//! compute dtype) every op of the backward then rounds at another scale unless W is a power
//! of two, and nothing on paper bounds a whole backward rounding anew. So the one-process
//! leg runs once more as the precision control (`DIVISOR_ENV`): each backward seeded with W
//! and each parameter's gradient divided by W as it arrives, exactly the rounding DDP's ranks
//! do. Where the legs reach their precision otherwise (FSDP2's compute dtype against one
//! process's autocast: other ops round) or add the gradients up in the narrow dtype, a
//! divisor of 3 makes every narrow op round anew whatever W, and where the legs reach it
//! otherwise the DDP leg runs its own control too: each leg's rounding measured on itself.
//! Each step's and the final weights' tensors may then differ by `MARGIN` times the
//! controls' largest distance from their legs (the largest |Δ| of the tensor), on top of
//! float32's fixed tolerance (the reduction's order) and one rounding of gradients kept in
//! the narrow dtype: docs/mixed-precision.md. No fixed multiple of a narrow epsilon.

use crate::evidence::{Params, Trace, Values};
use crate::spec::{Dtype, Tolerance, ToleranceOverrides};

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

/// The precision control a pair of legs asks for (`Outcome::precision_wanted`).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Wanted {
    /// What each backward is seeded by and each gradient divided back by.
    pub divisor: f64,
    /// The legs reach their precision otherwise: the DDP leg runs its own control too.
    pub both: bool,
}

/// The control a pair of legs asks for, where a leg ran narrow and the legs may round
/// otherwise: at DDP's world size W (the ratio of the one process's loss divisor K to a
/// rank's K/W) where it is no power of two; else, where the legs reach their precision
/// otherwise or add the gradients up in the narrow dtype (a bfloat16 model, an engine's
/// compute dtype), at [`ANEW`]: a backward seeded by 3 rounds every narrow op anew, which
/// measures that rounding on this model at these magnitudes. None where every narrow op
/// rounds alike in both legs (autocast over float32 weights at a power-of-two W: scaling by
/// a power of two is exact), and the fixed tolerance of the float32 gradients holds.
pub fn wanted(acc: &Trace, ddp: &Trace) -> Option<Wanted> {
    narrow(acc).or_else(|| narrow(ddp))?;
    let both = !same_precision(acc, ddp);
    let w = ddp.header.world_size.unwrap_or(1);
    if w > 1 && !w.is_power_of_two() {
        return Some(Wanted { divisor: w as f64, both });
    }
    // Under a loss scaler the control replays DDP's range too: a rank's scaled values are W
    // times one process's, so it overflows first; at W's own divisor where every narrow op
    // rounds alike, just off it where they must round anew.
    let scaled = !acc.facts.scaler.scales.is_empty() || !ddp.facts.scaler.scales.is_empty();
    let skips_apart = acc.facts.scaler.found_inf != ddp.facts.scaler.found_inf;
    match (rounds_alike(acc, ddp), scaled) {
        (true, true) => (skips_apart && w > 1).then_some(Wanted { divisor: w as f64, both }),
        (true, false) => None,
        (false, true) if w > 1 => Some(Wanted { divisor: w as f64 * ANEW_SCALED, both }),
        (false, _) => Some(Wanted { divisor: ANEW, both }),
    }
}

/// The control's divisor where W is a power of two and the legs may still round otherwise:
/// the smallest that is none.
pub const ANEW: f64 = 3.0;

/// Under a loss scaler at a power-of-two W, the control's divisor over W: off a power of
/// two by enough that every float16 op rounds anew (2^-5, 64 of its ulps), near enough that
/// its scaled values overflow where DDP's do (float16's range is steps of 2).
pub const ANEW_SCALED: f64 = 1.0 + 1.0 / 32.0;

/// Where the control (DDP's divisor, DDP's scaled values) and accumulation skipped other
/// steps: float16's range parting the loss scalers, predicted by the run itself (a rank's
/// scaled values are W times one process's); from the first such step the runs free-run
/// apart (`RangePrediction::carries`).
pub fn range_parts(acc: &Trace, ctl: &Trace) -> Option<crate::evidence::RangePrediction> {
    let (a, c) = (&acc.facts.scaler.found_inf, &ctl.facts.scaler.found_inf);
    let steps: Vec<usize> = a.iter().zip(c).enumerate().filter(|(_, (x, y))| x != y).map(|(s, _)| s).collect();
    (!steps.is_empty()).then_some(crate::evidence::RangePrediction { steps, carries: true })
}

/// Both legs reach a narrow precision by autocast alone, over weights and gradients of a
/// wider dtype, and cut every step into micro-batches of the same inputs: at a power-of-two
/// divisor ratio every narrow op then rounds alike in both, and only the order of the
/// gradients' own additions differs. (The same samples grouped otherwise, a strided sampler
/// against one process's consecutive batches, sum other terms in each narrow op.)
fn rounds_alike(acc: &Trace, ddp: &Trace) -> bool {
    let wide = |h: &crate::evidence::TraceHeader| !is_narrow(h.dtype) && !is_narrow(h.compute_dtype);
    let (sa, sb) = (&acc.facts.stages, &ddp.facts.stages);
    let grouped = !sa.is_empty() && sa.len() == sb.len() && sa.iter().zip(sb).all(|(x, y)| x.same_grouping(y));
    same_precision(acc, ddp) && wide(&acc.header) && wide(&ddp.header) && grouped
}

fn is_narrow(d: Option<Dtype>) -> bool {
    d.is_some_and(|d| matches!(d, Dtype::Bfloat16 | Dtype::Float16))
}

/// The fixed tolerance users' legs are held to before any control (and where none measured
/// their rounding: none given, or one that did not replay): that of their gradients' dtype,
/// float32's for any narrower one too, so a narrow dtype's rounding is never assumed, only
/// measured; widened by what a narrow reduction the script asked for rounds (`reduced_in`).
pub fn unmeasured_tolerance(a: &Trace, b: &Trace, dtype: Dtype) -> Tolerance {
    let wide = if is_narrow(Some(dtype)) { Dtype::Float32 } else { dtype };
    reduced_in(Tolerance::for_run(wide, false), a, b)
}

/// `--max-ulps/--rtol/--atol` as given, the parts not given at the defaults of the coarsest
/// dtype the legs computed in (FSDP2's MixedPrecisionPolicy where coarser than the weights).
pub fn given_tolerance(a: &Trace, b: &Trace, dtype: Dtype, given: &ToleranceOverrides) -> Tolerance {
    let computed = [a.header.compute_dtype, b.header.compute_dtype].into_iter().flatten();
    let coarsest = computed.chain([dtype]).max_by(|x, y| x.epsilon().total_cmp(&y.epsilon())).unwrap_or(dtype);
    given.tolerance(coarsest, false)
}

/// A reduction the script asked to run narrower than the gradients (a DDP comm hook's cast,
/// FSDP2's reduce_dtype): each of W partials cast, W-1 sums and the divide rounded in that
/// dtype, in each leg (one process's hook rounds too), within 2(W+1)u of the terms (Higham),
/// u its unit roundoff: equivalent up to the reduction the script chose.
fn reduced_in(tol: Tolerance, a: &Trace, b: &Trace) -> Tolerance {
    let narrow = [a.header.reduce_dtype, b.header.reduce_dtype].into_iter().flatten();
    let Some(eps) = narrow.map(|d| d.epsilon()).reduce(f64::max) else { return tol };
    let w = b.header.world_size.unwrap_or(1).max(a.header.world_size.unwrap_or(1)) as f64;
    Tolerance { rtol: tol.rtol.max((w + 1.0) * eps), ..tol }
}

/// What the control set, for the report: the divisor it replayed, the dtype, and whether
/// both legs were measured.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PrecisionHeld {
    pub divisor: f64,
    pub dtype: Dtype,
    pub margin: f64,
    /// The DDP leg ran a control of its own (the legs reach their precision otherwise).
    pub both: bool,
}

/// Each step's and the final weights' allowances from the controls (set as `acc`'s
/// allowances, the larger of them and any already there, elementwise), or why the controls
/// cannot set them. `ctl`: accumulation's control; `ddp`: the DDP leg and its own control,
/// where it ran one. `tol`: the fixed tolerance of wide gradients (`unmeasured_tolerance`), with what a
/// reduction the script asked for rounds; `regrouped`: per step, the micro-batches a
/// regrouped step was cut into (1: not).
pub fn hold(
    acc: &mut Trace,
    ctl: &Trace,
    ddp: Option<(&Trace, &Trace)>,
    tol: &Tolerance,
    regrouped: &[u32],
) -> Result<PrecisionHeld, String> {
    let divisor = ctl.header.divisor_control.ok_or("the control trace was not recorded as one (no divisor_control)")?;
    let pairs = [Some((&*acc, ctl, "accumulation's")), ddp.map(|(d, c)| (d, c, "the DDP leg's"))];
    for (leg, c, whose) in pairs.iter().flatten() {
        c.header.divisor_control.ok_or(format!("{whose} control trace was not recorded as one"))?;
        if c.steps.len() != leg.steps.len() {
            return Err(format!("{whose} control made {} steps where its leg made {}", c.steps.len(), leg.steps.len()));
        }
    }
    let narrowest = [Some(&*acc), Some(ctl), ddp.map(|(d, _)| d)].into_iter().flatten().filter_map(narrow);
    let dtype = narrowest.max_by(|x, y| x.epsilon().total_cmp(&y.epsilon())).unwrap_or(Dtype::Float32);
    let none = Params::new();
    // A step a loss scaler skipped in a leg or its control holds inf/NaN: nothing measured
    // there. The replay is checked at the first step all of them applied, from the same
    // weights where none skipped before it.
    let skipped = |t: &Trace, s: usize| t.facts.scaler.found_inf.get(s).copied().unwrap_or(false);
    let legs = [Some(&*acc), Some(ctl), ddp.map(|(_, c)| c)];
    let any_skipped = |s: usize| legs.iter().flatten().any(|t| skipped(t, s));
    let first = (0..acc.steps.len()).find(|&s| !any_skipped(s));
    let mut steps = Vec::with_capacity(acc.steps.len());
    for (s, (a, c)) in acc.steps.iter().zip(&ctl.steps).enumerate() {
        let k = regrouped.get(s).copied().unwrap_or(1);
        let magnitudes = acc.scales.get(s).unwrap_or(&none);
        let theirs = ddp.map(|(d, dc)| (&d.steps[s], &dc.steps[s]));
        let (measured, own) = match any_skipped(s) {
            true => (None, (a, a)),
            false => (theirs, (a, c)),
        };
        steps.push(allowances(own.0, own.1, measured, &tol.times(k), dtype, magnitudes, first == Some(s))?);
    }
    if acc.allowances.range_parts.is_none() {
        acc.allowances.range_parts = range_parts(acc, ctl);
    }
    let k = regrouped.iter().copied().max().unwrap_or(1);
    let theirs = ddp.map(|(d, dc)| (&d.finals, &dc.finals));
    let finals = allowances(&acc.finals, &ctl.finals, theirs, &tol.times(k), dtype, &acc.peaks, false)?;
    let old = std::mem::take(&mut acc.allowances.steps);
    acc.allowances.steps = steps.into_iter().enumerate().map(|(s, p)| larger(p, old.get(s))).collect();
    let old = std::mem::take(&mut acc.allowances.finals);
    acc.allowances.finals = larger(finals, Some(&old));
    Ok(PrecisionHeld { divisor, dtype, margin: MARGIN, both: ddp.is_some() })
}

/// The largest |Δ| between two tensors' finite elements, and whether the control `y`
/// replayed `x` (at step 0, from the same weights: norms within a factor).
fn distance(name: &str, x: &Values, y: &Values, first: bool) -> Result<f64, String> {
    let (xs, ys) = (x.to_f64(), y.to_f64());
    let norm = |v: &[f64]| v.iter().map(|e| e * e).sum::<f64>().sqrt();
    let (nx, ny) = (norm(&xs), norm(&ys));
    if first && nx > 0.0 && ((ny / nx).ln().abs() > (1.0 + REPLAYED).ln() || !ny.is_finite()) {
        return Err(format!("its gradient of {name} is {:.3}x its leg's at step 0: it did not replay", ny / nx));
    }
    Ok(xs.iter().zip(&ys).map(|(p, q)| (p - q).abs()).filter(|v| v.is_finite()).fold(0.0, f64::max))
}

/// Per tensor of `a`: the wide tolerance `tol` at the tensor's peak (its values and recorded
/// magnitudes), and one ulp of the narrow dtype `narrow` at the peak (a gradient made in it,
/// kept in it or not, is rounded there last: either leg may round it the other way, which
/// the controls' largest difference, taken at another element, may not show), plus MARGIN
/// times the largest
/// |Δ| of either control from its leg (`theirs`: the DDP leg and its control), the same for
/// every element. `first`: step 0, where a control starts from its leg's weights, so its
/// gradients must be its leg's within a factor (else it did not replay).
fn allowances(
    a: &Params,
    c: &Params,
    theirs: Option<(&Params, &Params)>,
    tol: &Tolerance,
    narrow: Dtype,
    magnitudes: &Params,
    first: bool,
) -> Result<Params, String> {
    let find = |ps: &Params, name: &str, x: &Values| {
        ps.iter().find(|(n, t)| n == name && t.shape() == x.shape()).map(|(_, t)| t.clone())
    };
    let mut out = Params::new();
    for (name, x) in a {
        let y = find(c, name, x).ok_or(format!("the control has no {name} of that shape"))?;
        let mut d = distance(name, x, &y, first)?;
        if let Some((dp, dc)) = theirs {
            // A tensor the DDP leg or its control lacks is measured by accumulation's alone.
            if let (Some(p), Some(q)) = (find(dp, name, x), find(dc, name, x)) {
                d = d.max(distance(name, &p, &q, first)?);
            }
        }
        let given = magnitudes.iter().find(|(n, _)| n == name).map_or(0.0, |(_, m)| m.abs_max());
        let peak = x.abs_max().max(given);
        let last = if is_narrow(Some(narrow)) { narrow.epsilon() * peak } else { 0.0 };
        let floor = tol.allowance(peak, Dtype::Float32.epsilon() * peak) + last;
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

    fn zero() -> Tolerance {
        Tolerance { max_ulps: 0, rtol: 0.0, atol: 0.0 }
    }

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
        let held = hold(&mut acc, &ctl, None, &zero(), &[1]).unwrap();
        assert_eq!((held.divisor, held.margin, held.both), (3.0, MARGIN, false));
        let step = acc.allowances.steps[0][0].1.to_f64();
        assert!(step.iter().all(|&b| (b - MARGIN * 0.002).abs() < 1e-5), "{step:?}");
        let finals = acc.allowances.finals[0].1.to_f64();
        assert!(finals.iter().all(|&b| (b - MARGIN * 0.01).abs() < 1e-4), "{finals:?}");
    }

    #[test]
    fn legs_that_reach_their_precision_otherwise_are_held_to_the_larger_of_their_controls() {
        let mut acc = trace(vec![vec![1.0, -2.0]], vec![3.0, 4.0]);
        let mut ctl = trace(vec![vec![1.0, -2.001]], vec![3.0, 4.0]);
        let ddp = trace(vec![vec![1.0, -2.0]], vec![3.0, 4.0]);
        let mut ddp_ctl = trace(vec![vec![1.004, -2.0]], vec![3.0, 4.02]);
        ctl.header.divisor_control = Some(3.0);
        // A DDP control not recorded as one measures nothing.
        let mut other = trace(vec![vec![1.0, -2.0]], vec![3.0, 4.0]);
        assert!(hold(&mut other, &ctl, Some((&ddp, &ddp_ctl)), &zero(), &[1]).is_err());
        ddp_ctl.header.divisor_control = Some(3.0);
        let held = hold(&mut acc, &ctl, Some((&ddp, &ddp_ctl)), &zero(), &[1]).unwrap();
        assert!(held.both);
        let step = acc.allowances.steps[0][0].1.to_f64();
        assert!(step.iter().all(|&b| (b - MARGIN * 0.004).abs() < 1e-5), "{step:?}");
        let finals = acc.allowances.finals[0].1.to_f64();
        assert!(finals.iter().all(|&b| (b - MARGIN * 0.02).abs() < 1e-4), "{finals:?}");
    }

    #[test]
    fn a_control_that_did_not_divide_back_measures_nothing() {
        let mut acc = trace(vec![vec![1.0, 2.0]], vec![1.0, 1.0]);
        let mut ctl = trace(vec![vec![3.0, 6.0]], vec![1.0, 1.0]);
        ctl.header.divisor_control = Some(3.0);
        let why = hold(&mut acc, &ctl, None, &zero(), &[]).unwrap_err();
        assert!(why.contains("did not replay"), "{why}");
        // Nor does a trace that is no precision control.
        ctl.header.divisor_control = None;
        assert!(hold(&mut acc, &ctl, None, &zero(), &[]).is_err());
    }

    #[test]
    fn only_a_narrow_leg_at_a_ratio_no_power_of_two_asks_for_the_control() {
        let mut acc = trace(vec![], vec![]);
        let mut ddp = trace(vec![], vec![]);
        let at = |divisor: f64, both: bool| Some(Wanted { divisor, both });
        assert_eq!(wanted(&acc, &ddp), None);
        acc.header.autocast = Some(Dtype::Bfloat16);
        // Legs that reach their precision otherwise round otherwise at any W: both measured.
        ddp.header.world_size = Some(4);
        assert_eq!(wanted(&acc, &ddp), at(ANEW, true));
        ddp.header.world_size = Some(3);
        assert_eq!(wanted(&acc, &ddp), at(3.0, true));
        ddp.header.autocast = Some(Dtype::Bfloat16);
        assert_eq!(wanted(&acc, &ddp), at(3.0, false));
        // Autocast over float32 weights at a power of two: every narrow op rounds alike, where
        // both cut their steps into micro-batches of the same inputs.
        ddp.header.world_size = Some(4);
        assert_eq!(wanted(&acc, &ddp), at(ANEW, false), "no inputs fingerprinted: not known alike");
        let step = |prints: &[u64]| crate::evidence::StageStep {
            batches: prints
                .iter()
                .map(|&f| crate::evidence::Batch { fingerprint: Some(f), ..Default::default() })
                .collect(),
            ..Default::default()
        };
        acc.facts.stages = vec![step(&[1, 2, 3, 4])];
        ddp.facts.stages = vec![step(&[3, 1, 4, 2])];
        assert_eq!(wanted(&acc, &ddp), None);
        // The same samples regrouped (a strided sampler): each narrow op sums other terms.
        ddp.facts.stages = vec![step(&[5, 6, 7, 8])];
        assert_eq!(wanted(&acc, &ddp), at(ANEW, false));
        ddp.facts.stages = acc.facts.stages.clone();
        // Gradients accumulated in bfloat16 (a bfloat16 model) round in the order they add.
        for t in [&mut acc, &mut ddp] {
            t.header.dtype = Some(Dtype::Bfloat16);
        }
        assert_eq!(wanted(&acc, &ddp), at(ANEW, false));
        // Under a loss scaler, at DDP's own divisor, just off it where the ops round anew.
        for t in [&mut acc, &mut ddp] {
            t.facts.scaler.scales = vec![65536.0];
            t.facts.scaler.found_inf = vec![false];
        }
        assert_eq!(wanted(&acc, &ddp), at(4.0 * ANEW_SCALED, false));
        for t in [&mut acc, &mut ddp] {
            t.header.dtype = Some(Dtype::Float32);
        }
        assert_eq!(wanted(&acc, &ddp), None, "rounding alike, skipping alike");
        ddp.facts.scaler.found_inf = vec![true];
        assert_eq!(wanted(&acc, &ddp), at(4.0, false), "a skip of DDP's own: replayed at its divisor");
    }
}
