//! Where the runs compute (`--device`) and with which CPU kernels (`--kernels`). The
//! libtorch devices are the library's (`spec::device`, `dist::kernels`).

values! {
    /// `--device`: what the user asked for.
    #[derive(Default)]
    pub enum DeviceRequest {
        /// CUDA when a driver, a GPU for every local rank and NCCL are all present; else CPU
        #[default]
        Auto = "auto",
        Cpu = "cpu",
        /// accumulation on cuda:0, DDP rank r on cuda:<local rank>, NCCL all-reduce
        Cuda = "cuda",
    }
}

values! {
    /// Where both runs compute, as the ranks are told (`--device`, resolved).
    #[derive(Default)]
    pub enum DeviceKind {
        #[default]
        Cpu = "cpu",
        /// The accumulation run on `cuda:0`, DDP rank r on `cuda:<local rank>`.
        Cuda = "cuda",
    }
}

values! {
    /// `--kernels`: which CPU kernels libtorch computes with (see the README's "Where a golden
    /// holds"). libtorch picks its kernels per CPU, each summing in another order, so a run's
    /// bits are bound to the CPU model unless those choices are pinned (`dist::kernels`).
    #[derive(Default)]
    pub enum KernelMode {
        /// ATen's AVX2 kernels, MKL's COMPATIBLE code path, oneDNN off, one thread: the same bits
        /// on every x86-64 CPU with AVX2 and FMA of one vendor (across vendors but MKL's sqrt, exp...)
        #[default]
        Portable = "portable",
        /// what this machine picks, one thread: faster, and bound to its CPU model
        Native = "native",
    }
}

impl KernelMode {
    /// The variables libtorch reads when it first dispatches, as this mode sets them.
    pub fn env(self) -> &'static [(&'static str, &'static str)] {
        match self {
            KernelMode::Portable => &[("ATEN_CPU_CAPABILITY", "avx2"), ("MKL_CBWR", "COMPATIBLE")],
            KernelMode::Native => &[],
        }
    }

    /// The ATen CPU capability this mode requires, if it pins one.
    pub fn capability(self) -> Option<&'static str> {
        match self {
            KernelMode::Portable => Some("AVX2"),
            KernelMode::Native => None,
        }
    }
}
