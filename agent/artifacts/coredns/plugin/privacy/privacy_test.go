// SPDX-License-Identifier: Apache-2.0

package privacy

// Logic tests with a fake backend and fake clients (the real thing, CoreDNS against etcd
// with clients in network namespaces, is tests/lab/test-coredns.sh); socketUID is tested
// against the kernel.

import (
	"context"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/plugin"
	"github.com/coredns/coredns/plugin/pkg/dnstest"
	"github.com/coredns/coredns/plugin/test"
	"github.com/coredns/coredns/request"
	"github.com/miekg/dns"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

const (
	alice, bob = 4097, 4098
	aliceIP    = "198.18.0.9"
	bobIP      = "198.18.0.20"
	strangerIP = "198.18.0.99" // a pod address etcd knows no owner of
	hostIP     = "198.51.100.7"
)

type soaOnly struct{ plugin.ServiceBackend }

func (soaOnly) Serial(request.Request) uint32 { return 1 }
func (soaOnly) MinTTL(request.Request) uint32 { return 30 }

// backend answers like the etcd plugin for a few names (the same answer for everyone,
// as the cache would), counting its calls.
type backend struct {
	answers map[string][]dns.RR
	calls   int
}

func (b *backend) Name() string { return "fake" }

func (b *backend) ServeDNS(_ context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
	b.calls++
	m := new(dns.Msg)
	m.SetReply(r)
	m.Authoritative = true
	key := strings.ToLower(r.Question[0].Name) + " " + dns.TypeToString[r.Question[0].Qtype]
	rrs, ok := b.answers[key]
	if !ok {
		m.Rcode = dns.RcodeNameError
	}
	m.Answer = rrs
	m.Ns = []dns.RR{test.SOA("lab. 30 IN SOA ns.dns.lab. hostmaster.lab. 1 7200 1800 86400 30")}
	return dns.RcodeSuccess, w.WriteMsg(m)
}

func newTest(t *testing.T) (*Privacy, *backend) {
	t.Helper()
	b := &backend{answers: map[string][]dns.RR{
		"pod0.myjob.alice.lab. A":      {test.A("pod0.myjob.alice.lab. 5 IN A " + aliceIP)},
		"alice.lab. A":                 {test.A("alice.lab. 5 IN A " + aliceIP)},
		"login.login.bob.lab. A":       {test.A("login.login.bob.lab. 5 IN A " + bobIP)},
		"nfs.svc.lab. A":               {test.A("nfs.svc.lab. 5 IN A 198.51.100.10")},
		"web.svc.lab. A":               {test.CNAME("web.svc.lab. 5 IN CNAME pod0.myjob.alice.lab."), test.A("pod0.myjob.alice.lab. 5 IN A " + aliceIP)},
		"9.0.18.198.in-addr.arpa. PTR": {test.PTR("9.0.18.198.in-addr.arpa. 5 IN PTR pod0.myjob.alice.lab.")},
		"*.lab. A": {
			test.A("*.lab. 5 IN A " + aliceIP), test.A("*.lab. 5 IN A " + bobIP),
			test.A("*.lab. 5 IN A 198.51.100.10"),
		},
		"*.lab. TXT":               {test.TXT("*.lab. 5 IN TXT \"alice's notes\"")},
		"lab. A":                   {test.A("lab. 5 IN A " + aliceIP)},
		"0.18.198.in-addr.arpa. A": {test.CNAME("0.18.198.in-addr.arpa. 5 IN CNAME pod0.myjob.alice.lab.")},
		"stale.svc.lab. A":         {test.A("stale.svc.lab. 5 IN A " + strangerIP)},
		// the etcd plugin reads the key /skydns/lab/alice/notes for the label "alice/notes"
		"alice/notes.lab. TXT": {test.TXT("alice/notes.lab. 5 IN TXT \"alice's notes\"")},
	}}
	o := newOwners()
	o.users = map[string]uint32{"alice": alice, "bob": bob, "gone": noVNI}
	for ip, vni := range map[string]uint32{aliceIP: alice, bobIP: bob} {
		o.ips[netip.MustParseAddr(ip)] = vni
	}
	o.synced.Store(true)
	p := &Privacy{
		Next:      b,
		Zones:     []string{"lab.", "18.198.in-addr.arpa."},
		pods:      []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15")},
		adminUIDs: map[uint32]bool{0: true},
		owners:    o,
		backend:   soaOnly{},
		soaZone:   func(string) string { return "" },
		peerUID: func(string, netip.AddrPort, netip.AddrPort) (uint32, error) {
			return 1000, nil // every local socket is a user's
		},
	}
	return p, b
}

func ask(t *testing.T, p *Privacy, from, name string, qtype uint16) *dns.Msg {
	t.Helper()
	req := new(dns.Msg)
	req.SetQuestion(name, qtype)
	rec := dnstest.NewRecorder(&test.ResponseWriter{RemoteIP: from})
	if _, err := p.ServeDNS(context.Background(), rec, req); err != nil {
		t.Fatalf("%s %s from %s: %v", name, dns.TypeToString[qtype], from, err)
	}
	if rec.Msg == nil {
		t.Fatalf("%s from %s: no answer written", name, from)
	}
	return rec.Msg
}

func answers(m *dns.Msg) string {
	var out []string
	for _, rr := range m.Answer {
		f := strings.Fields(rr.String())
		out = append(out, f[len(f)-1])
	}
	return dns.RcodeToString[m.Rcode] + " " + strings.Join(out, " ")
}

func TestViews(t *testing.T) {
	p, _ := newTest(t)
	for _, tc := range []struct {
		from, name string
		qtype      uint16
		want       string
	}{
		{aliceIP, "pod0.myjob.alice.lab.", dns.TypeA, "NOERROR " + aliceIP},
		{aliceIP, "POD0.MyJob.ALICE.lab.", dns.TypeA, "NOERROR " + aliceIP},
		{bobIP, "pod0.myjob.alice.lab.", dns.TypeA, "NXDOMAIN "},
		{bobIP, "POD0.MyJob.ALICE.lab.", dns.TypeA, "NXDOMAIN "},
		{bobIP, "alice.lab.", dns.TypeA, "NXDOMAIN "},
		{bobIP, "alice.lab.", dns.TypeANY, "NXDOMAIN "},
		{bobIP, "alice.lab.", dns.TypeAXFR, "NXDOMAIN "},
		{bobIP, "*.alice.lab.", dns.TypeA, "NXDOMAIN "},
		{bobIP, "9.0.18.198.in-addr.arpa.", dns.TypePTR, "NXDOMAIN "},
		{aliceIP, "9.0.18.198.in-addr.arpa.", dns.TypePTR, "NOERROR pod0.myjob.alice.lab."},
		{bobIP, "*.lab.", dns.TypeA, "NOERROR " + bobIP + " 198.51.100.10"},
		{hostIP, "*.lab.", dns.TypeA, "NOERROR 198.51.100.10"},
		{bobIP, "*.lab.", dns.TypeTXT, "NXDOMAIN "},
		{bobIP, "lab.", dns.TypeA, "NOERROR "}, // the apex exists: NODATA
		{bobIP, "web.svc.lab.", dns.TypeA, "NXDOMAIN "},
		{aliceIP, "web.svc.lab.", dns.TypeA, "NOERROR pod0.myjob.alice.lab. " + aliceIP},
		{bobIP, "0.18.198.in-addr.arpa.", dns.TypeA, "NXDOMAIN "},
		{bobIP, "nfs.svc.lab.", dns.TypeA, "NOERROR 198.51.100.10"},
		{hostIP, "nfs.svc.lab.", dns.TypeA, "NOERROR 198.51.100.10"},
		{strangerIP, "nfs.svc.lab.", dns.TypeA, "NOERROR 198.51.100.10"},
		{hostIP, "pod0.myjob.alice.lab.", dns.TypeA, "NXDOMAIN "},
		{strangerIP, "pod0.myjob.alice.lab.", dns.TypeA, "NXDOMAIN "},
		{aliceIP, "stale.svc.lab.", dns.TypeA, "NXDOMAIN "}, // a pod address nobody owns
		{aliceIP, "x.gone.lab.", dns.TypeA, "NXDOMAIN "},    // a user record deleted: nobody's
		{"127.0.0.1", "pod0.myjob.alice.lab.", dns.TypeA, "NXDOMAIN "},
		// key paths: "/" walks the etcd plugin's keys, escapes hide dots
		{bobIP, "x/../../alice/myjob/pod0.bob.lab.", dns.TypeA, "NXDOMAIN "},
		{bobIP, "pod0.myjob/alice.lab.", dns.TypeA, "NXDOMAIN "},
		{bobIP, "alice/notes.lab.", dns.TypeTXT, "NXDOMAIN "},
		{bobIP, `pod0.myjob.alice\.x.lab.`, dns.TypeA, "NXDOMAIN "},
		{aliceIP, "x/../pod0.myjob.alice.lab.", dns.TypeA, "NXDOMAIN "},
	} {
		if got := answers(ask(t, p, tc.from, tc.name, tc.qtype)); got != tc.want {
			t.Errorf("%s %s from %s: got %q, want %q", tc.name, dns.TypeToString[tc.qtype], tc.from, got, tc.want)
		}
	}
}

func TestDeniedNamesNeverReachTheBackend(t *testing.T) {
	p, b := newTest(t)
	m := ask(t, p, bobIP, "pod0.myjob.alice.lab.", dns.TypeA)
	if b.calls != 0 || m.Rcode != dns.RcodeNameError || len(m.Ns) != 1 || m.Ns[0].Header().Rrtype != dns.TypeSOA {
		t.Fatalf("calls %d, answer %v", b.calls, m)
	}
}

func TestAdmins(t *testing.T) {
	p, _ := newTest(t)
	p.peerUID = func(string, netip.AddrPort, netip.AddrPort) (uint32, error) { return 0, nil }
	if got := answers(ask(t, p, "127.0.0.1", "pod0.myjob.alice.lab.", dns.TypeA)); got != "NOERROR "+aliceIP {
		t.Errorf("root on this host: %q", got)
	}
	// a pod is never an admin, whatever its socket (a pod address is not this host's)
	if got := answers(ask(t, p, bobIP, "pod0.myjob.alice.lab.", dns.TypeA)); got != "NXDOMAIN " {
		t.Errorf("bob's pod: %q", got)
	}
	// an underlay address that is not this host's: no uid to ask the kernel about
	if got := answers(ask(t, p, hostIP, "pod0.myjob.alice.lab.", dns.TypeA)); got != "NXDOMAIN " {
		t.Errorf("another host: %q", got)
	}
	p.adminSources = []netip.Prefix{netip.MustParsePrefix(hostIP + "/32")}
	if got := answers(ask(t, p, hostIP, "pod0.myjob.alice.lab.", dns.TypeA)); got != "NOERROR "+aliceIP {
		t.Errorf("admin source: %q", got)
	}
}

func TestUnsyncedFailsClosed(t *testing.T) {
	p, b := newTest(t)
	p.owners.synced.Store(false)
	req := new(dns.Msg)
	req.SetQuestion("nfs.svc.lab.", dns.TypeA)
	rec := dnstest.NewRecorder(&test.ResponseWriter{RemoteIP: aliceIP})
	rcode, _ := p.ServeDNS(context.Background(), rec, req)
	if rcode != dns.RcodeServerFailure || b.calls != 0 || p.Ready() {
		t.Fatalf("rcode %d, calls %d, ready %v", rcode, b.calls, p.Ready())
	}
}

func TestReverseAddr(t *testing.T) {
	for in, want := range map[string]string{
		"9.0.18.198": "198.18.0.9", "255.255.255.255": "255.255.255.255",
		"0.18.198": "", "1.9.0.18.198": "", "*.0.18.198": "", "09.0.18.198": "",
		"256.0.18.198": "", "a.0.18.198": "", "": "",
	} {
		a, ok := reverseAddr(in)
		got := ""
		if ok {
			got = a.String()
		}
		if got != want {
			t.Errorf("reverseAddr(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestOwnersFollowEvents(t *testing.T) {
	o := newOwners()
	put := func(k, v string) *clientv3.Event {
		return &clientv3.Event{Type: clientv3.EventTypePut, Kv: &mvccpb.KeyValue{Key: []byte(k), Value: []byte(v)}}
	}
	del := func(k string) *clientv3.Event {
		return &clientv3.Event{Type: clientv3.EventTypeDelete, Kv: &mvccpb.KeyValue{Key: []byte(k)}}
	}
	s := "/podnet/lab/"
	o.apply(s, []*clientv3.Event{
		put(s+"ips/198.18.0.9", `{"job_id":5,"node":"c1","vni":4097}`),
		put(s+"ips/198.18.0.20", `{"kind":"login","user":"bob","vni":4098}`),
		put(s+"ips/198.18.0.30", `not json`),
		put(s+"users/Alice", `{"vni":4097,"uid":2001}`),
		put(s+"users/bob", `{"vni":4098}`),
		put(s+"jobs/5", `{"vni":1}`),
	})
	if v, ok := o.ip(netip.MustParseAddr("198.18.0.9")); !ok || v != alice {
		t.Errorf("alice's ip: %d %v", v, ok)
	}
	if _, ok := o.ip(netip.MustParseAddr("198.18.0.30")); ok {
		t.Error("a record without a VNI owns its address")
	}
	if v, ok := o.user("alice"); !ok || v != alice {
		t.Errorf("alice: %d %v", v, ok)
	}
	o.apply(s, []*clientv3.Event{del(s + "ips/198.18.0.9"), del(s + "users/bob")})
	if _, ok := o.ip(netip.MustParseAddr("198.18.0.9")); ok {
		t.Error("deleted address still owned")
	}
	if v, ok := o.user("bob"); !ok || v != noVNI {
		t.Errorf("a deleted user's label must stay private (to nobody): %d %v", v, ok)
	}
}

func TestParse(t *testing.T) {
	for in, ok := range map[string]bool{
		"privacy {\n pods 198.18.0.0/15\n state /podnet/lab\n}":                                   true,
		"privacy lab {\n pods 198.18.0.0/15 10.0.0.0/8\n state /podnet/lab/\n admin_users 0 7\n}": true,
		"privacy {\n pods 198.18.0.0/15\n state /podnet/lab\n admin_sources 198.51.100.2\n}":      true,
		"privacy {\n pods 198.18.0.0/15\n}":                                                       false,
		"privacy {\n state /podnet/lab\n}":                                                        false,
		"privacy {\n pods nonsense\n state /podnet/lab\n}":                                        false,
		"privacy {\n pods 198.18.0.0/15\n state podnet\n}":                                        false,
		"privacy {\n pods 198.18.0.0/15\n state /podnet/lab\n admin_users no-such-user-here\n}":   false,
		"privacy {\n pods 198.18.0.0/15\n state /podnet/lab\n frobnicate 1\n}":                    false,
	} {
		_, err := parse(caddy.NewTestController("dns", in))
		if (err == nil) != ok {
			t.Errorf("%q: err %v", in, err)
		}
	}
	p, err := parse(caddy.NewTestController("dns", "privacy {\n pods 198.18.0.0/15\n state /podnet/lab\n admin_users 7\n}"))
	if err != nil || p.state != "/podnet/lab/" || p.adminUIDs[0] || !p.adminUIDs[7] {
		t.Errorf("parsed %+v, %v", p, err)
	}
}

// socketUID against the kernel: a query's source socket on this host, UDP and TCP.
func TestSocketUIDFindsTheSender(t *testing.T) {
	uid := uint32(os.Getuid())

	srv, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	cl, err := net.DialUDP("udp4", nil, srv.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := cl.Write([]byte("q")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8)
	_, from, err := srv.ReadFromUDPAddrPort(buf)
	if err != nil {
		t.Fatal(err)
	}
	server := srv.LocalAddr().(*net.UDPAddr).AddrPort()
	if got, err := socketUID("udp", from, server); err != nil || got != uid {
		t.Errorf("udp: uid %d, %v; want %d", got, err, uid)
	}
	cl.Close()
	if _, err := socketUID("udp", from, server); err == nil {
		t.Error("udp: a closed socket was found")
	}

	ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	tc, err := net.DialTCP("tcp4", nil, ln.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	sc, err := ln.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	tfrom := sc.RemoteAddr().(*net.TCPAddr).AddrPort()
	tserver := sc.LocalAddr().(*net.TCPAddr).AddrPort()
	if got, err := socketUID("tcp", tfrom, tserver); err != nil || got != uid {
		t.Errorf("tcp: uid %d, %v; want %d", got, err, uid)
	}
}
