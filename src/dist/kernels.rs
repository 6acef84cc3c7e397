//! Pins the CPU kernels this process computes with (`--kernels`), and says which it got.
//!
//! libtorch reads `ATEN_CPU_CAPABILITY` and MKL reads `MKL_CBWR` when they first dispatch,
//! not when the library is loaded, so setting them here works as long as no tensor was made
//! before; [`apply`] checks that ATen took the capability asked for. Every rank applies the
//! mode itself (each parses the same flags), so a user's `mpirun` across hosts gets it too.

use std::sync::OnceLock;

use crate::error::{Error, Result};
use crate::spec::{DeviceKind, KernelFacts, KernelMode, Machine, Platform};

static APPLIED: OnceLock<Platform> = OnceLock::new();

/// Computes in `mode` from now on, in this whole process; returns what it computes with.
/// Applying the same mode again is a no-op; another one is refused (libtorch has chosen).
pub fn apply(mode: KernelMode, device: DeviceKind) -> Result<&'static Platform> {
    if let Some(p) = APPLIED.get() {
        if p.kernels.mode != mode {
            return Err(conflict(&p.kernels.cpu_capability, mode));
        }
        return Ok(p);
    }
    if mode == KernelMode::Portable && !has_avx2_fma() {
        return Err(Error::bad_flag(
            "--kernels",
            "portable kernels need AVX2 and FMA, which this CPU lacks",
            "pass --kernels native (its bits hold on this CPU model only)",
        ));
    }
    for (key, value) in mode.env() {
        // Before any thread of ours or libtorch's reads the environment (see the module doc).
        std::env::set_var(key, value);
    }
    tch::set_num_threads(1);
    set_onednn(mode == KernelMode::Native);
    let capability = cpu_capability();
    if mode.capability().is_some_and(|want| want != capability) {
        return Err(conflict(&capability, mode));
    }
    let platform = Platform {
        kernels: KernelFacts {
            mode,
            cpu_capability: capability,
            onednn: onednn(),
            mkl_cbwr: std::env::var("MKL_CBWR").ok(),
            threads: usize::try_from(tch::get_num_threads()).unwrap_or(1),
        },
        machine: machine(device),
    };
    Ok(APPLIED.get_or_init(|| platform))
}

/// What this process computes with, once [`apply`] ran.
pub fn applied() -> Option<&'static Platform> {
    APPLIED.get()
}

fn conflict(capability: &str, mode: KernelMode) -> Error {
    Error::bad_flag(
        "--kernels",
        format!(
            "libtorch already computes with {capability} kernels in this process, so {} cannot be pinned",
            mode.name()
        ),
        "start a new process for each kernel mode",
    )
}

fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The CPU (and for CUDA the GPU) this process runs on.
pub fn machine(device: DeviceKind) -> Machine {
    let mut m = parse_cpuinfo(&std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default());
    if device == DeviceKind::Cuda {
        m.gpu = super::device::gpu_name(0);
        m.cuda = super::device::cuda_version();
    }
    m
}

/// The first processor's model name and vendor id from `/proc/cpuinfo`'s text.
pub fn parse_cpuinfo(text: &str) -> Machine {
    Machine {
        cpu: first_field(text, "model name").unwrap_or_else(|| "unknown".into()),
        vendor: first_field(text, "vendor_id").unwrap_or_else(|| "unknown".into()),
        ..Machine::default()
    }
}

/// The instruction set oneDNN dispatches to on a CPU with `flags` (`/proc/cpuinfo`'s),
/// as oneDNN names it, capped by `ONEDNN_MAX_CPU_ISA` where that is set: what its kernels
/// would use here with `--kernels native` (the portable mode turns it off).
pub fn onednn_isa(flags: &str, cap: Option<&str>) -> String {
    let has = |f: &str| flags.split_whitespace().any(|x| x == f);
    let ladder = [
        ("AVX10_1_512_AMX_FP16", has("amx_fp16")),
        ("AVX512_CORE_AMX", has("amx_bf16") && has("amx_tile")),
        ("AVX512_CORE_BF16", has("avx512_bf16")),
        ("AVX512_CORE_VNNI", has("avx512_vnni")),
        ("AVX512_CORE", ["avx512f", "avx512bw", "avx512vl", "avx512dq"].iter().all(|f| has(f))),
        ("AVX2", has("avx2")),
        ("SSE41", has("sse4_1")),
    ];
    let best = ladder.iter().position(|(_, on)| *on).unwrap_or(ladder.len() - 1);
    let capped = cap.and_then(|c| ladder.iter().position(|(name, _)| name.eq_ignore_ascii_case(c)));
    let at = capped.map_or(best, |c| c.max(best));
    match capped {
        Some(_) => format!("{} (ONEDNN_MAX_CPU_ISA={})", ladder[at].0, cap.unwrap_or_default()),
        None => ladder[at].0.to_string(),
    }
}

/// This machine's CPU flags, as `/proc/cpuinfo` lists them for its first processor.
pub fn cpu_flags() -> String {
    first_field(&std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default(), "flags").unwrap_or_default()
}

/// A field of the first processor in `/proc/cpuinfo`'s text.
fn first_field(text: &str, key: &str) -> Option<String> {
    let first = text.split("\n\n").next().unwrap_or_default();
    first.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == key).then(|| v.trim().to_string())
    })
}

/// libstdc++'s `std::string` (the C++11 ABI): data pointer, length, inline buffer.
#[repr(C)]
struct CxxString {
    ptr: *const u8,
    len: usize,
    local: [u8; 16],
}

// tch's C API reaches none of these, so they are called by their C++ (Itanium ABI) names in
// libtorch_cpu, as `device::deterministic_kernels` does. `get_cpu_capability` returns a
// `std::string` by value: the caller passes where to build it as a hidden first argument.
extern "C" {
    #[link_name = "_ZN2at18get_cpu_capabilityB5cxx11Ev"]
    fn at_get_cpu_capability(out: *mut CxxString);
    #[link_name = "_ZN2at13globalContextEv"]
    fn at_global_context() -> *mut std::ffi::c_void;
    #[link_name = "_ZN2at7Context20setUserEnabledMkldnnEb"]
    fn at_set_user_enabled_mkldnn(ctx: *mut std::ffi::c_void, on: bool);
    #[link_name = "_ZNK2at7Context17userEnabledMkldnnEv"]
    fn at_user_enabled_mkldnn(ctx: *const std::ffi::c_void) -> bool;
}

/// ATen's CPU capability ("AVX2", "AVX512", "DEFAULT"); fixed for the process by its first call.
pub fn cpu_capability() -> String {
    let mut out = std::mem::MaybeUninit::<CxxString>::uninit();
    // SAFETY: the function constructs a std::string at `out` (32 bytes, laid out as
    // CxxString); its characters are read at once, before `out` moves. The names are a few
    // characters, held in the inline buffer, so nothing is allocated that would leak.
    unsafe {
        at_get_cpu_capability(out.as_mut_ptr());
        let s = out.assume_init_ref();
        String::from_utf8_lossy(std::slice::from_raw_parts(s.ptr, s.len)).into_owned()
    }
}

/// `torch.backends.mkldnn.enabled = on`: off, convolutions and reduced-precision matmuls go
/// to ATen and MKL instead of oneDNN.
fn set_onednn(on: bool) {
    // SAFETY: globalContext() returns the process-wide at::Context, alive for the whole
    // process; the setter takes it and a bool, as declared in ATen/Context.h.
    unsafe { at_set_user_enabled_mkldnn(at_global_context(), on) }
}

pub fn onednn() -> bool {
    // SAFETY: as in `set_onednn`.
    unsafe { at_user_enabled_mkldnn(at_global_context()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn onednn_isa_is_the_best_the_flags_allow_under_the_cap() {
        let spr = "sse4_1 avx2 avx512f avx512bw avx512vl avx512dq avx512_vnni avx512_bf16 amx_bf16 amx_tile";
        assert_eq!(onednn_isa(spr, None), "AVX512_CORE_AMX");
        assert_eq!(onednn_isa(spr, Some("AVX2")), "AVX2 (ONEDNN_MAX_CPU_ISA=AVX2)");
        assert_eq!(
            onednn_isa("sse4_1 avx2 avx512f avx512bw avx512vl avx512dq avx512_vnni avx512_bf16", None),
            "AVX512_CORE_BF16"
        );
        assert_eq!(onednn_isa("sse4_1 avx2", Some("avx512_core")), "AVX2 (ONEDNN_MAX_CPU_ISA=avx512_core)");
        assert_eq!(onednn_isa("", None), "SSE41");
    }

    #[test]
    fn cpuinfo_gives_the_first_processors_model_and_vendor() {
        let text = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8481C\n\
                    flags\t\t: avx2\n\nprocessor\t: 1\nvendor_id\t: Other\n";
        let m = parse_cpuinfo(text);
        assert_eq!((m.cpu.as_str(), m.vendor.as_str()), ("Intel(R) Xeon(R) Platinum 8481C", "GenuineIntel"));
        assert_eq!(parse_cpuinfo("").cpu, "unknown");
    }
}
