package fabric

import (
	"fmt"
	"sync"

	"github.com/kvfabric/kvfabric/membership"
)

// Every member of a cluster must keep the block index the same way: a
// node in whole mode finds blocks in the gossip of every node's events,
// one in owned mode asks the owners that the placement over its members
// picks, and a placement over members with a different replica count
// names other owners. So the mode travels in each node's metadata, and a
// member whose mode differs from this node's is not used as an index
// peer: in owned mode it is left out of the placement (it neither owns
// hashes nor is sent this node's events), its index calls are refused,
// and gossip events, which only whole-mode nodes send, are never applied
// to an owned slice. It stays a member (it can still be read from, and it
// is still probed), and is reported loudly: an error log when it joins or
// changes mode, kvfabric_index_mode_mismatched_members, and status.

// indexModeMeta is this node's index mode as its metadata says it.
func (a *Agent) indexModeMeta() membership.IndexMode {
	if a.cfg.IndexMode != IndexOwned {
		return membership.IndexMode{}
	}
	return membership.IndexMode{Owned: true, Replicas: uint8(a.cfg.IndexReplicas)}
}

// indexMismatch says whether member m keeps the index differently from
// this node, and is therefore not an index peer.
func (a *Agent) indexMismatch(m membership.Member) bool {
	return m.Name != a.cfg.NodeName && m.Meta.Index != a.indexModeMeta()
}

// indexPeerErr returns why peer's index calls are refused, nil if they
// are not: it is a member in another index mode.
func (a *Agent) indexPeerErr(peer string) error {
	if m, ok := a.member(peer); ok && a.indexMismatch(m) {
		return fmt.Errorf("member %s keeps the index as %s, this node as %s: --index-mode and --index-replicas must be the same on every node",
			peer, m.Meta.Index, a.indexModeMeta())
	}
	return nil
}

// indexMismatches counts the current members in another index mode.
func (a *Agent) indexMismatches() int {
	m := a.joined.Load()
	if m == nil {
		return 0
	}
	n := 0
	for _, mb := range m.Members() {
		if a.indexMismatch(mb) {
			n++
		}
	}
	return n
}

// modeReports remembers the members reported for their index mode, so
// that each is reported once per mode it shows.
type modeReports struct {
	mu   sync.Mutex
	seen map[string]membership.IndexMode
}

// reportIndexMode logs a member event's member if its index mode differs
// from this node's (an error: the cluster is misconfigured), or once it
// no longer does.
func (a *Agent) reportIndexMode(ev membership.MemberEvent) {
	r := &a.modeReports
	r.mu.Lock()
	defer r.mu.Unlock()
	m := ev.Member
	prev, reported := r.seen[m.Name]
	switch {
	case ev.Kind == membership.MemberLeave || ev.Kind == membership.MemberFail:
		delete(r.seen, m.Name)
	case a.indexMismatch(m):
		if reported && prev == m.Meta.Index {
			return
		}
		if r.seen == nil {
			r.seen = map[string]membership.IndexMode{}
		}
		r.seen[m.Name] = m.Meta.Index
		a.eventLog.Error("member keeps the block index in another mode: not used as an index peer; give every node the same --index-mode and --index-replicas",
			"peer", m.Name, "its_mode", m.Meta.Index.String(), "this_mode", a.indexModeMeta().String())
	case reported:
		delete(r.seen, m.Name)
		a.eventLog.Info("member keeps the block index in this node's mode now: an index peer again", "peer", m.Name, "mode", m.Meta.Index.String())
	}
}
