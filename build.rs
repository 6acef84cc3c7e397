//! Bakes libtorch's directory into the binary's rpath so `ddp-verify` and the test
//! binaries run without LD_LIBRARY_PATH (torch-sys exports it as DEP_TCH_LIBTORCH_LIB), and
//! records libtorch's version and directory, which goldens are checked against.
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    if let Ok(lib) = std::env::var("DEP_TCH_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
        // src/device.rs opens libtorch_cuda.so from here when CUDA is wanted.
        println!("cargo:rustc-env=DDP_VERIFY_LIBTORCH_LIB={lib}");
    }
    // The wheel's NCCL (nvidia-nccl): cudarc opens `libnccl.so`, which scripts/setup.sh
    // links there, and dlopen searches the binary's rpath.
    if let Ok(dir) = std::env::var("LIBTORCH") {
        let nccl = std::path::Path::new(&dir).join("../nvidia/nccl/lib");
        // Only the build with libtorch opens NCCL; the wheel's binary carries no path of the
        // machine that built it.
        if let (Some(_), Ok(nccl)) = (std::env::var_os("CARGO_FEATURE_LIBTORCH"), nccl.canonicalize()) {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{}", nccl.display());
        }
    }
    // The PyPI wheel's torch/version.py says e.g. `__version__ = '2.13.0+cu130'`.
    let version = std::env::var("LIBTORCH")
        .ok()
        .and_then(|dir| std::fs::read_to_string(std::path::Path::new(&dir).join("version.py")).ok())
        .and_then(|text| {
            let line = text.lines().find(|l| l.starts_with("__version__"))?;
            Some(line.split('\'').nth(1)?.to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    // The wheel's binary links none: reports say so rather than name the build machine's.
    let version = if std::env::var_os("CARGO_FEATURE_LIBTORCH").is_some() { version } else { "none".into() };
    println!("cargo:rustc-env=DDP_VERIFY_LIBTORCH_VERSION={version}");
}
