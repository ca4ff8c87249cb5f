// Command etcd is the etcd server, built from the go.etcd.io/etcd/server/v3
// module for the local end-to-end cluster (crates/e2e).
//
// `go install go.etcd.io/etcd/server/v3@vX` does not work because that module
// carries replace directives, so this wrapper main module requires it and calls
// the same entry point upstream's server/main.go calls.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
