//go:build tools

// Pins CoreDNS v1.15.0, the version kubeadm's DNS addon deploys, for the
// offline kind node image (cargo xtask e2e --cluster kind): the binary is
// built from this module and packed as registry.k8s.io/coredns/coredns:v1.15.0.
package tools

import _ "github.com/coredns/coredns"
