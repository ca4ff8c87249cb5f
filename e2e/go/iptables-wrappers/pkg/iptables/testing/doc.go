// Package testing is an empty placeholder for the package of the same path
// in sigs.k8s.io/iptables-wrappers, which holds a fake iptables for unit
// tests. Kubernetes' pkg/proxy/iptables and pkg/proxy/ipvs tests import it,
// and `go mod tidy` in a wrapper module that builds kube-proxy resolves the
// imports of those tests too, so the path must exist in this stand-in. We
// never build Kubernetes' tests, so it declares nothing.
package testing
