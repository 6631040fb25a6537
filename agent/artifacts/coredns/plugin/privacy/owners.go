// SPDX-License-Identifier: Apache-2.0

package privacy

import (
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// owners is podnet's ownership of addresses and user labels, followed from etcd:
// `<state>ips/<ip>` = {"vni": N, ...} (every pod address: job, login, container) and
// `<state>users/<user>` = {"vni": N, ...} (the user's network, for ever). Two users are
// the same user when their VNIs are equal. One Get at a revision, then one watch from
// the next revision; a lost watch (compaction, leader loss) starts over.
type owners struct {
	mu    sync.RWMutex
	ips   map[netip.Addr]uint32
	users map[string]uint32

	synced atomic.Bool
	cancel context.CancelFunc
	done   chan struct{}
}

// noVNI marks a user label whose record was deleted; VNIs are 24-bit, so no user has it.
const noVNI = ^uint32(0)

func newOwners() *owners {
	return &owners{ips: map[netip.Addr]uint32{}, users: map[string]uint32{}}
}

// ip is the VNI of the user owning a pod address; the caller holds mu (read).
func (o *owners) ip(a netip.Addr) (uint32, bool) {
	v, ok := o.ips[a]
	return v, ok
}

// user is the VNI of a user label (lower case); the caller holds mu (read).
func (o *owners) user(label string) (uint32, bool) {
	v, ok := o.users[label]
	return v, ok
}

func (o *owners) start(cli *clientv3.Client, state string) {
	ctx, cancel := context.WithCancel(context.Background())
	o.cancel = cancel
	o.done = make(chan struct{})
	go func() {
		defer close(o.done)
		o.run(ctx, cli, state)
	}()
}

func (o *owners) stop() {
	if o.cancel == nil {
		return
	}
	o.cancel()
	<-o.done
	o.cancel = nil
}

func (o *owners) run(ctx context.Context, cli *clientv3.Client, state string) {
	pause := 100 * time.Millisecond
	for ctx.Err() == nil {
		rev, err := o.load(ctx, cli, state)
		if err != nil {
			if ctx.Err() == nil {
				log.Warningf("reading %s{ips,users}/ from etcd: %v (retrying)", state, err)
			}
			select {
			case <-ctx.Done():
			case <-time.After(pause):
			}
			pause = min(2*pause, 5*time.Second)
			continue
		}
		pause = 100 * time.Millisecond
		err = o.follow(ctx, cli, state, rev)
		if ctx.Err() == nil {
			log.Warningf("watch of %s{ips,users}/ ended: %v (reading again)", state, err)
		}
	}
}

// load replaces both maps with etcd's view at one revision and returns that revision.
func (o *owners) load(ctx context.Context, cli *clientv3.Client, state string) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ipr, err := cli.Get(ctx, state+"ips/", clientv3.WithPrefix())
	if err != nil {
		return 0, err
	}
	rev := ipr.Header.Revision
	ur, err := cli.Get(ctx, state+"users/", clientv3.WithPrefix(), clientv3.WithRev(rev))
	if err != nil {
		return 0, err
	}
	ips := make(map[netip.Addr]uint32, len(ipr.Kvs))
	for _, kv := range ipr.Kvs {
		if a, ok := ipKey(string(kv.Key), state); ok {
			if v, ok := vniOf(kv.Value); ok {
				ips[a] = v
			}
		}
	}
	users := make(map[string]uint32, len(ur.Kvs))
	for _, kv := range ur.Kvs {
		if u, ok := userKey(string(kv.Key), state); ok {
			if v, ok := vniOf(kv.Value); ok {
				users[u] = v
			}
		}
	}
	o.mu.Lock()
	o.ips, o.users = ips, users
	o.mu.Unlock()
	o.synced.Store(true)
	return rev, nil
}

// follow applies the watch events after rev until the watch fails or ctx ends.
func (o *owners) follow(ctx context.Context, cli *clientv3.Client, state string, rev int64) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	ipc := cli.Watch(wctx, state+"ips/", clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	uc := cli.Watch(wctx, state+"users/", clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	for {
		var wr clientv3.WatchResponse
		var ok bool
		select {
		case <-ctx.Done():
			return ctx.Err()
		case wr, ok = <-ipc:
		case wr, ok = <-uc:
		}
		if !ok {
			return errors.New("watch channel closed")
		}
		if err := wr.Err(); err != nil {
			return err
		}
		if wr.Canceled {
			return errors.New("watch canceled")
		}
		o.apply(state, wr.Events)
	}
}

func (o *owners) apply(state string, events []*clientv3.Event) {
	if len(events) == 0 {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, ev := range events {
		key := string(ev.Kv.Key)
		put := ev.Type == clientv3.EventTypePut
		if a, ok := ipKey(key, state); ok {
			if v, vok := vniOf(ev.Kv.Value); put && vok {
				o.ips[a] = v
			} else {
				delete(o.ips, a)
			}
		} else if u, ok := userKey(key, state); ok {
			if v, vok := vniOf(ev.Kv.Value); put && vok {
				o.users[u] = v
			} else {
				// the label stays private (to nobody) until the next full read: a user's
				// names never turn public because their record went away
				o.users[u] = noVNI
			}
		}
	}
}

func ipKey(key, state string) (netip.Addr, bool) {
	s, ok := strings.CutPrefix(key, state+"ips/")
	if !ok {
		return netip.Addr{}, false
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}

func userKey(key, state string) (string, bool) {
	s, ok := strings.CutPrefix(key, state+"users/")
	if !ok || s == "" || strings.Contains(s, "/") {
		return "", false
	}
	return strings.ToLower(s), true
}

// vniOf reads {"vni": N} (other fields ignored); a record without one owns nothing.
func vniOf(value []byte) (uint32, bool) {
	var r struct {
		VNI *uint32 `json:"vni"`
	}
	if err := json.Unmarshal(value, &r); err != nil || r.VNI == nil || *r.VNI == noVNI {
		return 0, false
	}
	return *r.VNI, true
}
