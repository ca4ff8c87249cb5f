// Package iptables is a stand-in for sigs.k8s.io/iptables-wrappers/pkg/iptables
// with the API that Kubernetes 1.38's kubelet and kube-proxy use. It never
// runs iptables: every host looks like one without iptables support, so New
// always fails and NewBestEffort always returns an empty map. The helpers
// that only transform iptables-save/iptables-restore text (MakeChainLine,
// GetChainsFromTable, ExtractLines, IsNotFoundError) are fully implemented.
package iptables

import (
	"bytes"
	"context"
	"fmt"
	"time"
)

// Protocol is an IP family. Its values equal the Kubernetes v1.IPFamily
// strings, so callers convert between the two with a plain conversion.
type Protocol string

const (
	// ProtocolIPv4 selects iptables (IPv4).
	ProtocolIPv4 Protocol = "IPv4"
	// ProtocolIPv6 selects ip6tables (IPv6).
	ProtocolIPv6 Protocol = "IPv6"
)

// Table names an iptables table.
type Table string

const (
	TableNAT    Table = "nat"
	TableFilter Table = "filter"
	TableMangle Table = "mangle"
)

// Chain names an iptables chain.
type Chain string

const (
	ChainInput       Chain = "INPUT"
	ChainOutput      Chain = "OUTPUT"
	ChainForward     Chain = "FORWARD"
	ChainPrerouting  Chain = "PREROUTING"
	ChainPostrouting Chain = "POSTROUTING"
)

// RulePosition says where EnsureRule puts a rule that is missing; the value
// is the iptables flag that does it.
type RulePosition string

const (
	// Prepend inserts the rule at the head of the chain (iptables -I).
	Prepend RulePosition = "-I"
	// Append adds the rule at the tail of the chain (iptables -A).
	Append RulePosition = "-A"
)

// Mode says how New and NewBestEffort choose the iptables binaries.
type Mode string

const (
	// DetectHostMode picks whichever iptables backend (legacy or nft) the
	// host is already using.
	DetectHostMode Mode = "DetectHost"
	// UseInstalledMode uses the iptables binaries found on PATH as they are.
	UseInstalledMode Mode = "UseInstalled"
)

// Interface is an iptables client for one IP family. This stand-in never
// returns a value of it; the type exists so that callers compile.
type Interface interface {
	// EnsureChain creates chain in table unless it exists; the bool
	// reports whether it already existed.
	EnsureChain(ctx context.Context, table Table, chain Chain) (bool, error)
	// FlushChain removes every rule from chain.
	FlushChain(ctx context.Context, table Table, chain Chain) error
	// DeleteChain deletes chain, which must be empty and unreferenced.
	DeleteChain(ctx context.Context, table Table, chain Chain) error
	// EnsureRule adds the rule given by args to chain at position unless
	// it is there; the bool reports whether it already existed.
	EnsureRule(ctx context.Context, position RulePosition, table Table, chain Chain, args ...string) (bool, error)
	// DeleteRule deletes the rule given by args from chain.
	DeleteRule(ctx context.Context, table Table, chain Chain, args ...string) error
	// IsIPv6 reports whether this client drives ip6tables.
	IsIPv6() bool
	// Protocol returns the IP family this client drives.
	Protocol() Protocol
	// SaveInto appends the iptables-save output for table to buffer.
	SaveInto(ctx context.Context, table Table, buffer *bytes.Buffer) error
	// Restore feeds data, in iptables-restore format, to iptables-restore
	// without flushing tables or restoring counters.
	Restore(ctx context.Context, data []byte) error
	// Monitor creates the canary chain in each of tables and checks every
	// interval that they still exist; when one is gone (something flushed
	// the tables) it recreates them and calls reloadFunc. It returns when
	// ctx is done.
	Monitor(ctx context.Context, canary Chain, tables []Table, reloadFunc func(), interval time.Duration)
}

// notAvailableError is what New returns on every host.
type notAvailableError struct {
	protocol Protocol
}

func (e *notAvailableError) Error() string {
	return fmt.Sprintf("iptables (%s) is not available on this host: this binary was built "+
		"with the aws-dra e2e stand-in for sigs.k8s.io/iptables-wrappers, which never uses "+
		"iptables; run kube-proxy in nftables mode", e.protocol)
}

// New would return an iptables client for protocol; this stand-in always
// returns a nil Interface and an error saying that iptables is not available.
func New(ctx context.Context, protocol Protocol, mode Mode) (Interface, error) {
	return nil, &notAvailableError{protocol: protocol}
}

// NewBestEffort would return a client for each IP family that iptables
// supports on this host; this stand-in always returns an empty, non-nil map.
func NewBestEffort(ctx context.Context, mode Mode) map[Protocol]Interface {
	return map[Protocol]Interface{}
}
