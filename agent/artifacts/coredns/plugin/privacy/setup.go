// SPDX-License-Identifier: Apache-2.0

package privacy

import (
	"errors"
	"net/netip"
	"os/user"
	"strconv"
	"strings"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin"
	"github.com/coredns/coredns/plugin/etcd"
)

func init() { plugin.Register(pluginName, setup) }

// Corefile syntax (in the server block of the etcd plugin):
//
//	privacy [ZONES...] {
//	    pods CIDR...            # the pod network (required)
//	    state PREFIX            # podnet's etcd prefix, /podnet/<cluster>/ (required)
//	    admin_users USER|UID...  # local sockets of these users see every name (default 0)
//	    admin_sources CIDR...   # sources that see every name (default none)
//	}
func setup(c *caddy.Controller) error {
	p, err := parse(c)
	if err != nil {
		return plugin.Error(pluginName, err)
	}
	c.OnStartup(func() error {
		e, ok := dnsserver.GetConfig(c).Handler("etcd").(*etcd.Etcd)
		if !ok || e.Client == nil {
			return plugin.Error(pluginName, errors.New("needs the etcd plugin in its server block"))
		}
		p.backend = e
		p.soaZone = func(name string) string { return plugin.Zones(e.Zones).Matches(name) }
		p.owners.start(e.Client, p.state)
		return nil
	})
	c.OnShutdown(func() error {
		p.owners.stop()
		return nil
	})
	dnsserver.GetConfig(c).AddPlugin(func(next plugin.Handler) plugin.Handler {
		p.Next = next
		return p
	})
	return nil
}

func parse(c *caddy.Controller) (*Privacy, error) {
	p := &Privacy{adminUIDs: map[uint32]bool{0: true}, owners: newOwners(), peerUID: socketUID}
	blocks := 0
	for c.Next() {
		if blocks++; blocks > 1 {
			return nil, plugin.ErrOnce
		}
		p.Zones = plugin.OriginsFromArgsOrServerBlock(c.RemainingArgs(), c.ServerBlockKeys)
		for c.NextBlock() {
			prop := c.Val()
			args := c.RemainingArgs()
			if len(args) == 0 {
				return nil, c.ArgErr()
			}
			switch prop {
			case "pods":
				pfx, err := prefixes(args)
				if err != nil {
					return nil, c.Errf("pods: %v", err)
				}
				p.pods = pfx
			case "admin_sources":
				pfx, err := prefixes(args)
				if err != nil {
					return nil, c.Errf("admin_sources: %v", err)
				}
				p.adminSources = pfx
			case "admin_users":
				p.adminUIDs = map[uint32]bool{}
				for _, a := range args {
					uid, err := uidOf(a)
					if err != nil {
						return nil, c.Errf("admin_users: %v", err)
					}
					p.adminUIDs[uid] = true
				}
			case "state":
				if len(args) != 1 || !strings.HasPrefix(args[0], "/") {
					return nil, c.Errf("state: one etcd prefix starting with /, e.g. /podnet/lab/")
				}
				p.state = strings.TrimSuffix(args[0], "/") + "/"
			default:
				return nil, c.Errf("unknown property %q", prop)
			}
		}
	}
	if len(p.pods) == 0 || p.state == "" {
		return nil, c.Err("pods and state are required")
	}
	return p, nil
}

func prefixes(args []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(args))
	for _, a := range args {
		pfx, err := netip.ParsePrefix(a)
		if err != nil {
			addr, aerr := netip.ParseAddr(a)
			if aerr != nil {
				return nil, err
			}
			pfx = netip.PrefixFrom(addr, addr.BitLen())
		}
		if pfx.Addr().Is4In6() {
			return nil, errors.New(a + ": an IPv4-mapped prefix; write it as IPv4")
		}
		out = append(out, pfx.Masked())
	}
	return out, nil
}

func uidOf(s string) (uint32, error) {
	if n, err := strconv.ParseUint(s, 10, 32); err == nil {
		return uint32(n), nil
	}
	u, err := user.Lookup(s)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(u.Uid, 10, 32)
	return uint32(n), err
}
