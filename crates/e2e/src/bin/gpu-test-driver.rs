//! `gpu-test-driver`: a TEST COMPONENT standing in for NVIDIA's GPU DRA
//! driver (`gpu.nvidia.com`) on fixture nodes. Never deploy it.
//!
//! NVIDIA's driver needs real GPUs, so the end-to-end suite runs this in its
//! place on the `p5` node: it publishes one device per NVIDIA GPU of the
//! sysfs tree with the attributes NVIDIA's driver publishes that claims pair
//! on (`resource.kubernetes.io/pcieRoot`, `pciBusID`, `numaNode`, computed by
//! `topology` exactly as our drivers compute them), plus `index`, `minor`,
//! `uuid`, `type` and `productName`, and prepares a GPU by handing the
//! container `/dev/nvidiaN` and `/dev/nvidiactl` from `--dev-root` and
//! `NVIDIA_VISIBLE_DEVICES`. Everything else (kubelet plugin, checkpoint,
//! CDI, publishing) is `dra-core`, as in the real drivers.
//!
//! Limits: GPUs are numbered in PCI address order (what the fixtures do; the
//! real driver asks the kernel module); every GPU reports healthy; no
//! sharing, no MIG.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use dra_core::NoExtraArgs;
use dra_core::attributes::{PciPlacement, int, string};
use dra_core::{
    AllocatedDevice, ClaimRef, ContainerEdits, DeviceEdits, DeviceInventory, DeviceNode, Driver,
    DriverConfig, DriverError, HostPaths, ScannedDevice,
};
use k8s_openapi::api::resource::v1::{Device, DeviceAttribute, DeviceCapacity};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use topology::{DeviceKind, PciDevice, SysfsRoot, classify};

const DRIVER_NAME: &str = "gpu.nvidia.com";

/// NVIDIA's driver takes a `GpuConfig`; this stand-in accepts the kind with
/// no fields, so a claim with a config for it fails as strictly as ours.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct GpuConfig {}

impl DriverConfig for GpuConfig {
    const API_VERSIONS: &'static [&'static str] = &["resource.nvidia.com/v1beta1"];
    const KIND: &'static str = "GpuConfig";
}

/// One GPU as found in sysfs.
#[derive(Debug, Clone)]
struct Gpu {
    index: u32,
    pci: PciDevice,
}

impl Gpu {
    fn name(&self) -> String {
        format!("gpu-{}", self.index)
    }

    fn device(&self) -> Device {
        let mut attrs: BTreeMap<String, DeviceAttribute> = BTreeMap::new();
        attrs.insert("type".into(), string("gpu"));
        attrs.insert("index".into(), int(self.index));
        attrs.insert("minor".into(), int(self.index));
        attrs.insert(
            "uuid".into(),
            string(format!(
                "GPU-e2e-{}",
                self.pci.address.to_string().replace([':', '.'], "-")
            )),
        );
        attrs.insert("productName".into(), string(product_name(self.pci.device)));
        PciPlacement::new(
            self.pci.address,
            Some(&self.pci.pcie_root),
            self.pci.numa_node,
        )
        .insert_into(&mut attrs);
        Device {
            name: self.name(),
            attributes: Some(attrs),
            capacity: Some(BTreeMap::from([(
                "memory".to_string(),
                DeviceCapacity {
                    value: Quantity("80Gi".into()),
                    ..Default::default()
                },
            )])),
            ..Default::default()
        }
    }
}

fn product_name(device_id: u16) -> String {
    match device_id {
        0x2330 => "NVIDIA H100 80GB HBM3".into(),
        0x2335 => "NVIDIA H200".into(),
        0x20b0 | 0x20b2 => "NVIDIA A100-SXM4-40GB".into(),
        other => format!("NVIDIA GPU {other:04x}"),
    }
}

/// The PCI tree could not be read.
#[derive(Debug, thiserror::Error)]
#[error("scanning PCI devices under {root}: {source}")]
struct ScanError {
    root: String,
    #[source]
    source: topology::Error,
}

/// Every NVIDIA GPU of the tree, numbered in PCI address order.
fn discover(sysfs: &SysfsRoot) -> Result<Vec<Gpu>, ScanError> {
    let scan = topology::scan(sysfs).map_err(|source| ScanError {
        root: sysfs.path().display().to_string(),
        source,
    })?;
    for e in &scan.errors {
        tracing::warn!(entry = %e.entry, error = %e.error, "unreadable PCI function skipped");
    }
    let mut gpus: Vec<PciDevice> = scan
        .devices
        .into_iter()
        .filter(|d| classify(d) == DeviceKind::NvidiaGpu)
        .collect();
    gpus.sort_by_key(|d| d.address);
    Ok(gpus
        .into_iter()
        .zip(0u32..)
        .map(|(pci, index)| Gpu { index, pci })
        .collect())
}

/// The GPUs by device name, as the last scan found them.
type SharedGpus = Arc<RwLock<BTreeMap<String, Gpu>>>;

/// The node's GPUs as dra-core scans them.
struct GpuInventory {
    sysfs: SysfsRoot,
    dev_root: PathBuf,
    gpus: SharedGpus,
}

impl DeviceInventory for GpuInventory {
    type Flags = NoExtraArgs;
    type Error = ScanError;
    const UEVENT_SUBSYSTEMS: &'static [&'static str] = &["pci"];

    fn open(
        host: &HostPaths,
        _: &NoExtraArgs,
        _: &prometheus::Registry,
    ) -> Result<Self, ScanError> {
        Ok(GpuInventory {
            sysfs: SysfsRoot::new(&host.sysfs_root),
            dev_root: host.dev_root.clone(),
            gpus: SharedGpus::default(),
        })
    }

    fn scan(&mut self) -> Result<Vec<ScannedDevice>, ScanError> {
        let gpus = discover(&self.sysfs)?;
        let devices = gpus
            .iter()
            .map(|g| ScannedDevice::healthy(g.device()))
            .collect();
        *self.gpus.write().unwrap_or_else(|e| e.into_inner()) =
            gpus.into_iter().map(|g| (g.name(), g)).collect();
        Ok(devices)
    }
}

impl dra_core::NodeDriver for GpuInventory {
    type Driver = GpuTestDriver;

    fn driver(&self) -> GpuTestDriver {
        GpuTestDriver {
            dev_root: self.dev_root.clone(),
            gpus: self.gpus.clone(),
        }
    }
}

struct GpuTestDriver {
    dev_root: PathBuf,
    gpus: SharedGpus,
}

impl Driver for GpuTestDriver {
    type Config = GpuConfig;

    async fn prepare(
        &self,
        _claim: &ClaimRef,
        devices: &[AllocatedDevice<GpuConfig>],
    ) -> Result<Vec<DeviceEdits>, DriverError> {
        let gpus = self.gpus.read().unwrap_or_else(|e| e.into_inner());
        let mut indices = Vec::new();
        let mut out = Vec::new();
        for d in devices {
            let gpu = gpus
                .get(&d.device)
                .ok_or_else(|| DriverError::new(format!("no GPU named {}", d.device)))?;
            indices.push(gpu.index.to_string());
            out.push(DeviceEdits {
                device: d.device.clone(),
                edits: ContainerEdits {
                    device_nodes: vec![
                        DeviceNode::under_dev_root(&self.dev_root, format!("nvidia{}", gpu.index)),
                        DeviceNode::under_dev_root(&self.dev_root, "nvidiactl"),
                    ],
                    env: BTreeMap::new(),
                },
            });
        }
        // CDI edits are per device and merged by the runtime: every device
        // of the claim carries the claim-wide list.
        let visible = indices.join(",");
        for e in &mut out {
            e.edits
                .env
                .insert("NVIDIA_VISIBLE_DEVICES".into(), visible.clone());
        }
        Ok(out)
    }
}

fn main() -> std::process::ExitCode {
    dra_core::run::<GpuInventory>(&dra_core::Program {
        binary: "gpu-test-driver",
        version: env!("CARGO_PKG_VERSION"),
        driver_name: DRIVER_NAME,
        device_plugin_resources: &["nvidia.com/gpu"],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use dra_core::NodeDriver;

    /// dra-core's driver conformance suite, on the stand-in for NVIDIA's
    /// driver: the third driver on the SDK behaves as the two shipped ones.
    #[tokio::test]
    async fn the_gpu_test_driver_passes_the_conformance_suite() {
        use dra_core::testing::conformance::{Subject, run};
        run(|dir| {
            let fixture = sysfs_fixtures::generate("p5.48xlarge", &dir.join("host")).unwrap();
            let host = HostPaths {
                sysfs_root: fixture.sys.clone(),
                dev_root: fixture.dev.clone(),
            };
            let mut inventory =
                GpuInventory::open(&host, &NoExtraArgs {}, &prometheus::Registry::new()).unwrap();
            inventory.scan().unwrap();
            Subject {
                driver: inventory.driver(),
                driver_name: DRIVER_NAME,
                cdi_class: "gpu",
                claim_name: "gpu",
                devices: ["gpu-0".into(), "gpu-5".into()],
                good_config: serde_json::json!({
                    "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"
                }),
            }
        })
        .await;
    }

    #[test]
    fn gpus_match_the_fixture_description() {
        for instance in ["p5.48xlarge", "p4d.24xlarge", "trn2.48xlarge"] {
            let dir = tempfile::tempdir().unwrap();
            let fixture = sysfs_fixtures::generate(instance, dir.path()).unwrap();
            let gpus = discover(&SysfsRoot::new(&fixture.sys)).unwrap();
            assert_eq!(gpus.len(), fixture.gpus.len(), "{instance}");
            for (gpu, want) in gpus.iter().zip(&fixture.gpus) {
                assert_eq!(gpu.index, want.index, "{instance}");
                let d = gpu.device();
                let attrs = d.attributes.unwrap();
                let s = |k: &str| attrs[k].string.clone().unwrap();
                assert_eq!(d.name, format!("gpu-{}", want.index));
                assert_eq!(s("resource.kubernetes.io/pcieRoot"), want.pcie_root);
                assert_eq!(s("resource.kubernetes.io/pciBusID"), want.bdf);
                assert_eq!(
                    attrs
                        .get("resource.kubernetes.io/numaNode")
                        .and_then(|a| a.int),
                    want.numa_node.map(i64::from)
                );
            }
        }
    }

    #[tokio::test]
    async fn prepare_gives_the_gpu_node_nvidiactl_and_the_claim_wide_env() {
        let dir = tempfile::tempdir().unwrap();
        let fixture = sysfs_fixtures::generate("p5.48xlarge", dir.path()).unwrap();
        let host = HostPaths {
            sysfs_root: fixture.sys.clone(),
            dev_root: fixture.dev.clone(),
        };
        let mut inventory =
            GpuInventory::open(&host, &NoExtraArgs {}, &prometheus::Registry::new()).unwrap();
        assert_eq!(inventory.scan().unwrap().len(), 8);
        let driver = inventory.driver();
        let claim = ClaimRef {
            namespace: "n".into(),
            name: "c".into(),
            uid: "u".into(),
        };
        let alloc = |device: &str| AllocatedDevice::<GpuConfig> {
            request: "gpu".into(),
            pool: "p5".into(),
            device: device.into(),
            admin_access: false,
            config: None,
        };
        let edits = driver
            .prepare(&claim, &[alloc("gpu-1"), alloc("gpu-6")])
            .await
            .unwrap();
        assert_eq!(edits.len(), 2);
        let nodes: Vec<&str> = edits[1]
            .edits
            .device_nodes
            .iter()
            .map(|n| n.path.as_str())
            .collect();
        assert_eq!(nodes, ["/dev/nvidia6", "/dev/nvidiactl"]);
        assert_eq!(
            edits[1].edits.device_nodes[0].host_path.as_deref(),
            Some(fixture.dev.join("nvidia6").to_str().unwrap())
        );
        for e in &edits {
            assert_eq!(e.edits.env["NVIDIA_VISIBLE_DEVICES"], "1,6");
        }
        let err = driver.prepare(&claim, &[alloc("gpu-9")]).await.unwrap_err();
        assert!(err.message.contains("gpu-9"), "{err}");
    }
}
