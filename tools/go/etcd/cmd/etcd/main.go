// Command etcd is the etcd server, identical to the upstream etcd binary
// (go.etcd.io/etcd/server/v3/main.go calls etcdmain.Main the same way).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
