//! Golden traces: `DIR/config.json` (a header saying what made them) beside
//! `DIR/accumulation.safetensors` and `DIR/ddp.safetensors`. The project's own goldens come
//! from real PyTorch (`fixtures/`); users record theirs with `--bless`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::Trace;
use crate::error::{Error, Result};
use crate::spec::{DeviceKind, KernelFacts, KernelMode, Machine, Platform, TrainConfig};

/// The libtorch this binary links, read from the wheel at build time.
pub const LIBTORCH_VERSION: &str = env!("DDP_VERIFY_LIBTORCH_VERSION");
pub const TOOL_VERSION: &str = env!("CARGO_PKG_VERSION");

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GoldenMeta {
    pub train: TrainConfig,
    /// The PyTorch or libtorch version whose arithmetic made the numbers.
    pub torch_version: String,
    #[serde(default = "float32")]
    pub dtype: String,
    #[serde(default = "cpu")]
    pub device: String,
    /// Set on goldens blessed by ddp-verify itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_version: Option<String>,
    #[serde(default)]
    pub made_by: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub date: Option<String>,
    /// Each tensor holds only this many strided elements (`trace::sample`), which keeps
    /// goldens of large models small.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample: Option<usize>,
    /// The kernels and machine that made the numbers: whether its bits can hold here
    /// ([`check_platform`]). Absent from goldens made before they were recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernels: Option<KernelFacts>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<Machine>,
}

fn float32() -> String {
    "float32".into()
}

fn cpu() -> String {
    "cpu".into()
}

pub struct Golden {
    pub dir: PathBuf,
    pub meta: GoldenMeta,
    pub accumulation: Trace,
    pub ddp: Trace,
    /// PyTorch's big batch, where the golden has one (`big_batch.safetensors`).
    pub big_batch: Option<Trace>,
}

/// Where a golden keeps one directory per CPU vendor: `DIR/vendor-<vendor_id>/`.
pub const VENDOR_PREFIX: &str = "vendor-";

/// The directory of `dir`'s golden for a CPU of `vendor` (`/proc/cpuinfo`'s vendor_id).
///
/// Portable kernels pin ATen's loops and MKL's BLAS branch, but MKL's vector math (the
/// `sqrt` AdamW takes; `exp`, `log`, `tanh` through `torch.exp` and kin) runs other code on
/// Intel's and AMD's CPUs even on its COMPATIBLE branch, and rounds differently: one ulp in
/// a square root, which AdamW turns into a full step where a gradient is zero. Goldens whose
/// runs take it are kept per vendor (`fixtures/make_golden.sh` knows which); every other
/// golden is one directory for every CPU.
pub fn for_vendor(dir: &Path, vendor: &str) -> Result<PathBuf> {
    let mine = dir.join(format!("{VENDOR_PREFIX}{vendor}"));
    if mine.is_dir() {
        return Ok(mine);
    }
    let others = vendors(dir);
    if others.is_empty() {
        return Ok(dir.to_path_buf());
    }
    Err(Error::bad_file(
        dir,
        format!(
            "holds this golden as made on {} CPUs only: MKL's vector math (the sqrt AdamW takes) rounds \
             differently on {vendor}'s, even on its COMPATIBLE branch",
            others.join(" and ")
        ),
        "make this vendor's with fixtures/make_golden.sh vendor (or compare on a CPU of a vendor it has)",
    ))
}

/// The vendors `dir` keeps a golden for, where it keeps them per vendor.
pub fn vendors(dir: &Path) -> Vec<String> {
    let mut found: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().to_str()?.strip_prefix(VENDOR_PREFIX).map(String::from))
        .collect();
    found.sort();
    found
}

/// The optional third trace of a golden.
pub const BIG_BATCH_FILE: &str = "big_batch.safetensors";

const FILES: [&str; 3] = ["config.json", "accumulation.safetensors", "ddp.safetensors"];

impl Golden {
    /// Loads a golden and refuses one made for another configuration, dtype, device or
    /// libtorch, or with kernels whose bits cannot hold on `ours` ([`check_platform`]),
    /// naming what differs, so a golden is never silently compared against the wrong run.
    /// `shapes`: the model's parameters, named, with their shapes (`train::models::shapes`),
    /// which the golden's tensors must match.
    pub fn load(dir: &Path, train: &TrainConfig, shapes: &[(String, Vec<i64>)], ours: &Platform) -> Result<Golden> {
        let dir = &for_vendor(dir, &ours.machine.vendor)?;
        if !dir.is_dir() {
            return Err(Error::bad_flag(
                "--golden",
                format!("{} {}, not a golden's directory", dir.display(), crate::error::what_is(dir)),
                format!("pass a golden such as golden/article, or record one with --golden {} --bless", dir.display()),
            ));
        }
        let meta_path = dir.join(FILES[0]);
        let meta = read_meta(dir)?;
        if let Some((flag, golden, ours)) = first_difference(&meta.train, train) {
            return Err(Error::bad_file(
                dir,
                format!("golden was made with {flag} {golden} but this run has {flag} {ours}"),
                format!("pass the flags in {} or choose the golden for this config", meta_path.display()),
            ));
        }
        check_compatible(dir, &meta, train)?;
        check_platform(&meta, ours, train.run.device).map_err(|problem| {
            Error::bad_file(
                dir,
                problem,
                "remake it with portable kernels: fixtures/make_golden.sh for the project's goldens, \
                 or this run with --kernels portable --bless",
            )
        })?;
        let accumulation = Trace::load(&dir.join(FILES[1]))?;
        let ddp = Trace::load(&dir.join(FILES[2]))?;
        for (file, trace) in [(FILES[1], &accumulation), (FILES[2], &ddp)] {
            check_layout(&dir.join(file), trace, train, shapes, meta.sample)?;
        }
        let big_path = dir.join(BIG_BATCH_FILE);
        let big_batch = match big_path.exists() {
            true => Some(Trace::load(&big_path)?),
            false => None,
        };
        if let Some(big) = &big_batch {
            check_layout(&big_path, big, train, shapes, meta.sample)?;
        }
        Ok(Golden { dir: dir.into(), meta, accumulation, ddp, big_batch })
    }
}

/// A golden's header (`DIR/config.json`) alone: the run reads the kernel mode from it before
/// libtorch makes any tensor.
pub fn read_meta(dir: &Path) -> Result<GoldenMeta> {
    let meta_path = dir.join(FILES[0]);
    let fix = "re-record it with --bless (or fixtures/make_golden.sh for the project's goldens)";
    let text = std::fs::read_to_string(&meta_path)
        .map_err(|e| Error::bad_file(&meta_path, format!("cannot read ({e})"), fix))?;
    serde_json::from_str(&text).map_err(|e| Error::bad_file(&meta_path, format!("not a golden header ({e})"), fix))
}

/// Whether a golden's bits can be expected from this process (`ours`): portable kernels
/// match portable kernels on any CPU; native ones only the same CPU model with the same
/// settings; CUDA kernels only the same GPU model. Else the problem, in words.
pub fn check_platform(meta: &GoldenMeta, ours: &Platform, device: DeviceKind) -> std::result::Result<(), String> {
    let (Some(kernels), Some(machine)) = (&meta.kernels, &meta.machine) else {
        return Err("its header does not say which kernels and machine made it, so its bits cannot be \
                    expected anywhere (made before ddp-verify recorded them)"
            .into());
    };
    let theirs = Platform { kernels: kernels.clone(), machine: machine.clone() };
    if device == DeviceKind::Cuda && machine.gpu != ours.machine.gpu {
        let show = |g: &Option<String>| g.clone().unwrap_or_else(|| "unknown".into());
        return Err(format!(
            "it was made on GPU {}, this run's GPU is {}: CUDA kernels give other bits on another GPU model",
            show(&machine.gpu),
            show(&ours.machine.gpu)
        ));
    }
    let k = &ours.kernels;
    let same_settings = kernels.mode == k.mode
        && kernels.cpu_capability == k.cpu_capability
        && kernels.onednn == k.onednn
        && kernels.mkl_cbwr == k.mkl_cbwr
        && kernels.threads == k.threads;
    let same_cpu = machine.cpu == ours.machine.cpu && machine.vendor == ours.machine.vendor;
    match (kernels.mode, same_cpu, same_settings) {
        (KernelMode::Native, false, _) => Err(format!(
            "it was made with native kernels on another CPU ({}; this is {}): native kernels give other bits \
             on another CPU model",
            theirs.describe(),
            ours.describe()
        )),
        (_, _, false) => Err(format!(
            "it was made with {} kernels ({}), this run computes with {} kernels ({})",
            kernels.mode.name(),
            theirs.describe(),
            k.mode.name(),
            ours.describe()
        )),
        _ => Ok(()),
    }
}

fn check_compatible(dir: &Path, meta: &GoldenMeta, train: &TrainConfig) -> Result<()> {
    let refuse = |what: String| {
        Err(Error::bad_file(dir, what, "re-record the golden with this build (--bless), or use the build that made it"))
    };
    // Another precision or device rounds differently: its numbers prove nothing here.
    if meta.dtype != train.precision.dtype.name() || meta.device != train.run.device.name() {
        return refuse(format!(
            "golden is {} on {}, this run is {} on {}",
            meta.dtype,
            meta.device,
            train.precision.dtype.name(),
            train.run.device.name()
        ));
    }
    let major_minor = |v: &str| v.split('.').take(2).collect::<Vec<_>>().join(".");
    if LIBTORCH_VERSION != "unknown" && major_minor(&meta.torch_version) != major_minor(LIBTORCH_VERSION) {
        return refuse(format!(
            "golden was made with torch {} but this build links libtorch {LIBTORCH_VERSION}",
            meta.torch_version
        ));
    }
    if let Some(v) = &meta.tool_version {
        if v.split('.').next() != TOOL_VERSION.split('.').next() {
            return refuse(format!("golden was blessed by ddp-verify {v}, this is {TOOL_VERSION}"));
        }
    }
    Ok(())
}

/// A golden must hold this model's parameters, with their shapes (or sample sizes), for
/// every optimizer step the config makes: anything else is a broken file, refused before
/// any run.
fn check_layout(
    path: &Path,
    trace: &Trace,
    train: &TrainConfig,
    shapes: &[(String, Vec<i64>)],
    sample: Option<usize>,
) -> Result<()> {
    let fix = "re-record it with --bless (or fixtures/make_golden.sh for the project's goldens)";
    let shape = |size: &Vec<i64>| match sample {
        Some(k) => vec![(size.iter().product::<i64>() as usize).min(k) as i64],
        None => size.clone(),
    };
    let want: Vec<(&str, Vec<i64>)> = shapes.iter().map(|(n, size)| (n.as_str(), shape(size))).collect();
    let steps = crate::plan::sampler::optimizer_steps(train);
    if trace.steps.len() != steps {
        return Err(Error::bad_file(
            path,
            format!("holds {} optimizer steps, the config makes {steps}", trace.steps.len()),
            fix,
        ));
    }
    // Under AdamW the finals also hold each parameter's moments, as `exp_avg.<param>` and
    // `exp_avg_sq.<param>`.
    let mut want_finals: Vec<(String, Vec<i64>)> = want.iter().map(|(n, s)| (n.to_string(), s.clone())).collect();
    if train.optim.optimizer == crate::spec::Optimizer::AdamW {
        for (n, s) in &want {
            want_finals.extend([(format!("exp_avg.{n}"), s.clone()), (format!("exp_avg_sq.{n}"), s.clone())]);
        }
    }
    want_finals.sort();
    let want_finals: Vec<(&str, Vec<i64>)> = want_finals.iter().map(|(n, s)| (n.as_str(), s.clone())).collect();
    for (what, params) in trace.steps.iter().map(|p| ("gradient", p)).chain([("final weight", &trace.finals)]) {
        let mut got: Vec<(&str, Vec<i64>)> = params.iter().map(|(n, t)| (n.as_str(), t.size())).collect();
        let want = match what {
            "gradient" => &want,
            _ => {
                got.sort();
                &want_finals
            }
        };
        if got != *want {
            let problem = if got.len() > 4 || want.len() > 4 {
                let diff = got.iter().zip(want).find(|(g, w)| g != w);
                format!(
                    "{what} tensors differ from the model's ({} vs {} tensors; first difference {diff:?})",
                    got.len(),
                    want.len()
                )
            } else {
                format!("{what} tensors are {got:?}, the model has {want:?}")
            };
            return Err(Error::bad_file(path, problem, fix));
        }
    }
    Ok(())
}

/// Writes (or replaces) a golden from this run's traces, atomically: everything goes to a
/// temporary directory beside DIR, which then takes DIR's place by rename.
pub fn bless(dir: &Path, train: &TrainConfig, accumulation: &Trace, ddp: &Trace, ours: &Platform) -> Result<()> {
    let meta = GoldenMeta {
        train: TrainConfig { inject: None, ..train.clone() },
        torch_version: LIBTORCH_VERSION.into(),
        dtype: train.precision.dtype.name().into(),
        device: train.run.device.name().into(),
        tool_version: Some(TOOL_VERSION.into()),
        made_by: "ddp-verify --bless".into(),
        date: Some(utc_now()),
        sample: None,
        kernels: Some(ours.kernels.clone()),
        machine: Some(ours.machine.clone()),
    };
    std::fs::create_dir_all(dir).map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    // Only the golden's own three files are written, each to a temporary name in the same
    // directory and then renamed over the old one: nothing else there is ever touched.
    let json = serde_json::to_string_pretty(&meta).expect("header serialises") + "\n";
    let tmp = |f: &str| dir.join(format!(".{f}.bless-{}", std::process::id()));
    let written = accumulation
        .save(&tmp(FILES[1]))
        .and_then(|()| ddp.save(&tmp(FILES[2])))
        .and_then(|()| std::fs::write(tmp(FILES[0]), json).map_err(|e| Error::io("writing the golden header", e)));
    let renamed = written.and_then(|()| {
        // The header last: a golden whose header is new has its new traces.
        for f in [FILES[1], FILES[2], FILES[0]] {
            std::fs::rename(tmp(f), dir.join(f))
                .map_err(|e| Error::io(format!("moving the new {f} into {}", dir.display()), e))?;
        }
        Ok(())
    });
    if renamed.is_err() {
        for f in FILES {
            let _ = std::fs::remove_file(tmp(f));
        }
    }
    renamed
}

/// Before anything runs: `--bless` may write into `dir` only if it is new, empty, or holds a
/// golden (its three files, with a header this tool reads, and nothing else), because it
/// replaces those files. Anything else is somebody's and is refused, untouched.
pub fn check_blessable(dir: &Path) -> Result<()> {
    let fix = "point --golden at a new or empty directory, or at an existing golden";
    let meta = match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::bad_file(dir, format!("--golden cannot be read ({e})"), fix)),
        Ok(m) => m,
    };
    if !meta.is_dir() {
        return Err(Error::bad_file(dir, "--golden for --bless must be a directory, and this is not one", fix));
    }
    let entries =
        std::fs::read_dir(dir).map_err(|e| Error::bad_file(dir, format!("--golden cannot be listed ({e})"), fix))?;
    for entry in entries {
        let name = entry.map_err(|e| Error::io(format!("listing {}", dir.display()), e))?.file_name();
        let name = name.to_string_lossy();
        if !FILES.contains(&name.as_ref()) {
            return Err(Error::bad_file(
                dir,
                format!("holds {name}, which is not a golden's; --bless replaces a golden's own files only"),
                fix,
            ));
        }
    }
    let header = dir.join(FILES[0]);
    if header.exists() {
        let text = std::fs::read_to_string(&header).unwrap_or_default();
        if serde_json::from_str::<GoldenMeta>(&text).is_err() {
            return Err(Error::bad_file(
                &header,
                "is not a golden header this tool reads; --bless will not replace it",
                fix,
            ));
        }
    }
    Ok(())
}

/// True when the `CI` variable says this is a CI run, as insta reads it.
pub fn on_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && v != "false")
}

/// The first field that differs, as (flag, golden value, our value).
fn first_difference(golden: &TrainConfig, ours: &TrainConfig) -> Option<(String, String, String)> {
    let g = serde_json::to_value(golden).ok()?;
    let o = serde_json::to_value(TrainConfig { inject: None, ..ours.clone() }).ok()?;
    let (g, o) = (g.as_object()?, o.as_object()?);
    // `init` is a path, which differs between checkouts; the golden's layout check and the
    // numbers themselves catch a wrong initial state. Fields at their default are left out
    // of the JSON, so a key on one side only is a difference too.
    let keys = g.keys().chain(o.keys().filter(|k| !g.contains_key(*k)));
    let show = |v: Option<&serde_json::Value>| v.map_or("(default)".to_string(), |x| x.to_string());
    // Whether the big batch also ran says nothing about the two runs a golden holds.
    keys.filter(|k| !["init", "big_batch"].contains(&k.as_str()))
        .find(|k| g.get(*k) != o.get(*k))
        .map(|k| (format!("--{}", k.replace('_', "-")), show(g.get(k)), show(o.get(k))))
}

/// Now as `YYYY-MM-DDTHH:MM:SSZ` (days-to-civil, Howard Hinnant's algorithm).
fn utc_now() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A golden kept per vendor is read from this vendor's directory; one without it is
    /// refused naming the vendors it has; a golden for every CPU is its own directory.
    #[test]
    fn a_golden_kept_per_vendor_is_read_for_this_cpus_vendor() {
        let t = tempfile::tempdir().unwrap();
        let (one, kept) = (t.path().join("one"), t.path().join("kept"));
        for d in [one.clone(), kept.join("vendor-AuthenticAMD"), kept.join("vendor-GenuineIntel")] {
            std::fs::create_dir_all(d).unwrap();
        }
        assert_eq!(for_vendor(&one, "GenuineIntel").unwrap(), one);
        assert_eq!(for_vendor(&kept, "GenuineIntel").unwrap(), kept.join("vendor-GenuineIntel"));
        assert_eq!(vendors(&kept), ["AuthenticAMD", "GenuineIntel"]);
        let e = for_vendor(&kept, "HygonGenuine").unwrap_err().to_string();
        assert!(e.contains("made on AuthenticAMD and GenuineIntel CPUs only") && e.contains("make_golden.sh vendor"));
    }

    fn platform(mode: KernelMode, cpu: &str, capability: &str, gpu: Option<&str>) -> Platform {
        Platform {
            kernels: KernelFacts {
                mode,
                cpu_capability: capability.into(),
                onednn: mode == KernelMode::Native,
                mkl_cbwr: (mode == KernelMode::Portable).then(|| "COMPATIBLE".into()),
                threads: 1,
            },
            machine: Machine { cpu: cpu.into(), vendor: "V".into(), gpu: gpu.map(Into::into), ..Machine::default() },
        }
    }

    fn meta(p: &Platform) -> GoldenMeta {
        GoldenMeta {
            train: TrainConfig::article(),
            torch_version: LIBTORCH_VERSION.into(),
            dtype: "float32".into(),
            device: "cpu".into(),
            tool_version: None,
            made_by: String::new(),
            date: None,
            sample: None,
            kernels: Some(p.kernels.clone()),
            machine: Some(p.machine.clone()),
        }
    }

    #[test]
    fn portable_goldens_hold_on_any_cpu_native_ones_on_their_own() {
        use KernelMode::*;
        let cpu = DeviceKind::Cpu;
        let (intel, amd) = (platform(Portable, "Xeon", "AVX2", None), platform(Portable, "EPYC", "AVX2", None));
        assert_eq!(check_platform(&meta(&intel), &amd, cpu), Ok(()));
        let native = platform(Native, "Xeon", "AVX512", None);
        assert_eq!(check_platform(&meta(&native), &native, cpu), Ok(()));
        let elsewhere = check_platform(&meta(&native), &platform(Native, "EPYC", "AVX512", None), cpu).unwrap_err();
        assert!(elsewhere.contains("native kernels on another CPU") && elsewhere.contains("Xeon"), "{elsewhere}");
        let mixed = check_platform(&meta(&native), &platform(Portable, "Xeon", "AVX2", None), cpu).unwrap_err();
        assert!(mixed.contains("made with native kernels") && mixed.contains("with portable kernels"), "{mixed}");
    }

    #[test]
    fn cuda_goldens_hold_on_their_gpu_model_only() {
        let h100 = platform(KernelMode::Portable, "Xeon", "AVX2", Some("H100"));
        let h200 = platform(KernelMode::Portable, "Xeon", "AVX2", Some("H200"));
        assert_eq!(check_platform(&meta(&h100), &h100, DeviceKind::Cuda), Ok(()));
        let e = check_platform(&meta(&h100), &h200, DeviceKind::Cuda).unwrap_err();
        assert!(e.contains("GPU H100") && e.contains("H200"), "{e}");
    }

    #[test]
    fn a_header_without_kernels_is_never_bit_comparable() {
        let p = platform(KernelMode::Portable, "Xeon", "AVX2", None);
        let old = GoldenMeta { kernels: None, machine: None, ..meta(&p) };
        assert!(check_platform(&old, &p, DeviceKind::Cpu).unwrap_err().contains("does not say"));
    }
}
