//! Bakes libtorch's directory into the binary's rpath so `ddp-verify` and the test
//! binaries run without LD_LIBRARY_PATH. torch-sys exports the path as DEP_TCH_LIBTORCH_LIB.
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    if let Ok(lib) = std::env::var("DEP_TCH_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    }
}
