// Stand-in for sigs.k8s.io/iptables-wrappers, used only by the e2e wrapper
// modules that build Kubernetes 1.38+ (kubelet and kube-proxy import its
// pkg/iptables). The Go module proxy lists v1.0.0 but refuses to serve its
// zip (403 "This module version is not available"), so those builds could
// not resolve it. The generated wrapper go.mod swaps this module in with
// `replace sigs.k8s.io/iptables-wrappers => <path to this directory>` (see
// STAND_INS in crates/local-cluster/src/go_build.rs). It provides the API
// those Kubernetes packages use, with one fixed behaviour: this host has no
// usable iptables. New fails and NewBestEffort returns no clients, so the
// kubelet skips its iptables chains and kube-proxy must run in nftables
// mode. The pure iptables-save/restore text helpers do their real job.
module sigs.k8s.io/iptables-wrappers

go 1.23

// GetChainsFromTable must return k8s.io/utils/set.Set[Chain]: kube-proxy
// diffs it against its own set of that type.
require k8s.io/utils v0.0.0-20260626114624-be93311217bd
