//! Where the runs compute: CPU, or CUDA with one GPU per DDP rank and NCCL between them.
//!
//! Every library is looked for before it is used, because cudarc's loaders panic when one
//! is missing and libtorch's CUDA half (`libtorch_cuda.so`) is not linked into the binary
//! (the linker drops it as unused), so it is opened here, once, when CUDA is wanted.

use std::sync::OnceLock;

use crate::error::{Error, Result};
use crate::spec::{DeviceKind, DeviceRequest};

/// What this machine offers, or why it offers nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// GPUs libtorch sees, or why CUDA cannot be used at all.
    pub gpus: std::result::Result<usize, String>,
    /// NCCL's version (e.g. 22907 for 2.29.7), or why it cannot be loaded.
    pub nccl: std::result::Result<i32, String>,
}

/// The device chosen, and a line for the report saying why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    pub kind: DeviceKind,
    /// CUDA with fewer GPUs than ranks on a machine: the G GPUs the ranks share.
    pub shared_gpus: Option<usize>,
    pub note: String,
}

/// Decides where to run; pure, so every branch is tested without a GPU. `local_ranks` is
/// how many DDP ranks share this machine (each needs its own GPU).
pub fn decide(req: DeviceRequest, local_ranks: usize, probe: impl FnOnce() -> Probe) -> Result<Choice> {
    if req == DeviceRequest::Cpu {
        return Ok(Choice { kind: DeviceKind::Cpu, shared_gpus: None, note: "cpu (--device cpu)".into() });
    }
    let p = probe();
    let why_not = match (&p.gpus, &p.nccl) {
        (Err(why), _) => why.clone(),
        // NCCL refuses two ranks on one GPU: the ranks share the GPUs round-robin and sum
        // through host memory with Open MPI (no NCCL needed). Only when asked for: auto keeps
        // NCCL's one GPU per rank, or the CPU.
        (Ok(n), _) if *n < local_ranks => {
            if req == DeviceRequest::Cuda {
                return Ok(Choice {
                    kind: DeviceKind::Cuda,
                    shared_gpus: Some(*n),
                    note: format!("cuda ({local_ranks} ranks on {n} GPUs, shared; NCCL needs one GPU per rank)"),
                });
            }
            format!("{local_ranks} ranks need {local_ranks} GPUs for NCCL, CUDA sees {n}; --device cuda shares them")
        }
        (Ok(_), Err(why)) => why.clone(),
        (Ok(n), Ok(v)) => {
            let how = if req == DeviceRequest::Auto { "auto: " } else { "" };
            return Ok(Choice {
                kind: DeviceKind::Cuda,
                shared_gpus: None,
                note: format!("cuda ({how}{n} GPUs, NCCL {}, one GPU per rank)", nccl_version_text(*v)),
            });
        }
    };
    match req {
        DeviceRequest::Auto => {
            Ok(Choice { kind: DeviceKind::Cpu, shared_gpus: None, note: format!("cpu (auto: {why_not})") })
        }
        _ => Err(Error::bad_flag(
            "--device",
            format!("cuda was asked for but {why_not}"),
            "run on a machine with NVIDIA GPUs, the driver and NCCL, or pass --device cpu",
        )),
    }
}

/// [`decide`] on this machine.
pub fn resolve(req: DeviceRequest, local_ranks: usize) -> Result<Choice> {
    decide(req, local_ranks, || Probe { gpus: cuda_gpus(), nccl: nccl_version() })
}

/// 22907 -> "2.29.7" (NCCL's encoding since 2.9: major*10000 + minor*100 + patch).
pub fn nccl_version_text(v: i32) -> String {
    format!("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100)
}

/// Loads the NVIDIA driver and libtorch's CUDA half (once), then counts GPUs. Call it
/// before anything asks libtorch about CUDA: libtorch caches its CUDA hooks at the first query.
pub fn cuda_gpus() -> std::result::Result<usize, String> {
    static LOADED: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    LOADED.get_or_init(load_cuda).clone()?;
    match tch::Cuda::device_count() {
        0 => Err("CUDA sees no GPU".into()),
        n => Ok(n as usize),
    }
}

/// The model of GPU `ordinal` ("NVIDIA H100 80GB HBM3"), where CUDA can be used: a
/// golden's header records it, since CUDA kernels give other bits on another GPU model.
pub fn gpu_name(ordinal: i32) -> Option<String> {
    cuda_gpus().ok()?;
    use cudarc::driver::result;
    result::init().ok()?;
    result::device::get_name(result::device::get(ordinal).ok()?).ok()
}

/// The CUDA driver's version ("13.0"), where CUDA can be used.
pub fn cuda_version() -> Option<String> {
    cuda_gpus().ok()?;
    let mut v = 0;
    // SAFETY: libcuda is present (cuda_gpus loaded it); the call writes one int.
    let ok = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) } == cudarc::driver::sys::CUresult::CUDA_SUCCESS;
    ok.then(|| format!("{}.{}", v / 1000, v % 1000 / 10))
}

fn load_cuda() -> std::result::Result<(), String> {
    // SAFETY: only tries to open the library; nothing from it is called.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err("no NVIDIA driver (libcuda.so.1 not found)".into());
    }
    determinism_env();
    open_libtorch_cuda()
}

/// Opens libtorch's CUDA half, which registers its kernels and CUDA hooks with libtorch;
/// it needs no GPU (then libtorch just sees none).
pub fn open_libtorch_cuda() -> std::result::Result<(), String> {
    // RTLD_GLOBAL so libtorch's registries see the CUDA kernels; never unloaded.
    let flags = libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL;
    // SAFETY: libtorch_cuda.so's initialisers only register CUDA kernels with libtorch.
    match unsafe { libloading::os::unix::Library::open(Some(libtorch_cuda()), flags) } {
        Ok(lib) => {
            std::mem::forget(lib);
            Ok(())
        }
        Err(e) => Err(format!("libtorch has no usable CUDA half ({e})")),
    }
}

/// libtorch_cuda.so beside the libtorch this binary was built against.
fn libtorch_cuda() -> std::path::PathBuf {
    let dir = option_env!("DDP_VERIFY_LIBTORCH_LIB").unwrap_or("");
    std::path::Path::new(dir).join("libtorch_cuda.so")
}

/// NCCL's version through cudarc, when the library can be opened.
pub fn nccl_version() -> std::result::Result<i32, String> {
    // SAFETY: only tries to open the library.
    if !unsafe { cudarc::nccl::sys::is_culib_present() } {
        return Err("NCCL not found (no libnccl.so on the library path; scripts/setup.sh links the wheel's)".into());
    }
    cudarc::nccl::result::get_nccl_version().map_err(|e| format!("NCCL refused to report its version ({e:?})"))
}

/// Numerics that decide the bits on a GPU, set unless the user set them: no TF32 in cuBLAS
/// or cuDNN, cuBLAS's deterministic workspace, and one NCCL algorithm and protocol so a
/// sum is added in the same order every run. Child ranks inherit them.
pub const DETERMINISM_ENV: [(&str, &str); 4] = [
    ("NVIDIA_TF32_OVERRIDE", "0"),
    ("CUBLAS_WORKSPACE_CONFIG", ":4096:8"),
    ("NCCL_ALGO", "Ring"),
    ("NCCL_PROTO", "Simple"),
];

fn determinism_env() {
    for (key, value) in DETERMINISM_ENV {
        if std::env::var_os(key).is_none() {
            // Called before any CUDA library has read its environment.
            std::env::set_var(key, value);
        }
    }
}

// libtorch's global context: tch's C API does not reach these switches, so they are called
// by their C++ (Itanium ABI) names in libtorch_cpu, which every process that trains links.
// A member function takes the object as its first argument.
extern "C" {
    #[link_name = "_ZN2at13globalContextEv"]
    fn at_global_context() -> *mut std::ffi::c_void;
    #[link_name = "_ZN2at7Context21setDeterministicCuDNNEb"]
    fn at_set_deterministic_cudnn(ctx: *mut std::ffi::c_void, on: bool);
    #[link_name = "_ZN2at7Context17setBenchmarkCuDNNEb"]
    fn at_set_benchmark_cudnn(ctx: *mut std::ffi::c_void, on: bool);
    #[link_name = "_ZN2at7Context26setDeterministicAlgorithmsEbb"]
    fn at_set_deterministic_algorithms(ctx: *mut std::ffi::c_void, on: bool, warn_only: bool);
    #[link_name = "_ZNK2at7Context18deterministicCuDNNEv"]
    fn at_deterministic_cudnn(ctx: *const std::ffi::c_void) -> bool;
}

/// What `torch.backends.cudnn.deterministic = True`, `benchmark = False` and
/// `torch.use_deterministic_algorithms(True)` set, for this whole process. The forward
/// convolution's own `deterministic` argument does not reach its backward, which reads the
/// global switch: without it two identical resnet18 runs on an H100 differed by 4e-6. An
/// operation with no deterministic CUDA kernel then raises, and is refused (exit 2).
/// Returns whether cuDNN now reads deterministic.
pub fn deterministic_kernels() -> bool {
    // SAFETY: globalContext() returns the process-wide at::Context, alive for the whole
    // process; the setters take it and plain bools, as declared in ATen/Context.h.
    unsafe {
        let ctx = at_global_context();
        at_set_deterministic_cudnn(ctx, true);
        at_set_benchmark_cudnn(ctx, false);
        at_set_deterministic_algorithms(ctx, true, false);
        at_deterministic_cudnn(ctx)
    }
}

/// This process's rank among those on its machine, as the launcher states it.
pub fn local_rank() -> Option<usize> {
    ["OMPI_COMM_WORLD_LOCAL_RANK", "PMIX_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "LOCAL_RANK"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.parse().ok())
}

/// How many ranks share this machine, as the launcher states it.
pub fn local_size() -> Option<usize> {
    ["OMPI_COMM_WORLD_LOCAL_SIZE", "PMIX_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE", "LOCAL_WORLD_SIZE"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.parse().ok())
}

/// `ddp-verify devices`: what this machine offers for `--device`, and what auto picks.
pub fn describe(local_ranks: usize) -> String {
    // SAFETY: only tries to open the library.
    let driver = unsafe { cudarc::driver::sys::is_culib_present() };
    // Opened even without a driver: it shows whether this libtorch has CUDA kernels at all.
    let torch = match open_libtorch_cuda() {
        Ok(()) => match tch::Cuda::device_count() {
            // libtorch's own words on why (without its CUDA half it would say that instead).
            0 => match tch::Tensor::f_zeros([1], (tch::Kind::Float, tch::Device::Cuda(0))) {
                Err(e) => format!("{} loaded, no GPU: {}", libtorch_cuda().display(), first_sentence(&e.to_string())),
                Ok(_) => format!("{} loaded, 0 GPUs visible", libtorch_cuda().display()),
            },
            n => format!("{} loaded, {n} GPUs visible", libtorch_cuda().display()),
        },
        Err(why) => format!("unavailable: {why}"),
    };
    let gpus = cuda_gpus();
    let nccl = nccl_version();
    let auto = match decide(DeviceRequest::Auto, local_ranks, || Probe { gpus, nccl: nccl.clone() }) {
        Ok(c) => c.note,
        Err(e) => e.to_string(),
    };
    let env: Vec<String> = DETERMINISM_ENV.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!(
        "driver:   {}\nlibtorch: {torch}\nnccl:     {}\n--device auto with {local_ranks} ranks: {auto}\n\
         set for CUDA runs unless already set: {}\n",
        if driver { "libcuda found" } else { "not found (libcuda.so.1)" },
        nccl.map(nccl_version_text).unwrap_or_else(|why| format!("unavailable: {why}")),
        env.join(" ")
    )
}

fn first_sentence(text: &str) -> String {
    let text = text.trim_start_matches("Internal torch error: ");
    text.split_inclusive(". ").next().unwrap_or(text).trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(gpus: std::result::Result<usize, &str>, nccl: std::result::Result<i32, &str>) -> Probe {
        Probe { gpus: gpus.map_err(String::from), nccl: nccl.map_err(String::from) }
    }

    #[test]
    fn cpu_is_never_probed() {
        let c = decide(DeviceRequest::Cpu, 2, || panic!("probed")).unwrap();
        assert_eq!(c.kind, DeviceKind::Cpu);
    }

    #[test]
    fn auto_takes_cuda_only_when_everything_is_there() {
        let ok = decide(DeviceRequest::Auto, 2, || probe(Ok(2), Ok(22907))).unwrap();
        assert_eq!(
            (ok.kind, ok.note.as_str()),
            (DeviceKind::Cuda, "cuda (auto: 2 GPUs, NCCL 2.29.7, one GPU per rank)")
        );
        for p in
            [probe(Err("no NVIDIA driver"), Ok(22907)), probe(Ok(1), Ok(22907)), probe(Ok(2), Err("NCCL not found"))]
        {
            let c = decide(DeviceRequest::Auto, 2, || p.clone()).unwrap();
            assert_eq!(c.kind, DeviceKind::Cpu, "{p:?}");
            assert!(c.note.starts_with("cpu (auto: "), "{}", c.note);
        }
    }

    /// More ranks than GPUs: NCCL refuses two ranks on one device, so `--device cuda` shares
    /// the GPUs (with or without NCCL installed); auto stays on the CPU and says why.
    #[test]
    fn cuda_shares_fewer_gpus_than_ranks_and_auto_says_so() {
        for nccl in [Ok(22907), Err("NCCL not found")] {
            let c = decide(DeviceRequest::Cuda, 3, || probe(Ok(1), nccl)).unwrap();
            assert_eq!((c.kind, c.shared_gpus), (DeviceKind::Cuda, Some(1)));
            assert_eq!(c.note, "cuda (3 ranks on 1 GPUs, shared; NCCL needs one GPU per rank)");
        }
        let c = decide(DeviceRequest::Cuda, 2, || probe(Ok(2), Ok(22907))).unwrap();
        assert_eq!(c.shared_gpus, None);
        let c = decide(DeviceRequest::Auto, 2, || probe(Ok(1), Ok(22907))).unwrap();
        assert_eq!(c.kind, DeviceKind::Cpu);
        assert!(c.note.contains("--device cuda shares them"), "{}", c.note);
    }

    #[test]
    fn cuda_refuses_with_the_flag_to_fix() {
        let cases = [
            (probe(Err("no NVIDIA driver"), Ok(22907)), "--device", "no NVIDIA driver"),
            (probe(Ok(2), Err("NCCL not found")), "--device", "NCCL not found"),
        ];
        for (p, flag, words) in cases {
            let e = decide(DeviceRequest::Cuda, 2, || p).unwrap_err();
            assert_eq!(e.exit().code(), 2);
            let text = e.to_string();
            assert!(text.starts_with(flag) && text.contains(words), "{text}");
        }
    }

    #[test]
    fn nccl_versions_read_as_released() {
        assert_eq!(nccl_version_text(22907), "2.29.7");
        assert_eq!(nccl_version_text(21803), "2.18.3");
    }
}
