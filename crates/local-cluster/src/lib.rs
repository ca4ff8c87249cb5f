//! A Kubernetes cluster of real components, run as plain local processes.
//!
//! [`toolchain`] builds (or finds) the components from their Go modules at the
//! versions [`versions`] pins, with caches under `~/.cache/aws-dra`;
//! [`LocalCluster`] starts etcd, kube-apiserver, kube-controller-manager and
//! kube-scheduler on loopback with generated certificates ([`pki`]), then one
//! containerd and one real kubelet per node, each fully separated (own root
//! dir, sockets, ports, cgroup root, node certificate, generated sysfs/dev
//! fixture tree). Every process runs in its own process group and is killed by
//! pid on drop, on panic and on Ctrl-C/SIGTERM ([`process`]).
//!
//! This crate knows nothing of our drivers, charts or scenarios: it is the
//! bring-up that the `e2e` crate (the `Testbed`, the scenarios) and the long
//! runs (benchmarks, chaos) stand on, and that `cargo xtask k8s` and
//! `cargo xtask demo` use. Its modules import only each other.
//!
//! Limits: root is required (kubelet and containerd manage cgroups and
//! mounts); pods should use `hostNetwork: true` (each node has a bridge
//! network of its own, the `cni` module, which reaches the host but not
//! Services) and
//! `imagePullPolicy: Never` with [`PAUSE_IMAGE`]/[`PROBE_IMAGE`] (no registry).

mod cgroups;
pub mod cluster;
pub mod cluster_config;
mod cluster_outage;
mod cluster_restart;
mod cni;
mod control_plane;
pub mod error;
pub mod go_build;
pub mod go_stand_ins;
pub mod go_toolchain;
pub mod host_limits;
pub mod image;
mod kubelet_socket;
pub mod node;
pub mod paths;
pub mod pki;
pub mod ports;
pub mod process;
mod stale_state;
pub mod toolchain;
pub mod versions;

pub use cluster::{
    ClusterConfig, HostProcess, LocalCluster, NODE_IP, NodeSpec, TeardownReport,
    client_from_kubeconfig,
};
pub use error::{Error, Result};
pub use node::LocalNode;
pub use toolchain::{Binaries, PAUSE_IMAGE, PROBE_IMAGE};
pub use versions::{DraFeature, KubernetesVersion, Release};
