// Command coredns is podnet's slim CoreDNS build: CoreDNS's own server
// (coremain) with only the plugins a podnet DNS server needs, so the binary
// is small, quick to build from the Go module proxy and easy to audit.
//
// Build it with agent/artifacts/build-artifacts.sh; `coredns -plugins` lists what
// is compiled in.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	// The plugins compiled in. Keep this list and directives in step.
	_ "github.com/coredns/coredns/plugin/acl"
	_ "github.com/coredns/coredns/plugin/any"
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/cancel"
	_ "github.com/coredns/coredns/plugin/debug"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/etcd"
	_ "github.com/coredns/coredns/plugin/file" // HPK: a user's Service names (docs/hpk.md)
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/hosts"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/local"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
	_ "github.com/coredns/coredns/plugin/rewrite"
	_ "github.com/coredns/coredns/plugin/whoami"

	// podnet's own: name privacy (plugin/privacy/privacy.go)
	_ "podnet.invalid/coredns/plugin/privacy"
)

// directives is the plugin chain order: the subset of CoreDNS's plugin.cfg
// (v1.15.0) that is compiled in, in plugin.cfg's relative order. A query
// walks the chain in this order whatever the order in the Corefile.
// metadata and dnstap are registered anyway (log and forward import them),
// so they are usable too.
var directives = []string{
	"metadata",
	"cancel",
	"reload",
	"bind",
	"debug",
	"ready",
	"health",
	"prometheus",
	"errors",
	"log",
	"dnstap",
	"local",
	"any",
	"loadbalance",
	"rewrite",
	"acl",
	"privacy", // before cache: a cached answer is checked again for each client
	"cache",
	"hosts",
	"file",
	"etcd",
	"loop",
	"forward",
	"whoami",
}

func init() {
	dnsserver.Directives = directives
}

func main() {
	coremain.Run()
}
