// Command etcd is etcd's own server entry point, built as a wrapper module
// because etcd's main module cannot be installed with `go install`.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
