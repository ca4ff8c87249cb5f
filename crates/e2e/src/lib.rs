//! The end-to-end suite of the drivers, on a cluster of real components.
//!
//! The cluster itself (etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler, containerd and kubelets built from their Go modules and run
//! as local processes) is the `local-cluster` crate; its main types are
//! re-exported here. This crate adds what is ours: [`local::LocalTestbed`]
//! runs the drivers on fixture nodes with the charts' RBAC and admission
//! policy, [`chart_testbed`] installs them from the Helm charts instead,
//! [`kind_host`] does the same on kind, and [`scenarios`] holds the
//! end-to-end scenarios, written against the small [`testbed::Testbed`] seam
//! so that every bring-up runs the same ones. The long runs (benchmarks and
//! chaos, the `long-runs` crate) stand on the same testbeds.
//!
//! Limits: root is required (kubelet and containerd manage cgroups and
//! mounts); pods should use `hostNetwork: true` (no CNI network is set up) and
//! `imagePullPolicy: Never` with [`PAUSE_IMAGE`]/[`PROBE_IMAGE`] (no registry).

pub mod chart_testbed;
pub mod charts;
pub mod host_env;
pub mod kind_host;
pub mod local;
pub mod manifests;
pub mod pod_adapt;
pub mod pools;
pub mod scenarios;
pub mod testbed;

pub use chart_testbed::ChartTestbed;
pub use chart_testbed::host::ChartHost;
pub use chart_testbed::local_host::LocalChartHost;
pub use local::LocalTestbed;
// The cluster's main types, where the suite's users have always found them.
pub use local_cluster::{
    Binaries, ClusterConfig, DraFeature, Error, HostProcess, KubernetesVersion, LocalCluster,
    LocalNode, NODE_IP, NodeSpec, PAUSE_IMAGE, PROBE_IMAGE, Release, Result, TeardownReport,
    client_from_kubeconfig,
};
pub use testbed::{DriverKind, Figures, LocalOptions, ManagedTestbed, NodeInfo, Testbed};
