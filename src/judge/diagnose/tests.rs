//! Each family of rules on made-up evidence: traces built by hand, compared for real, and
//! the cause the rules name.

use super::{big_batch, caution, diagnose, Context, Diagnosis, Loss, Origin};
use crate::evidence::{
    DdpForward, Framework, Leg, OptimizerKind, RankDrift, RankHeld, RunKind, Trace, TraceHeader, Values,
};
use crate::judge::{compare, Reason};
use crate::spec::Tolerance;

fn params(name: &str, v: &[f32]) -> Vec<(String, Values)> {
    vec![(name.to_string(), Values::f32s(v.to_vec()))]
}

/// A recorded trace: one parameter `w`, a gradient per step, final weights.
fn trace(steps: &[&[f32]], finals: &[f32]) -> Trace {
    Trace {
        header: TraceHeader {
            version: Some(1),
            run: Some(RunKind::Single),
            world_size: Some(1),
            ..TraceHeader::default()
        },
        steps: steps.iter().map(|g| params("w", g)).collect(),
        finals: params("w", finals),
        ..Trace::default()
    }
}

fn ddp(mut t: Trace, world: usize) -> Trace {
    t.header.run = Some(RunKind::Ddp);
    t.header.world_size = Some(world);
    t
}

const G: &[f32] = &[1.0, -2.0, 0.5, 3.0];
const F: &[f32] = &[0.1, 0.2, 0.3, 0.4];

fn scaled(g: &[f32], k: f32) -> Vec<f32> {
    g.iter().map(|v| v * k).collect()
}

/// The cause named for `a` vs `b` recorded by users (the context their headers give).
fn recorded(a: &Trace, b: &Trace) -> Diagnosis {
    let c = compare("accumulation", a, "ddp", b, &Tolerance::default());
    diagnose(a, b, &c, &Context::of_traces(a, b)).expect("a divergence has a cause")
}

fn ours() -> Context {
    Context {
        origin: Origin::Ours,
        eps: f32::EPSILON as f64,
        steps_per_epoch: Some(2),
        chaos_possible: false,
        loss: Loss::PerSample,
        same_samples: Some(true),
        first_short: None,
        adam_family: false,
    }
}

fn named(a: &Trace, b: &Trace, cx: &Context) -> Diagnosis {
    let c = compare("accumulation", a, "ddp", b, &Tolerance::default());
    diagnose(a, b, &c, cx).expect("a divergence has a cause")
}

mod scaling {
    use super::*;

    /// One tensor's gradient alone half the other run's, the rest agreeing: a scaling of
    /// that tensor (a gradient hook by the micro-batches per process), not the whole loss's.
    #[test]
    fn one_tensor_alone_scaled_is_that_tensors_factor() {
        let two = |w: &[f32], v: &[f32]| {
            vec![("v".to_string(), Values::f32s(v.to_vec())), ("w".to_string(), Values::f32s(w.to_vec()))]
        };
        let (mut a, mut b) = (trace(&[G], F), ddp(trace(&[G], F), 2));
        a.steps = vec![two(G, G)];
        b.steps = vec![two(G, &scaled(G, 0.5))];
        let d = recorded(&a, &b);
        assert_eq!(d.reason, Reason::DifferentGradients, "{d:?}");
        assert!(d.detail.starts_with("at step 0 ddp's gradients of v alone are 1/2 of accumulation's"), "{}", d.detail);
        assert_eq!(d.where_().as_deref(), Some("the local gradient stage, owned by your script"));
    }

    #[test]
    fn a_whole_factor_is_loss_scaling() {
        let half = scaled(G, 0.5);
        let d = recorded(&trace(&[G], F), &ddp(trace(&[&half], F), 2));
        assert_eq!(d.reason, Reason::LossScaling);
        assert!(d.detail.starts_with("ddp gradients are exactly 0.50x accumulation's from step 0: loss scaling"));
    }

    #[test]
    fn a_framework_that_divides_itself_is_named_in_the_fix() {
        let half = scaled(G, 0.5);
        let mut b = ddp(trace(&[&half], F), 2);
        b.header.framework = Some(Framework::Accelerate);
        b.header.optimizer.kind = Some(OptimizerKind::AdamW);
        let d = recorded(&trace(&[G], F), &b);
        assert!(d.detail.contains("Accelerate's accelerator.backward under accumulate() already divides"), "{d:?}");
        assert!(d.detail.contains("under AdamW the weights barely show it"), "{d:?}");
    }

    #[test]
    fn a_factor_of_any_size_is_a_uniform_factor() {
        let odd = scaled(G, 1.37);
        let d = recorded(&trace(&[G], F), &ddp(trace(&[&odd], F), 2));
        assert_eq!(d.reason, Reason::UniformFactor);
        assert!(d.detail.contains("a uniform 1.3700x"), "{d:?}");
    }

    #[test]
    fn a_scaler_that_skipped_alone_is_the_loss_scaler() {
        let (mut a, mut b) = (trace(&[G], F), ddp(trace(&[G], F), 2));
        a.facts.scaler.scales = vec![65536.0];
        a.facts.scaler.found_inf = vec![false];
        b.facts.scaler.scales = vec![65536.0];
        b.facts.scaler.found_inf = vec![true];
        assert_eq!(recorded(&a, &b).reason, Reason::LossScaler);
    }
}

mod steps {
    use super::*;

    #[test]
    fn stepping_every_micro_batch_is_named_by_the_backward_counts() {
        let mut a = trace(&[G, G], F);
        a.facts.micro = vec![2, 2];
        let mut b = ddp(trace(&[G, G, G, G], F), 2);
        b.facts.micro = vec![1, 1, 1, 1];
        let d = recorded(&a, &b);
        assert_eq!(d.reason, Reason::StepCount);
        assert!(d.detail.starts_with("ddp steps the optimizer after every micro-batch (4 steps, 1 backward each)"));
    }

    #[test]
    fn a_gradient_never_zeroed_is_stale() {
        let g1: &[f32] = &[0.5, 1.0, -1.0, 2.0];
        let stale: Vec<f32> = G.iter().zip(g1).map(|(x, y)| x + y).collect();
        let d = named(&trace(&[G, g1], F), &ddp(trace(&[G, &stale], F), 2), &ours());
        assert_eq!(d.reason, Reason::StaleGradients);
        assert!(d.detail.starts_with("ddp's gradient at step 1 is step 0's plus this step's"), "{d:?}");
    }
}

mod sync {
    use super::*;

    fn drift(held: RankHeld) -> Option<RankDrift> {
        Some(RankDrift { step: 0, rank: 1, tensor: held })
    }

    #[test]
    fn an_unsynced_micro_batch_is_traced_by_its_flag() {
        let mut b = ddp(trace(&[G], F), 2);
        b.facts.rank_drift = drift(RankHeld::Grad("w".into()));
        b.facts.ddp_sync = vec![vec![true, false]];
        let d = recorded(&trace(&[G], F), &b);
        assert_eq!(d.reason, Reason::UnsyncedGradient);
        assert!(d.detail.contains("micro-batch 2 of this rank's 2 ran the backward without DDP's all-reduce"));
    }

    #[test]
    fn no_ddp_forward_is_said() {
        let mut b = ddp(trace(&[G], F), 2);
        b.facts.rank_drift = drift(RankHeld::Grad("w".into()));
        b.header.ddp_forward = Some(DdpForward::None);
        assert!(recorded(&trace(&[G], F), &b).detail.contains("no DistributedDataParallel forward ran"));
    }

    #[test]
    fn ranks_holding_other_weights_differ() {
        let mut b = ddp(trace(&[G], F), 2);
        b.facts.rank_drift = drift(RankHeld::Param("w".into()));
        let d = recorded(&trace(&[G], F), &b);
        assert_eq!(d.reason, Reason::RanksDiffer);
        assert!(d.detail.starts_with("after step 0 DDP rank 1 held another param w than rank 0"), "{d:?}");
    }

    #[test]
    fn a_ddp_leg_of_one_process_is_named() {
        let mut b = trace(&[&scaled(G, 0.5)], F);
        b.header.leg = Some(Leg::Ddp);
        let d = recorded(&trace(&[G], F), &b);
        assert_eq!(d.reason, Reason::OneProcess);
        assert!(d.detail.starts_with("ddp was written by a world of 1"), "{d:?}");
    }
}

mod schedule {
    use super::*;

    /// A recorded fact outranks the shape of the numbers: a deep net whose learning rates
    /// part at step 1 is a schedule, not chaos (Accelerate's StepLR ticking per process).
    #[test]
    fn different_learning_rates_outrank_chaos() {
        let g1: Vec<f32> = G.iter().map(|v| v * (1.0 + 1e-4)).collect();
        let (mut a, mut b) = (trace(&[G, G], F), ddp(trace(&[G, &g1], F), 2));
        a.facts.lrs = vec![0.07, 0.07];
        b.facts.lrs = vec![0.07, 0.049];
        let deep = Context { chaos_possible: true, ..Context::of_traces(&a, &b) };
        let c = compare("accumulation", &a, "ddp", &b, &Tolerance::default());
        let d = diagnose(&a, &b, &c, &deep).unwrap();
        assert_eq!(d.reason, Reason::LrSchedule, "{d:?}");
        assert!(d.detail.starts_with("accumulation applied lr 0.07 at step 1 where ddp applied 0.049"));
        // Without the learning rates, the same numbers read as chaos in our own deep nets;
        // a user's are never called chaos by their shape (a control run proves rounding).
        let (a, b) = (trace(&[G, G], F), ddp(trace(&[G, &g1], F), 2));
        let c = compare("accumulation", &a, "ddp", &b, &Tolerance::default());
        let ours = Context { origin: Origin::Ours, ..deep };
        assert_eq!(diagnose(&a, &b, &c, &ours).unwrap().reason, Reason::Chaos);
        assert_ne!(diagnose(&a, &b, &c, &deep).unwrap().reason, Reason::Chaos);
    }

    /// Every optimizer's param groups are facts compared step by step, before any number is
    /// weighed: a second group's warm-up ticked per micro-batch is named by its group and
    /// step, and where no step's groups were recorded the headers' settings are compared.
    #[test]
    fn a_later_param_groups_setting_is_a_recorded_fact() {
        use crate::evidence::Group;
        let g1: Vec<f32> = G.iter().map(|v| v * (1.0 + 1e-4)).collect();
        let (mut a, mut b) = (trace(&[G, G], F), ddp(trace(&[G, &g1], F), 2));
        let group = |group: usize, lr: f64| Group { group, lr: Some(lr), weight_decay: Some(0.01), ..Group::default() };
        a.facts.groups = vec![vec![group(0, 0.1), group(1, 0.01)], vec![group(0, 0.1), group(1, 0.02)]];
        b.facts.groups = vec![vec![group(0, 0.1), group(1, 0.01)], vec![group(0, 0.1), group(1, 0.08)]];
        let d = recorded(&a, &b);
        assert_eq!(d.reason, Reason::OptimizerSettings, "{d:?}");
        assert!(
            d.detail.starts_with("param group 1 was told lr = 0.02 in accumulation and 0.08 in ddp at step 1"),
            "{}",
            d.detail
        );
        let (mut a, mut b) = (trace(&[G, G], F), ddp(trace(&[G, &g1], F), 2));
        (a.header.optimizer.weight_decay, b.header.optimizer.weight_decay) = (Some(0.025), Some(0.0177));
        let d = recorded(&a, &b);
        assert_eq!(d.reason, Reason::OptimizerSettings, "{d:?}");
        assert!(d.detail.contains("weight_decay = 0.025 in accumulation and 0.0177 in ddp"), "{}", d.detail);
    }

    /// A linear decay W times as fast in one run: its length counted per rank.
    #[test]
    fn a_schedule_w_times_as_fast_is_its_length_counted_per_rank() {
        let g1: Vec<f32> = G.iter().map(|v| v * 1.5).collect();
        let (mut a, mut b) = (trace(&[G, G, G], F), ddp(trace(&[G, &g1, &g1], F), 2));
        a.facts.lrs = vec![0.1, 0.1 * (1.0 - 1.0 / 8.0), 0.1 * (1.0 - 2.0 / 8.0)];
        b.facts.lrs = vec![0.1, 0.1 * (1.0 - 1.0 / 4.0), 0.1 * (1.0 - 2.0 / 4.0)];
        let d = recorded(&a, &b);
        assert_eq!(d.reason, Reason::LrSchedule, "{d:?}");
        assert!(d.detail.starts_with("ddp's learning-rate schedule is 2x as far along as accumulation's at step 1"));
        assert!(d.detail.contains("one rank's share of the data"), "{d:?}");
        // The one process ahead by W ticks per micro-batch.
        (a.facts.lrs, b.facts.lrs) = (b.facts.lrs.clone(), a.facts.lrs.clone());
        let d = recorded(&a, &b);
        assert!(d.detail.starts_with("accumulation's learning-rate schedule is 2x as far along"), "{d:?}");
        assert!(d.detail.contains("ticks once per micro-batch"), "{d:?}");
    }
}

mod clipping {
    use super::*;

    /// Each rank clipped its own gradient before a hand-written all_reduce: the gradient DDP
    /// applied is not at the max_norm it was clipped to, the one process's is. The
    /// reduction, and with no DDP forward, the script's.
    #[test]
    fn a_clip_before_the_reduction_leaves_a_norm_off_max_norm() {
        let norm = G.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>().sqrt() as f32;
        let unit: Vec<f32> = G.iter().map(|v| v / norm).collect();
        let (mut a, mut b) = (trace(&[&unit], F), ddp(trace(&[&scaled(&unit, 0.9)], F), 2));
        a.facts.clip_norms = vec![Some((2.0, 1.0))];
        b.facts.clip_norms = vec![Some((1.8, 1.0))];
        b.header.ddp_forward = Some(DdpForward::None);
        let d = recorded(&a, &b);
        assert_eq!(d.reason, Reason::GradientClipping, "{d:?}");
        assert!(
            d.detail.starts_with(
                "ddp clipped its gradients to max_norm 1 at step 0, yet the gradient it applied has norm 0.9"
            ),
            "{}",
            d.detail
        );
        assert_eq!(d.where_().as_deref(), Some("the reduction stage, owned by your script"));
    }

    #[test]
    fn clipping_every_micro_batch_is_counted() {
        let (mut a, mut b) = (trace(&[G], F), ddp(trace(&[&scaled(G, 0.9)], F), 2));
        a.facts.clips = vec![2];
        b.facts.clips = vec![1];
        let d = recorded(&a, &b);
        assert_eq!(d.reason, Reason::GradientClipping);
        assert!(d.detail.starts_with("accumulation clipped its gradients 2 times in step 0 and ddp 1 times"));
    }

    #[test]
    fn a_factor_clipping_ran_on_one_side_is_shown_before_clipping() {
        // ddp's gradient was twice accumulation's and clipped to norm 1.5 of its 3.0: 0.5x
        // after clipping, 2x before (a loss not divided by K/W).
        let (a, mut b) = (trace(&[G], F), ddp(trace(&[&scaled(G, 0.5)], F), 2));
        b.facts.clip_norms = vec![Some((3.0, 0.75))];
        let d = recorded(&a, &b);
        assert_eq!(d.reason, Reason::LossScaling, "{d:?}");
        assert!(d.detail.contains("clipping ran on ddp only") && d.detail.contains("exactly 2.00x before clipping"));
    }

    #[test]
    fn a_factor_both_runs_clip_away_is_a_caution() {
        let (mut a, mut b) = (trace(&[G, G], F), ddp(trace(&[G, G], F), 2));
        a.facts.clip_norms = vec![Some((2.0, 1.0)), Some((4.0, 1.0))];
        b.facts.clip_norms = vec![Some((4.0, 1.0)), Some((8.0, 1.0))];
        let c = compare("accumulation", &a, "ddp", &b, &Tolerance::default());
        let d = caution(&a, &b, &c, &Context::of_traces(&a, &b)).unwrap();
        assert_eq!(d.reason, Reason::HiddenFactor);
        assert!(d.detail.starts_with("clipping hid a 2.0000x factor"), "{d:?}");
    }
}

mod samples {
    use super::*;

    #[test]
    fn a_first_difference_in_a_later_epoch_is_the_sampler_s_epoch() {
        let other: &[f32] = &[0.3, 1.0, -0.7, 0.2];
        let d = named(&trace(&[G, G, G], F), &ddp(trace(&[G, G, other], F), 2), &ours());
        assert_eq!(d.reason, Reason::EpochDependentSampling);
        assert!(d.detail.contains("agree through epoch 0 and first differ in epoch 1 (step 2)"), "{d:?}");
    }

    /// Recorded deals outrank the step count and the gradients' shape: padding, a sampler's
    /// dropping and short batches are each named, with the leg that did more.
    #[test]
    fn data_dealt_unevenly_is_named_from_the_recorded_deal() {
        let other: &[f32] = &[0.3, 1.0, -0.7, 0.2];
        let mut padded = ddp(trace(&[G, other], F), 2);
        padded.header.sampler_padded = Some(1);
        padded.header.sampler_dataset = Some(11);
        padded.header.sampler_repeated = Some("0".into());
        let d = recorded(&trace(&[G], F), &padded);
        assert_eq!(d.reason, Reason::UnevenData);
        assert_eq!(d.where_().as_deref(), Some("the samples stage, owned by your script"));
        assert!(d.detail.starts_with("ddp's sampler padded the data set of N=11 with 1 repeated"), "{d:?}");
        assert!(d.detail.contains("(data set indices 0)"), "{d:?}");
        let mut short = ddp(trace(&[other], F), 2);
        short.header.short_batches = Some(2);
        let d = recorded(&trace(&[G], F), &short);
        assert!(d.detail.starts_with("accumulation ends each epoch with 0 micro-batch(es) shorter"), "{d:?}");
        // Alike in both legs: not the cause.
        let mut acc = trace(&[G], F);
        acc.header.short_batches = Some(2);
        assert_eq!(recorded(&acc, &short).reason, Reason::DifferentSamples);
    }

    #[test]
    fn otherwise_the_samples_differ() {
        let other: &[f32] = &[0.3, 1.0, -0.7, 0.2];
        let d = recorded(&trace(&[other], F), &ddp(trace(&[G], F), 2));
        assert_eq!(d.reason, Reason::DifferentSamples);
    }

    #[test]
    fn tokens_counted_per_rank_need_the_same_samples() {
        let other: &[f32] = &[0.3, 1.0, -0.7, 0.2];
        let cx = Context { loss: Loss::PerToken, steps_per_epoch: None, ..ours() };
        assert_eq!(named(&trace(&[other], F), &ddp(trace(&[G], F), 2), &cx).reason, Reason::TokenCountPerRank);
        let cx = Context { same_samples: Some(false), ..cx };
        assert_eq!(named(&trace(&[other], F), &ddp(trace(&[G], F), 2), &cx).reason, Reason::DifferentSamples);
    }
}

mod dropout {
    use super::*;

    #[test]
    fn a_users_dropout_is_named_before_the_numbers() {
        let mut b = ddp(trace(&[&scaled(G, 0.5)], F), 2);
        b.header.dropout = Some("2 dropout layers, p up to 0.1".into());
        let d = recorded(&trace(&[G], F), &b);
        assert_eq!(d.reason, Reason::DropoutMasks);
        assert!(d.detail.contains("ddp's model trains with dropout on (2 dropout layers, p up to 0.1)"));
    }

    #[test]
    fn masks_from_other_keys_are_named_for_the_same_samples() {
        let (mut a, mut b) = (trace(&[G], F), ddp(trace(&[&scaled(G, 0.7)], F), 2));
        a.facts.dropout_keys = vec![1.0];
        b.facts.dropout_keys = vec![2.0];
        assert_eq!(named(&a, &b, &ours()).reason, Reason::DropoutMasks);
        let cx = Context { same_samples: Some(false), ..ours() };
        assert_ne!(named(&a, &b, &cx).reason, Reason::DropoutMasks);
    }
}

mod rounding {
    use super::*;

    #[test]
    fn nan_is_named_as_a_blow_up() {
        let d = recorded(&trace(&[&[1.0, f32::NAN, 0.5, 3.0]], F), &ddp(trace(&[G], F), 2));
        assert_eq!(d.reason, Reason::NonFinite);
        assert!(d.detail.starts_with("non-finite value at element 1 (NaN vs -2)"), "{d:?}");
    }

    #[test]
    fn agreeing_gradients_with_other_weights_point_at_the_optimizer() {
        let d = recorded(&trace(&[G], F), &ddp(trace(&[G], &[0.1, 0.2, 0.3, 0.5]), 2));
        assert_eq!(d.reason, Reason::OptimizerStep);
        assert!(d.detail.contains("record with ddp_verify_trace.record()"), "{d:?}");
    }

    #[test]
    fn a_tight_explicit_tolerance_is_rounding() {
        let near: Vec<f32> = G.iter().map(|v| f32::from_bits(v.to_bits() + 3)).collect();
        let (a, b) = (trace(&[G], F), ddp(trace(&[&near], F), 2));
        let tight = Tolerance { max_ulps: 1, rtol: 0.0, atol: 0.0 };
        let c = compare("accumulation", &a, "ddp", &b, &tight);
        let d = diagnose(&a, &b, &c, &ours()).unwrap();
        assert_eq!(d.reason, Reason::ExplicitTolerance);
        assert!(d.detail.starts_with("step 0 differs by only 3 ulp"), "{d:?}");
    }
}

mod big {
    use super::*;

    fn judged(acc: &Trace, big: &Trace, cx: &Context) -> Diagnosis {
        let c = compare("accumulation", acc, "big batch", big, &Tolerance::default());
        big_batch(acc, big, &c, cx, true).unwrap()
    }

    #[test]
    fn one_factor_against_the_big_batch_is_loss_scaling() {
        let d = judged(&trace(&[&scaled(G, 2.0)], F), &trace(&[G], F), &ours());
        assert_eq!(d.reason, Reason::LossScaling);
        assert!(d.detail.starts_with("from step 0 accumulation's gradients are 2.000x the big batch's"), "{d:?}");
    }

    #[test]
    fn no_factor_in_a_users_loop_is_a_per_micro_batch_mean() {
        let other: &[f32] = &[0.3, 1.0, -0.7, 0.2];
        let (a, b) = (trace(&[other], F), trace(&[G], F));
        let d = judged(&a, &b, &Context::of_traces(&a, &b));
        assert_eq!(d.reason, Reason::PerMicroBatchMean);
        assert!(d.detail.contains("Transformers PR 34191"), "{d:?}");
        // Ours without a token loss: what the runs' own rules say.
        assert_eq!(judged(&a, &b, &ours()).reason, Reason::DifferentSamples);
    }

    #[test]
    fn a_short_window_divided_by_k_is_named() {
        let cx = Context { first_short: Some(super::super::ShortWindow { step: 1, fraction: 0.5 }), ..ours() };
        let d = judged(&trace(&[G, &scaled(G, 0.5)], F), &trace(&[G, G], F), &cx);
        assert_eq!(d.reason, Reason::ShortWindowScaling, "{d:?}");
    }
}

/// Sharded engines: the facts the recorder reads from FSDP2 and DeepSpeed name the cause.
mod sharded {
    use super::*;
    use crate::evidence::Engine;

    fn fsdp2(mut t: Trace, world: usize) -> Trace {
        t = ddp(t, world);
        t.header.engine = Some(Engine::Fsdp2);
        t.header.grad_divide = Some(world as f64);
        t
    }

    #[test]
    fn a_divide_factor_other_than_w_is_a_sum_over_ranks() {
        let a = trace(&[G], F);
        let mut b = fsdp2(trace(&[&scaled(G, 2.0)], F), 2);
        b.header.grad_divide = Some(1.0);
        let d = recorded(&a, &b);
        assert_eq!(d.reason, Reason::SummedOverRanks);
        assert!(d.detail.contains("gradients are 2x: summed over ranks, not averaged"), "{}", d.detail);
        assert!(d.detail.contains("set_gradient_divide_factor(1.0)"), "{}", d.detail);
    }

    #[test]
    fn micro_batches_left_unreduced_are_named_by_their_flags() {
        let a = trace(&[G, G], F);
        // Never reduced: the optimizer got no gradient.
        let mut b = fsdp2(trace(&[&[], &[]], F), 2);
        b.steps = vec![Vec::new(), Vec::new()];
        b.facts.micro = vec![2, 2];
        b.facts.ddp_sync = vec![vec![false, false], vec![false, false]];
        let d = recorded(&a, &b);
        assert_eq!(d.reason, Reason::UnsyncedGradient);
        assert!(d.detail.contains("none of ddp's 2 micro-batches per rank") && d.detail.contains("did not move"));
        // Reduced on the first, not the last: the last is carried into the next step.
        let mut b = fsdp2(trace(&[&scaled(G, 0.5), G], F), 2);
        b.facts.ddp_sync = vec![vec![true, false], vec![true, false]];
        let d = recorded(&a, &b);
        assert_eq!(d.reason, Reason::UnsyncedGradient);
        assert!(d.detail.contains("micro-batch 2 of ddp's 2 per rank did not reduce"), "{}", d.detail);
        // Under DDP the flags are the rank checksums' to explain: this rule keeps out.
        let mut b = ddp(trace(&[&scaled(G, 0.5), G], F), 2);
        b.facts.ddp_sync = vec![vec![true, false], vec![true, false]];
        assert_ne!(recorded(&a, &b).reason, Reason::UnsyncedGradient);
    }

    #[test]
    fn deepspeed_told_fewer_accumulation_steps_than_backwards_loses_micro_batches() {
        let a = trace(&[G], F);
        let mut b = ddp(trace(&[&scaled(G, 0.7)], F), 2);
        b.header.engine = Some(Engine::DeepSpeed2);
        b.header.engine_accumulation = Some(1);
        b.facts.micro = vec![2];
        let d = recorded(&a, &b);
        assert_eq!(d.reason, Reason::EngineBoundary);
        assert!(d.detail.contains("gradient_accumulation_steps=1"), "{}", d.detail);
    }

    #[test]
    fn reducing_every_micro_batch_is_a_caution_with_its_cost() {
        use crate::judge::{cautioned, costs, needless_sync};
        let a = trace(&[G, G], F);
        let mut b = ddp(trace(&[G, G], F), 2);
        b.header.engine = Some(Engine::Ddp);
        b.facts.ddp_sync = vec![vec![true, true], vec![true, true]];
        b.facts.comm = vec![Some((2, 2_000_000)), Some((2, 2_000_000))];
        b.facts.seconds = vec![None, Some(0.5)];
        let c = costs(["accumulation", "ddp"], &a, &b);
        let d = cautioned(&needless_sync(&c).expect("a caution"), "accumulation", "ddp");
        assert_eq!(d.reason, Reason::NeedlessSync);
        assert!(d.detail.starts_with("1 of the 2 micro-batches per rank were all-reduced needlessly in ddp: 1.0 MB"));
        assert!(d.detail.contains("ddp 0.5000 s"), "{}", d.detail);
        // Once per step: no caution; DeepSpeed ZeRO reduces every backward by design.
        b.facts.ddp_sync = vec![vec![false, true], vec![false, true]];
        assert!(needless_sync(&costs(["accumulation", "ddp"], &a, &b)).is_none());
        b.facts.ddp_sync = vec![vec![true, true], vec![true, true]];
        b.header.engine = Some(Engine::DeepSpeed2);
        assert!(needless_sync(&costs(["accumulation", "ddp"], &a, &b)).is_none());
    }
}
