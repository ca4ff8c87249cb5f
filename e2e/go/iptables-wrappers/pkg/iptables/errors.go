package iptables

import "strings"

// notFoundMessages are fragments of the messages iptables-legacy and
// iptables-nft print when an operation names a chain, target, match or rule
// that does not exist.
var notFoundMessages = []string{
	// Unknown chain or target (legacy; nft for -X).
	"No chain/target/match by that name",
	// Unknown jump target or module; older iptables-nft for unknown chains.
	"No such file or directory",
	// -C/-D of a rule that is not there.
	"does a matching rule exist",
	// iptables-nft 1.8.2 for unknown chains.
	"does not exist",
}

// IsNotFoundError reports whether err is iptables saying that a chain or
// rule it was asked about does not exist. It matches the text of the error,
// so it is only good for deciding whether an error is worth logging. A nil
// error is not a not-found error.
func IsNotFoundError(err error) bool {
	if err == nil {
		return false
	}
	msg := err.Error()
	for _, fragment := range notFoundMessages {
		if strings.Contains(msg, fragment) {
			return true
		}
	}
	return false
}

// ParseError is the error Interface.Restore returns when iptables-restore
// rejects a line of its input; pass Line to ExtractLines to show the input
// around it.
type ParseError interface {
	error
	// Line is the number of the rejected line; the first line is 1.
	Line() int
}
