//! Generated gRPC code for the kubelet plugin APIs (`proto/` at the repo root).
//!
//! Generated code is exempt from our lints; the wire contract lives in the
//! `.proto` files.

#![allow(clippy::all, missing_docs, unreachable_pub)]

/// `pluginregistration`: kubelet's plugin watcher talks to this.
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub mod pluginregistration {
    tonic::include_proto!("pluginregistration");
}

/// `k8s.io.kubelet.pkg.apis.dra.v1`: the DRA plugin service, kubelet 1.34+.
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub mod dra_v1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}

/// `k8s.io.kubelet.pkg.apis.dra.v1beta1`: the DRA plugin service, kubelet 1.32+.
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub mod dra_v1beta1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1beta1");
}

/// `v1alpha1`: the DRA device health service.
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub mod health_v1alpha1 {
    tonic::include_proto!("v1alpha1");
}

/// `v1`: the DRA device health service, kubelet 1.37+ (same schema as
/// `v1alpha1`; kubelet 1.37 prefers it).
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub mod health_v1 {
    tonic::include_proto!("v1");
}
