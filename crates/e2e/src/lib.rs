//! A local Kubernetes cluster for end-to-end tests, run as plain processes.
//!
//! [`toolchain`] builds (or finds) the real components from their Go modules;
//! [`LocalCluster`] starts etcd, kube-apiserver, kube-controller-manager and
//! kube-scheduler on loopback with generated certificates, then one containerd
//! and one real kubelet per node, each fully separated (own root dir, sockets,
//! ports, cgroup root, node certificate). Every process runs in its own process
//! group and is killed by pid on drop, on panic and on Ctrl-C/SIGTERM.
//!
//! On top of it, [`local::LocalTestbed`] runs the drivers on fixture nodes
//! with the charts' RBAC and admission policy, and [`scenarios`] holds the
//! end-to-end scenarios, written against the small [`testbed::Testbed`]
//! seam so that another bring-up (kind) can reuse them.
//!
//! Limits: root is required (kubelet and containerd manage cgroups and
//! mounts); pods should use `hostNetwork: true` (no CNI network is set up) and
//! `imagePullPolicy: Never` with [`PAUSE_IMAGE`]/[`PROBE_IMAGE`] (no registry).

pub mod bench;
mod cgroups;
pub mod chaos;
pub mod chart_testbed;
pub mod charts;
pub mod cluster;
pub mod cluster_config;
mod cluster_outage;
mod cluster_restart;
mod control_plane;
pub mod error;
pub mod go_build;
pub mod host_env;
pub mod image;
pub mod kind_host;
pub mod local;
pub mod manifests;
mod node;
pub mod paths;
pub mod pki;
pub mod pod_adapt;
pub mod pools;
pub mod ports;
pub mod process;
pub mod scenarios;
pub mod testbed;
pub mod toolchain;
pub mod versions;

pub use chart_testbed::ChartTestbed;
pub use chart_testbed::host::ChartHost;
pub use chart_testbed::local_host::LocalChartHost;
pub use cluster::{
    ClusterConfig, HostProcess, LocalCluster, NODE_IP, NodeSpec, TeardownReport,
    client_from_kubeconfig,
};
pub use error::{Error, Result};
pub use local::LocalTestbed;
pub use node::LocalNode;
pub use testbed::{DriverKind, Figures, LocalOptions, ManagedTestbed, NodeInfo, Testbed};
pub use toolchain::{Binaries, PAUSE_IMAGE, PROBE_IMAGE};
pub use versions::{DraFeature, KubernetesVersion, Release};
