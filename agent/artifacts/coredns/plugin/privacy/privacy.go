// SPDX-License-Identifier: Apache-2.0

// Package privacy is podnet's name privacy, a CoreDNS plugin: a pod gets answers about its
// own user's names and addresses and about the cluster's public names; another user's
// names and PTR records are NXDOMAIN for it, and listings (wildcards, the zone apex,
// partial reverse names) lose every record of another user.
//
// Who asks is the query's source address. Pod addresses are cluster-unique with no NAT,
// and etcd holds the owner of each (`/podnet/<cluster>/ips/<ip>`, followed by one watch:
// owners.go). A source outside the pod network (a node's underlay: system services, but
// also a user's cron job or opt-out step) sees the public names only, unless it is a
// socket of an admin uid on this host (peer.go) or an address the site lists as an admin
// source: those see everything.
//
// Whose a name is: in the cluster zone, the label left of the zone is a user's when
// `/podnet/<cluster>/users/<label>` exists (`pod0.job.alice.lab`: alice's); other labels
// are public (a site's own names). In the reverse zones, `d.c.b.a.in-addr.arpa` is the
// owner's of a.b.c.d when that address is in the pod network. Answers are checked record
// by record (owner name, address, target name) on the way out, so a cached answer for
// alice is checked again for bob: this plugin runs before `cache`.
package privacy

import (
	"context"
	"net"
	"net/netip"
	"strings"

	"github.com/coredns/coredns/plugin"
	"github.com/coredns/coredns/plugin/metrics"
	clog "github.com/coredns/coredns/plugin/pkg/log"
	"github.com/coredns/coredns/request"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

const pluginName = "privacy"

var log = clog.NewWithPlugin(pluginName)

var deniedCount = promauto.NewCounterVec(prometheus.CounterOpts{
	Namespace: plugin.Namespace,
	Subsystem: pluginName,
	Name:      "denied_total",
	Help:      "Queries of non-admin clients answered NXDOMAIN (name: another user's name; answer: nothing of the answer was theirs to see) or SERVFAIL (unsynced: the owners are not read yet).",
}, []string{"server", "reason"})

// Privacy is the plugin.
type Privacy struct {
	Next  plugin.Handler
	Zones []string

	pods         []netip.Prefix
	adminSources []netip.Prefix
	adminUIDs    map[uint32]bool
	state        string

	owners  *owners
	backend plugin.ServiceBackend // the etcd plugin: SOA records like its own
	soaZone func(string) string   // the backend's zone of a name
	peerUID func(network string, client, server netip.AddrPort) (uint32, error)
}

// view is what a client may see: everything (admin), its user's names and the public
// ones (user, with the user's VNI), or the public names only.
type view struct {
	admin bool
	user  bool
	vni   uint32
}

type kind int

const (
	public  kind = iota // a name of the site (not under a user label)
	owned               // a user's name, or a pod address's reverse name
	listing             // a wildcard label where a user label would be, a partial reverse name
	apex                // a zone's own name (exists for everyone)
	denied              // unanswerable for non-admins (a "/" or an escape in the name)
)

type class struct {
	kind  kind
	vni   uint32
	known bool // owned: the owner is known (an unknown pod address is nobody's to see)
}

// Name implements plugin.Handler.
func (p *Privacy) Name() string { return pluginName }

// Ready implements ready.Readiness: ready once the owners are read from etcd.
func (p *Privacy) Ready() bool { return p.owners.synced.Load() }

// ServeDNS implements plugin.Handler.
func (p *Privacy) ServeDNS(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
	if len(r.Question) != 1 {
		return plugin.NextOrFailure(p.Name(), p.Next, ctx, w, r)
	}
	state := request.Request{W: w, Req: r}
	qname := state.Name()
	zone := plugin.Zones(p.Zones).Matches(qname)
	if zone == "" {
		return plugin.NextOrFailure(p.Name(), p.Next, ctx, w, r)
	}
	v := p.viewOf(w)
	if v.admin {
		return plugin.NextOrFailure(p.Name(), p.Next, ctx, w, r)
	}
	if !p.owners.synced.Load() {
		// fail closed: nothing is known about who owns what yet
		deniedCount.WithLabelValues(metrics.WithServer(ctx), "unsynced").Inc()
		return dns.RcodeServerFailure, nil
	}
	p.owners.mu.RLock()
	c := p.classify(qname, zone)
	p.owners.mu.RUnlock()
	if c.kind == denied || (c.kind == owned && !v.sees(c)) {
		deniedCount.WithLabelValues(metrics.WithServer(ctx), "name").Inc()
		return p.negative(ctx, state, dns.RcodeNameError)
	}
	fw := &filterWriter{ResponseWriter: w, p: p, ctx: ctx, state: state, view: v, kind: c.kind}
	return plugin.NextOrFailure(p.Name(), p.Next, ctx, fw, r)
}

func (v view) sees(c class) bool {
	return v.user && c.known && c.vni == v.vni
}

// viewOf tells who asks from the query's source address.
func (p *Privacy) viewOf(w dns.ResponseWriter) view {
	src, network := addrPort(w.RemoteAddr())
	if !src.IsValid() {
		return view{}
	}
	a := src.Addr()
	for _, pfx := range p.pods {
		if pfx.Contains(a) {
			p.owners.mu.RLock()
			vni, ok := p.owners.ip(a)
			p.owners.mu.RUnlock()
			return view{user: ok, vni: vni}
		}
	}
	for _, pfx := range p.adminSources {
		if pfx.Contains(a) {
			return view{admin: true}
		}
	}
	dst, _ := addrPort(w.LocalAddr())
	if dst.IsValid() && (a.IsLoopback() || a == dst.Addr()) && p.peerUID != nil {
		// a socket of this host: its owner's uid, from the kernel
		uid, err := p.peerUID(network, src, dst)
		if err == nil && p.adminUIDs[uid] {
			return view{admin: true}
		}
	}
	return view{}
}

func addrPort(a net.Addr) (netip.AddrPort, string) {
	var ap netip.AddrPort
	network := ""
	switch x := a.(type) {
	case *net.UDPAddr:
		ap, network = x.AddrPort(), "udp"
	case *net.TCPAddr:
		ap, network = x.AddrPort(), "tcp"
	default:
		return netip.AddrPort{}, ""
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), network
}

// classify tells whose a (lower-case, fully qualified) name of zone is; the caller holds
// owners.mu (read).
func (p *Privacy) classify(name, zone string) class {
	if strings.ContainsAny(name, "/\\") {
		// the etcd plugin joins labels into a key path: "x/../../alice" under bob's label
		// would walk into alice's records; an escaped character (a dot in a label) too
		return class{kind: denied}
	}
	if name == zone {
		return class{kind: apex}
	}
	if rest, ok := strings.CutSuffix(name, ".in-addr.arpa."); ok {
		a, ok := reverseAddr(rest)
		if !ok {
			return class{kind: listing}
		}
		if !p.inPods(a) {
			return class{kind: public}
		}
		vni, known := p.owners.ip(a)
		return class{kind: owned, vni: vni, known: known}
	}
	rest := strings.TrimSuffix(name[:len(name)-len(zone)], ".")
	label := rest[strings.LastIndexByte(rest, '.')+1:]
	if label == "*" || label == "any" { // the etcd plugin's wildcards
		return class{kind: listing}
	}
	if vni, ok := p.owners.user(label); ok {
		return class{kind: owned, vni: vni, known: vni != noVNI}
	}
	return class{kind: public}
}

func (p *Privacy) inPods(a netip.Addr) bool {
	for _, pfx := range p.pods {
		if pfx.Contains(a) {
			return true
		}
	}
	return false
}

// reverseAddr reads "d.c.b.a" (four decimal labels) as the address a.b.c.d.
func reverseAddr(s string) (netip.Addr, bool) {
	parts := strings.Split(s, ".")
	if len(parts) != 4 {
		return netip.Addr{}, false
	}
	var b [4]byte
	for i, part := range parts {
		if part == "" || len(part) > 3 || (len(part) > 1 && part[0] == '0') {
			return netip.Addr{}, false
		}
		n := 0
		for _, ch := range part {
			if ch < '0' || ch > '9' {
				return netip.Addr{}, false
			}
			n = n*10 + int(ch-'0')
		}
		if n > 255 {
			return netip.Addr{}, false
		}
		b[3-i] = byte(n)
	}
	return netip.AddrFrom4(b), true
}

// negative answers NXDOMAIN (or NODATA) as the etcd plugin does, with its SOA.
func (p *Privacy) negative(ctx context.Context, state request.Request, rcode int) (int, error) {
	m := new(dns.Msg)
	m.SetRcode(state.Req, rcode)
	m.Authoritative = true
	m.Ns = p.soa(ctx, state)
	if err := state.W.WriteMsg(m); err != nil {
		return dns.RcodeServerFailure, err
	}
	return rcode, nil
}

func (p *Privacy) soa(ctx context.Context, state request.Request) []dns.RR {
	zone := p.soaZone(state.Name())
	if zone == "" {
		zone = plugin.Zones(p.Zones).Matches(state.Name())
	}
	rrs, _ := plugin.SOA(ctx, p.backend, zone, state, plugin.Options{})
	return rrs
}

// allowed tells whether a non-admin client may see one record; the caller holds
// owners.mu (read). In a listing's answer every record carries the query's name, so
// only records whose data names their owner stay (addresses, target names, SOA).
func (p *Privacy) allowed(rr dns.RR, v view, k kind) bool {
	h := rr.Header()
	if h.Rrtype == dns.TypeOPT {
		return true
	}
	if !p.nameAllowed(h.Name, v, false) {
		return false
	}
	switch x := rr.(type) {
	case *dns.A:
		return p.addrAllowed(x.A, v)
	case *dns.AAAA:
		return p.addrAllowed(x.AAAA, v)
	case *dns.CNAME:
		return p.nameAllowed(x.Target, v, true)
	case *dns.DNAME:
		return p.nameAllowed(x.Target, v, true)
	case *dns.PTR:
		return p.nameAllowed(x.Ptr, v, true)
	case *dns.NS:
		return p.nameAllowed(x.Ns, v, true)
	case *dns.MX:
		return p.nameAllowed(x.Mx, v, true)
	case *dns.SRV:
		return p.nameAllowed(x.Target, v, true)
	case *dns.SOA:
		return true
	}
	return k != listing && k != apex
}

// nameAllowed: a name outside the zones, public, an apex, or the client's own; a
// listing's name is allowed as a record's owner (its data decides), never as a target.
func (p *Privacy) nameAllowed(name string, v view, target bool) bool {
	name = strings.ToLower(dns.Fqdn(name))
	zone := plugin.Zones(p.Zones).Matches(name)
	if zone == "" {
		return true
	}
	c := p.classify(name, zone)
	switch c.kind {
	case owned:
		return v.sees(c)
	case denied:
		return false
	case listing:
		return !target
	}
	return true
}

func (p *Privacy) addrAllowed(ip net.IP, v view) bool {
	a, ok := netip.AddrFromSlice(ip)
	if !ok {
		return false
	}
	a = a.Unmap()
	if !p.inPods(a) {
		return true
	}
	vni, known := p.owners.ip(a)
	return v.sees(class{kind: owned, vni: vni, known: known})
}

// filter returns m, or a copy without the records v may not see; an answer left with
// nothing becomes NXDOMAIN (NODATA at a zone's apex, which exists for everyone).
func (p *Privacy) filter(ctx context.Context, state request.Request, v view, k kind, m *dns.Msg) *dns.Msg {
	p.owners.mu.RLock()
	answer := p.keep(m.Answer, v, k)
	ns := p.keep(m.Ns, v, k)
	extra := p.keep(m.Extra, v, k)
	p.owners.mu.RUnlock()
	if len(answer) == len(m.Answer) && len(ns) == len(m.Ns) && len(extra) == len(m.Extra) {
		return m
	}
	out := new(dns.Msg)
	*out = *m // shallow: the sections are new slices, the records are shared read-only
	out.Answer, out.Ns, out.Extra = answer, ns, extra
	if len(m.Answer) > 0 && len(answer) == 0 {
		deniedCount.WithLabelValues(metrics.WithServer(ctx), "answer").Inc()
		out.Rcode = dns.RcodeNameError
		if k == apex {
			out.Rcode = dns.RcodeSuccess
		}
		out.Ns = p.soa(ctx, state)
		out.Extra = nil
		for _, rr := range extra {
			if rr.Header().Rrtype == dns.TypeOPT {
				out.Extra = append(out.Extra, rr)
			}
		}
	}
	return out
}

// keep returns rrs itself when v may see all of them, else a new slice of those it may.
func (p *Privacy) keep(rrs []dns.RR, v view, k kind) []dns.RR {
	for i, rr := range rrs {
		if p.allowed(rr, v, k) {
			continue
		}
		out := append(make([]dns.RR, 0, len(rrs)-1), rrs[:i]...)
		for _, rr := range rrs[i+1:] {
			if p.allowed(rr, v, k) {
				out = append(out, rr)
			}
		}
		return out
	}
	return rrs
}

// filterWriter checks an answer on its way to a non-admin client.
type filterWriter struct {
	dns.ResponseWriter
	p     *Privacy
	ctx   context.Context
	state request.Request
	view  view
	kind  kind
}

// WriteMsg implements dns.ResponseWriter.
func (f *filterWriter) WriteMsg(m *dns.Msg) error {
	return f.ResponseWriter.WriteMsg(f.p.filter(f.ctx, f.state, f.view, f.kind, m))
}

// Write implements dns.ResponseWriter: a packed answer is unpacked and checked too.
func (f *filterWriter) Write(b []byte) (int, error) {
	m := new(dns.Msg)
	if err := m.Unpack(b); err != nil {
		return 0, err
	}
	if err := f.WriteMsg(m); err != nil {
		return 0, err
	}
	return len(b), nil
}
