//! Ranks started once and reused for many configurations (`explore`, `suite`): rank 0 broadcasts
//! each job, and the ranks 0..W of a job's world size run it on a sub-communicator made
//! once per W at start.

use mpi::topology::{Color, Communicator, SimpleCommunicator};
use mpi::traits::*;

use crate::dist::Mpi;
use crate::error::{Error, Result};
use crate::evidence::Trace;
use crate::spec::TrainConfig;

/// Rank 0's share of a job: the DDP trace, and in lockstep also the accumulation run's
/// and the big batch's, which run beside it.
type Share = (Option<(Trace, Option<Trace>)>, Trace);

/// A job's traces, on rank 0.
pub struct Runs {
    pub accumulation: Trace,
    pub ddp: Trace,
    pub big: Option<Trace>,
}

pub struct RankPool {
    world: SimpleCommunicator,
    /// `subs[w - 1]`: ranks 0..w, present on the ranks inside it.
    subs: Vec<Option<Mpi>>,
}

impl RankPool {
    /// Collective: every rank of `world` calls it.
    pub fn new(world: SimpleCommunicator) -> Self {
        let rank = world.rank() as usize;
        let subs = (1..=world.size() as usize)
            .map(|w| {
                let color = if rank < w { Color::with_value(0) } else { Color::undefined() };
                world.split_by_color(color).map(Mpi::new)
            })
            .collect();
        RankPool { world, subs }
    }

    pub fn size(&self) -> usize {
        self.world.size() as usize
    }

    pub fn is_leader(&self) -> bool {
        self.world.rank() == 0
    }

    /// Rank 0: hands `cfg` to the ranks and runs rank 0's share; returns the DDP trace, and
    /// for a lockstep job also the accumulation run's (which lockstep runs beside it).
    pub fn lead(&self, cfg: &TrainConfig) -> Result<Share> {
        if cfg.shape.gpus > self.size() {
            return Err(Error::bad_flag(
                "--max-gpus",
                format!("a case needs {} ranks but {} were started", cfg.shape.gpus, self.size()),
                "raise --max-gpus",
            ));
        }
        self.send(Some(cfg));
        self.run_share(cfg)?.ok_or_else(|| Error::Rank { rank: 0, problem: "rank 0 is outside its own job".into() })
    }

    /// Rank 0: every run of `cfg` (DDP on the ranks, accumulation and the big batch here).
    pub fn both(&self, cfg: &TrainConfig) -> Result<Runs> {
        let (acc, ddp) = self.lead(cfg)?;
        let (accumulation, big) = match acc {
            Some(acc) => acc,
            None => {
                let big = cfg.with_big_batch().then(|| crate::train::big_batch(cfg)).transpose()?;
                (crate::train::accumulation(cfg)?, big)
            }
        };
        Ok(Runs { accumulation, ddp, big })
    }

    /// Rank 0: releases the other ranks.
    pub fn stop(&self) {
        self.send(None);
    }

    /// Ranks other than 0: serve jobs until rank 0 stops.
    pub fn follow(&self) -> Result<()> {
        while let Some(cfg) = self.receive()? {
            self.run_share(&cfg)?;
        }
        Ok(())
    }

    /// Seconds rank 0 spent inside collectives, over all jobs.
    pub fn comm_seconds(&self) -> f64 {
        self.subs.iter().flatten().map(Mpi::comm_seconds).sum()
    }

    fn run_share(&self, cfg: &TrainConfig) -> Result<Option<Share>> {
        let Some(comm) = &self.subs[cfg.shape.gpus - 1] else { return Ok(None) };
        if !cfg.run.lockstep {
            return crate::train::ddp_rank(cfg, comm).map(|ddp| Some((None, ddp)));
        }
        let (mut acc_steps, mut ddp_steps, mut allowed) = (Vec::new(), Vec::new(), Vec::new());
        let (mut big_steps, mut allowed_big) = (Vec::new(), Vec::new());
        let mut keep = |_: usize, s: crate::train::StepGrads| {
            acc_steps.push(s.accumulation);
            ddp_steps.push(s.ddp);
            allowed.push(s.allowed);
            if let Some((b, a)) = s.big {
                big_steps.push(b);
                allowed_big.push(a);
            }
            Ok(())
        };
        Ok(match crate::train::lockstep(cfg, comm, &mut keep)? {
            Some((acc, ddp, big)) => {
                let nonempty = |v: Vec<crate::evidence::Params>| v.into_iter().filter(|p| !p.is_empty()).collect();
                let mut acc = Trace { steps: nonempty(acc_steps), ..acc };
                acc.allowances.steps = nonempty(allowed);
                acc.allowances.big = nonempty(allowed_big);
                let big = big.map(|b| Trace { steps: nonempty(big_steps), ..b });
                Some((Some((acc, big)), Trace { steps: nonempty(ddp_steps), ..ddp }))
            }
            None => Some((None, Trace::default())),
        })
    }

    fn send(&self, cfg: Option<&TrainConfig>) {
        let mut bytes = cfg.map(|c| serde_json::to_vec(c).expect("config serialises")).unwrap_or_default();
        let root = self.world.process_at_rank(0);
        let mut len = bytes.len() as u64;
        root.broadcast_into(&mut len);
        if len > 0 {
            root.broadcast_into(&mut bytes[..]);
        }
    }

    fn receive(&self) -> Result<Option<TrainConfig>> {
        let root = self.world.process_at_rank(0);
        let mut len = 0u64;
        root.broadcast_into(&mut len);
        if len == 0 {
            return Ok(None);
        }
        let mut bytes = vec![0u8; len as usize];
        root.broadcast_into(&mut bytes[..]);
        serde_json::from_slice(&bytes).map(Some).map_err(|e| Error::Rank {
            rank: self.world.rank() as usize,
            problem: format!("unreadable job from rank 0 ({e})"),
        })
    }
}
