//! Where the runs compute: the libtorch device of what `--device` resolved to.

use super::DeviceKind;

/// Where the accumulation run's tensors live.
pub fn accumulation_device(kind: DeviceKind) -> tch::Device {
    match kind {
        DeviceKind::Cpu => tch::Device::Cpu,
        DeviceKind::Cuda => tch::Device::Cuda(0),
    }
}
