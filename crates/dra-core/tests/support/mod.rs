//! What the plugin-socket tests share: a temporary directory that stands in
//! for the node (kubelet's registry and plugin directories, the CDI root, a
//! boot id), a driver with no devices and no configuration, and a kubelet
//! plugin of it started there.
//!
//! Each test crate includes this file as `mod support;` and uses what it
//! needs of it; what one crate leaves unused is not dead code of the suite.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use dra_core::testing::{
    ClaimSource, InMemoryClaimSource, KubeletPlugin, PluginMetrics, PluginOptions, RunningPlugin,
};
use dra_core::{
    AllocatedDevice, ClaimRef, DeviceEdits, Driver, DriverConfig, DriverError, InvalidValue,
    PreparedDevice,
};
use tokio_util::sync::CancellationToken;

/// A configuration nobody sends.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
pub struct NoConfig {}

impl DriverConfig for NoConfig {
    const API_VERSIONS: &'static [&'static str] = &["support.example.com/v1"];
    const KIND: &'static str = "NoConfig";
    fn validate(&self) -> Result<(), InvalidValue> {
        Ok(())
    }
}

/// A driver whose prepare and unprepare succeed and change nothing.
pub struct NoDevices;

impl Driver for NoDevices {
    type Config = NoConfig;
    async fn prepare(
        &self,
        _: &ClaimRef,
        _: &[AllocatedDevice<NoConfig>],
    ) -> Result<Vec<DeviceEdits>, DriverError> {
        Ok(Vec::new())
    }
    async fn unprepare(&self, _: &ClaimRef, _: &[PreparedDevice]) -> Result<(), DriverError> {
        Ok(())
    }
}

/// Plugin options of `driver` (CDI class `class`) with every node path
/// under `root`, and a boot id there unless one was written before (a
/// restart over the same directory keeps its boot).
pub fn node_options(root: &Path, driver: &str, class: &str) -> PluginOptions {
    let boot_id = root.join("boot_id");
    if !boot_id.exists() {
        std::fs::write(&boot_id, "boot-1\n").unwrap();
    }
    let mut o = PluginOptions::new(driver, class);
    o.registrar_dir = root.join("registry");
    o.plugins_dir = root.join("plugins");
    o.cdi_root = root.join("cdi");
    o.boot_id_path = boot_id;
    o
}

/// A running plugin of [`NoDevices`] in its own temporary node directory.
pub struct Plugin {
    pub dir: tempfile::TempDir,
    pub token: CancellationToken,
    pub running: RunningPlugin,
}

impl Plugin {
    pub fn root(&self) -> &Path {
        self.dir.path()
    }
    pub fn cdi_root(&self) -> PathBuf {
        self.root().join("cdi")
    }
    pub fn registration(&self) -> &Path {
        &self.running.sockets.registration
    }
    pub fn dra(&self) -> &Path {
        &self.running.sockets.plugin
    }
}

/// Starts [`NoDevices`] as `driver` over `claims`, with the options
/// [`node_options`] gives and then whatever `configure` changes.
pub async fn start(
    driver: &str,
    class: &str,
    claims: Arc<dyn ClaimSource>,
    configure: impl FnOnce(&mut PluginOptions),
) -> Plugin {
    let dir = tempfile::tempdir().unwrap();
    let mut o = node_options(dir.path(), driver, class);
    configure(&mut o);
    let token = CancellationToken::new();
    let running = KubeletPlugin::new(
        NoDevices,
        claims,
        o,
        PluginMetrics::register(&prometheus::Registry::new()).unwrap(),
    )
    .start(token.clone())
    .await
    .unwrap();
    Plugin {
        dir,
        token,
        running,
    }
}

/// [`start`] with an in-memory API server that knows no claims.
pub async fn start_empty(
    driver: &str,
    class: &str,
    configure: impl FnOnce(&mut PluginOptions),
) -> Plugin {
    start(
        driver,
        class,
        Arc::new(InMemoryClaimSource::new()),
        configure,
    )
    .await
}
