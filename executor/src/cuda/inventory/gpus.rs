//! Each GPU as the driver and the PCI bus describe it: name, compute capability, memory,
//! multiprocessors, and the PCIe link (generation speed and width, from sysfs by the bus id
//! the driver gives). Called only after the probe found a working driver and devices.

use cudarc::driver::{result, sys};
use serde::Serialize;

use crate::cuda::device::CudaDeviceInfo;

/// A PCIe link's current and maximum speed and width, as sysfs writes them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PcieLink {
    /// e.g. `32.0 GT/s PCIe`.
    pub speed: String,
    /// Lanes, e.g. 16.
    pub width: u32,
    /// e.g. `32.0 GT/s PCIe`.
    pub max_speed: String,
    /// Lanes.
    pub max_width: u32,
}

/// One GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuReport {
    /// Ordinal (`CUDA_VISIBLE_DEVICES` numbering).
    pub ordinal: usize,
    /// Name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// Compute capability, e.g. `9.0`.
    pub compute_capability: String,
    /// Whether dsplan's kernels run on it (sm_80 or newer).
    pub supported: bool,
    /// Memory in bytes.
    pub total_memory: u64,
    /// Streaming multiprocessors (`None`: the driver did not say).
    pub multiprocessors: Option<u32>,
    /// PCI bus id, e.g. `0000:19:00.0`.
    pub pci_bus_id: Option<String>,
    /// The PCIe link (`None`: sysfs has no entry for the bus id, as in some VMs).
    pub pcie_link: Option<PcieLink>,
}

/// The reports of `devices`.
pub fn describe(devices: &[CudaDeviceInfo]) -> Vec<GpuReport> {
    devices
        .iter()
        .map(|device| {
            let pci_bus_id = pci_bus_id(device.ordinal);
            GpuReport {
                ordinal: device.ordinal,
                name: device.name.clone(),
                compute_capability: format!("{}.{}", device.arch.major, device.arch.minor),
                supported: device.arch.is_supported(),
                total_memory: device.total_memory,
                multiprocessors: attribute(
                    device.ordinal,
                    sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                )
                .map(|n| n as u32),
                pcie_link: pci_bus_id.as_deref().and_then(read_pcie_link),
                pci_bus_id,
            }
        })
        .collect()
}

fn attribute(ordinal: usize, which: sys::CUdevice_attribute) -> Option<i32> {
    let device = result::device::get(ordinal as i32).ok()?;
    // SAFETY: `device` is a handle the initialised driver returned.
    unsafe { result::device::get_attribute(device, which) }.ok()
}

/// `domain:bus:device.0` from the driver's attributes.
fn pci_bus_id(ordinal: usize) -> Option<String> {
    use sys::CUdevice_attribute as A;
    let domain = attribute(ordinal, A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?;
    let bus = attribute(ordinal, A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?;
    let device = attribute(ordinal, A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?;
    Some(format!("{domain:04x}:{bus:02x}:{device:02x}.0"))
}

/// The link of `bus_id` from `/sys/bus/pci/devices/<bus_id>/`.
fn read_pcie_link(bus_id: &str) -> Option<PcieLink> {
    let dir = std::path::Path::new("/sys/bus/pci/devices").join(bus_id);
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
    parse_pcie_link(
        &read("current_link_speed")?,
        &read("current_link_width")?,
        &read("max_link_speed")?,
        &read("max_link_width")?,
    )
}

/// A link from sysfs's four files' contents.
pub fn parse_pcie_link(
    speed: &str,
    width: &str,
    max_speed: &str,
    max_width: &str,
) -> Option<PcieLink> {
    Some(PcieLink {
        speed: speed.trim().to_string(),
        width: width.trim().parse().ok()?,
        max_speed: max_speed.trim().to_string(),
        max_width: max_width.trim().parse().ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysfs_link_files_parse() {
        let link =
            parse_pcie_link("32.0 GT/s PCIe\n", "16\n", "32.0 GT/s PCIe\n", "16\n").expect("link");
        assert_eq!(link.width, 16);
        assert_eq!(link.speed, "32.0 GT/s PCIe");
        assert!(parse_pcie_link("x", "wide", "y", "16").is_none());
    }
}
