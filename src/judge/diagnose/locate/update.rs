//! The update: learning rates each step applied, the loss scaler's record, clip counts, and
//! what the optimizer made of gradients that agree.

use crate::evidence::{Engine, Group, OptimizerRecord, Trace};
use crate::judge::diagnose::parting::{Numbers, Pace, Parting, Side, Told};
use crate::judge::diagnose::{Evidence, Stage};
use crate::judge::Agreement;

/// The runs applied different learning rates at some step: their schedules ticked a
/// different number of times, or one schedule's length was computed otherwise (per rank).
pub fn lr_schedule(ev: &Evidence) -> Option<Parting> {
    let l = ev.c.lr?;
    let numbers = Numbers::LrSchedule { left: l.left, right: l.right, pace: paced(ev, l.step) };
    Some(Parting::new(Some(l.step), Some(Stage::Update), None, numbers))
}

/// How many times farther along its schedule `b` is than `a` at step `t`: both start at one
/// rate, and a linear schedule's (warm-up's or decay's) distance from it grows with the
/// steps taken over the schedule's length; None where `a` has not moved yet.
fn pace(a: &[f64], b: &[f64], t: usize) -> Option<f64> {
    let (l0, la, lb) = (*a.first()?, *a.get(t)?, *b.get(t)?);
    if b.first() != Some(&l0) || la == l0 {
        return None;
    }
    let r = (l0 - lb) / (l0 - la);
    (r.is_finite() && r > 0.0).then_some(r)
}

/// A schedule W times (or K times) as far along in one run. The one process ahead by W
/// ticks per micro-batch (K a step against K/W on each rank); the DDP run ahead by W
/// counted its length from one rank's share of the data, or ticks once per process.
fn paced(ev: &Evidence, t: usize) -> Option<Pace> {
    let r = pace(&ev.a.facts.lrs, &ev.b.facts.lrs, t)?;
    let w = ev.a.header.world_size.max(ev.b.header.world_size).unwrap_or(1) as f64;
    let k = ev.a.header.acc_steps.or(ev.b.header.acc_steps).map(|k| k as f64);
    let near = |x: f64, y: f64| (x / y - 1.0).abs() < 0.05;
    let ddp_ahead = r >= 1.0; // `b` is the DDP run
    let by = if ddp_ahead { r } else { 1.0 / r };
    if w > 1.0 && near(by, w) && ddp_ahead {
        return Some(Pace { by, ddp_ahead, per_rank_length: true });
    }
    let per_micro_batch = (w > 1.0 && near(by, w) && !ddp_ahead) || k.is_some_and(|k| k > 1.0 && near(by, k));
    per_micro_batch.then_some(Pace { by, ddp_ahead, per_rank_length: false })
}

/// What the runs' loss scalers did differently, from their records.
pub fn loss_scaler(ev: &Evidence) -> Option<Parting> {
    let m = ev.c.scaler?;
    Some(Parting::new(Some(m.step), Some(Stage::Scaling), None, Numbers::LossScaler(m)))
}

/// The runs clipped a different number of times in the first differing step.
pub fn clip_count(ev: &Evidence) -> Option<Parting> {
    let s = ev.first?;
    let (&left, &right) = (ev.a.facts.clips.get(s)?, ev.b.facts.clips.get(s)?);
    (left != right).then(|| Parting::new(Some(s), Some(Stage::Update), None, Numbers::ClipCount { left, right }))
}

/// Every step's gradients agree, yet the runs differ: in what the optimizer made of them,
/// or in the buffers.
pub fn after_the_gradients(ev: &Evidence) -> Option<Parting> {
    if ev.first.is_some() {
        return None;
    }
    if ev.c.finals.verdict != Agreement::Diverged {
        return Some(Parting::new(None, Some(Stage::LocalGradient), None, Numbers::Buffers));
    }
    let carried = ev.cx.ours() || ev.c.derived;
    // SGD is linear in the gradients; another optimizer, or one not recorded, may amplify.
    let sgd = [ev.a, ev.b].iter().all(|t| t.header.optimizer.kind == Some(crate::evidence::OptimizerKind::Sgd));
    let amplifies = !ev.cx.ours() && !sgd;
    Some(Parting::new(None, Some(Stage::Update), None, Numbers::OptimizerStep { carried, amplifies }))
}

/// The runs' optimizers were told different updates: a setting of some param group at some
/// step (a second group's warm-up ticked per micro-batch, a weight decay derived from the
/// process's batch), another number of groups, or, where no step's groups were recorded,
/// the first group's settings in the headers. A recorded fact: it decides before any
/// difference in the numbers is weighed.
pub fn settings(ev: &Evidence) -> Option<Parting> {
    let (a, b) = (&ev.a.facts.groups, &ev.b.facts.groups);
    // A group's parameter count is the script's where the engine does not flatten or shard.
    let counted = [ev.a, ev.b].iter().all(|t| t.header.engine.is_none_or(|e| e == Engine::Ddp));
    for (s, (x, y)) in a.iter().zip(b).enumerate().filter(|(_, (x, y))| !x.is_empty() && !y.is_empty()) {
        let apart =
            x.len() != y.len() || x.iter().zip(y).any(|(g, h)| (g.optimizer, g.group) != (h.optimizer, h.group));
        if apart {
            return Some(Parting::new(
                Some(s),
                Some(Stage::Update),
                None,
                Numbers::GroupsDiffer { left: x.len(), right: y.len() },
            ));
        }
        for (g, h) in x.iter().zip(y) {
            let differing = g
                .settings()
                .into_iter()
                .zip(h.settings())
                .find(|((name, u), (_, v))| (counted || *name != "params") && differ(*u, *v));
            if let Some(((name, u), (_, v))) = differing {
                let numbers = Numbers::Setting {
                    optimizer: g.optimizer,
                    group: g.group,
                    setting: name,
                    left: Told::Number(u),
                    right: Told::Number(v),
                    steady: steady(a, b, (g.optimizer, g.group), name),
                };
                return Some(Parting::new(Some(s), Some(Stage::Update), None, numbers));
            }
        }
    }
    if !a.is_empty() && !b.is_empty() {
        return None;
    }
    header_setting(&ev.a.header.optimizer, &ev.b.header.optimizer)
        .map(|numbers| Parting::new(None, Some(Stage::Update), None, numbers))
}

/// The right run's value of one group's setting over the left's, where it is the same at
/// every step both recorded (a base value apart, scaled alike by any schedule).
fn steady(a: &[Vec<Group>], b: &[Vec<Group>], id: (usize, usize), name: &str) -> Option<f64> {
    let value = |gs: &Vec<Group>| {
        let g = gs.iter().find(|g| (g.optimizer, g.group) == id)?;
        g.settings().into_iter().find(|(n, _)| *n == name)?.1
    };
    let ratios: Vec<f64> = a.iter().zip(b).filter_map(|(x, y)| Some(value(y)? / value(x)?)).collect();
    let first = *ratios.first()?;
    (ratios.len() > 1 && first.is_finite() && ratios.iter().all(|r| (r - first).abs() <= 1e-9 * first.abs()))
        .then_some(first)
}

/// Two recorded values of one setting that are not the same training's: both set and apart
/// (beyond the last bits a schedule's arithmetic may round), or set in one run only.
fn differ(u: Option<f64>, v: Option<f64>) -> bool {
    match (u, v) {
        (Some(x), Some(y)) => (x - y).abs() > 1e-12 * x.abs().max(y.abs()),
        (None, None) => false,
        _ => true,
    }
}

/// The first group's settings as the headers give them, where both give one and they differ.
fn header_setting(x: &OptimizerRecord, y: &OptimizerRecord) -> Option<Numbers> {
    let setting = |setting: &'static str, (left, right): (Told, Told)| Numbers::Setting {
        optimizer: 0,
        group: 0,
        setting,
        left,
        right,
        steady: None,
    };
    if let (Some(k), Some(l)) = (&x.kind, &y.kind) {
        if k != l {
            return Some(setting("optimizer", (Told::Name(k.name().to_string()), Told::Name(l.name().to_string()))));
        }
    }
    let number = |u: &Option<f64>, v: &Option<f64>| match (u, v) {
        (Some(p), Some(q)) if p != q => Some((Told::Number(Some(*p)), Told::Number(Some(*q)))),
        _ => None,
    };
    let flag = |u: &Option<bool>, v: &Option<bool>| match (u, v) {
        (Some(p), Some(q)) if p != q => Some((Told::Flag(*p), Told::Flag(*q))),
        _ => None,
    };
    let betas = match (&x.betas, &y.betas) {
        (Some(p), Some(q)) if p != q => Some((Told::Numbers(p.clone()), Told::Numbers(q.clone()))),
        _ => None,
    };
    let apart = [
        ("weight_decay", number(&x.weight_decay, &y.weight_decay)),
        ("betas", betas),
        ("eps", number(&x.eps, &y.eps)),
        ("momentum", number(&x.momentum, &y.momentum)),
        ("dampening", number(&x.dampening, &y.dampening)),
        ("amsgrad", flag(&x.amsgrad, &y.amsgrad)),
        ("nesterov", flag(&x.nesterov, &y.nesterov)),
        ("maximize", flag(&x.maximize, &y.maximize)),
    ];
    apart.into_iter().find_map(|(name, told)| Some(setting(name, told?)))
}

/// A leg that clipped at the first differing step, whose applied gradient's norm is not the
/// max_norm it was clipped to, beside one whose is: the clipped gradient changed before the
/// step. Over several ranks that is a reduction after a clip each rank made of its own
/// gradient (a hand-written all_reduce after clip_grad_norm_). Other optimizers' parameters
/// (`optimizer{k}.…`), which the model's clip does not cover, are left out of the norm.
pub fn clipped_before_reduction(ev: &Evidence) -> Option<Parting> {
    let s = ev.first?;
    if ev.a.sampling.is_some() || ev.b.sampling.is_some() {
        return None;
    }
    let applied = |t: &Trace| -> Option<(f64, f64)> {
        let (total, max) = t.facts.clip_norms.get(s).copied().flatten()?;
        let g = t.steps.get(s)?;
        let squares =
            g.iter().filter(|(n, _)| !n.starts_with("optimizer")).flat_map(|(_, v)| v.to_f64()).map(|x| x * x);
        (total > max * (1.0 + CLIPPED_REL)).then(|| (squares.sum::<f64>().sqrt(), max))
    };
    let ((na, ma), (nb, mb)) = (applied(ev.a)?, applied(ev.b)?);
    let ranks = ev.b.header.world_size.unwrap_or(1) > 1;
    let fits = |n: f64, m: f64| (n / m - 1.0).abs() <= CLIPPED_REL;
    (ranks && fits(na, ma) && !fits(nb, mb)).then(|| {
        let numbers = Numbers::ClippedBeforeReduction { norm: nb, max: mb };
        Parting::new(Some(s), Some(Stage::Reduction), Some(Side::Right), numbers)
    })
}

/// How near a clipped gradient's norm is to its max_norm (clip_grad_norm_ scales by
/// max_norm / (total + 1e-6), and the norm is summed in float32).
const CLIPPED_REL: f64 = 1e-3;
