package fabric

import (
	"sync"
	"time"

	"github.com/kvfabric/kvfabric/pool"
)

// leaseBook records the leases this node granted to peers: which peer took
// each, until when, and on how many blocks. With it a peer reads only under
// its own leases, no peer (nor all of them together) pins more than its
// share of the pool, a lease's checksum claims are checked once however
// many releases name them, and a peer's leases end when the peer goes.
//
// The pool keeps the leases themselves and expires them on its own; an
// entry whose deadline has passed is dropped here when the room it counted
// is needed, or in passing.
type leaseBook struct {
	mu     sync.Mutex
	leases map[pool.LeaseID]leaseEntry
	byPeer map[string]int // blocks leased or reserved, per peer
	total  int            // blocks leased or reserved, all peers
}

type leaseEntry struct {
	peer     string
	granted  time.Time
	deadline time.Time
	blocks   int
	refused  bool // a renewal was refused: past the max lease age
	claimed  bool // a release's checksum claims under it were taken up
}

func newLeaseBook() *leaseBook {
	return &leaseBook{leases: map[pool.LeaseID]leaseEntry{}, byPeer: map[string]int{}}
}

// reserve sets aside room for up to n blocks of peer under the caps and
// returns how many it set aside: n, fewer when a cap leaves less room, 0
// when it leaves none. The caller leases at most that many and then calls
// add or unreserve.
func (b *leaseBook) reserve(peer string, n, perPeer, total int, now time.Time) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	room := func() int { return max(0, min(n, perPeer-b.byPeer[peer], total-b.total)) }
	k := room()
	if k < n {
		b.expireLocked(now)
		k = room()
	}
	if k > 0 {
		b.byPeer[peer] += k
		b.total += k
	}
	return k
}

// unreserve gives back n blocks of room reserved for peer.
func (b *leaseBook) unreserve(peer string, n int) {
	b.mu.Lock()
	b.countLocked(peer, -n)
	b.mu.Unlock()
}

// add records lease id of peer on blocks blocks until deadline, out of
// reserved blocks of room reserved for it (the rest is given back).
func (b *leaseBook) add(id pool.LeaseID, peer string, reserved, blocks int, deadline time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.countLocked(peer, blocks-reserved)
	b.leases[id] = leaseEntry{peer: peer, granted: time.Now(), deadline: deadline, blocks: blocks}
	if len(b.leases)%256 == 0 {
		b.expireLocked(time.Now())
	}
}

// owner returns the peer that holds lease id.
func (b *leaseBook) owner(id pool.LeaseID) (string, bool) {
	b.mu.Lock()
	e, ok := b.leases[id]
	b.mu.Unlock()
	return e.peer, ok
}

// age returns how long ago lease id was granted, at now.
func (b *leaseBook) age(id pool.LeaseID, now time.Time) (time.Duration, bool) {
	b.mu.Lock()
	e, ok := b.leases[id]
	b.mu.Unlock()
	return now.Sub(e.granted), ok
}

// refuse marks lease id's renewals refused, and reports whether this call
// marked it: false when an earlier one did, or the book no longer has it.
func (b *leaseBook) refuse(id pool.LeaseID) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	e, ok := b.leases[id]
	if !ok || e.refused {
		return false
	}
	e.refused = true
	b.leases[id] = e
	return true
}

// claim takes up the checksum claims of a release of lease id by peer
// (peerService.Mismatched): mine says whether the book has the lease and
// it is peer's, first whether this call took them up, the first of any
// under the lease. Only the first call's claims are checked: a release
// sent many times at once makes the holder sum the lease's blocks once,
// not once a call.
func (b *leaseBook) claim(id pool.LeaseID, peer string) (mine, first bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e, ok := b.leases[id]
	if !ok || e.peer != peer {
		return false, false
	}
	if e.claimed {
		return true, false
	}
	e.claimed = true
	b.leases[id] = e
	return true, true
}

// extend moves lease id's deadline.
func (b *leaseBook) extend(id pool.LeaseID, deadline time.Time) {
	b.mu.Lock()
	if e, ok := b.leases[id]; ok {
		e.deadline = deadline
		b.leases[id] = e
	}
	b.mu.Unlock()
}

// remove forgets lease id and returns when it was granted.
func (b *leaseBook) remove(id pool.LeaseID) (granted time.Time, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e, ok := b.leases[id]
	if ok {
		delete(b.leases, id)
		b.countLocked(e.peer, -e.blocks)
	}
	return e.granted, ok
}

// removePeer forgets every lease of peer and returns their ids and when
// each was granted.
func (b *leaseBook) removePeer(peer string) ([]pool.LeaseID, []time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var ids []pool.LeaseID
	var granted []time.Time
	for id, e := range b.leases {
		if e.peer == peer {
			ids = append(ids, id)
			granted = append(granted, e.granted)
			delete(b.leases, id)
			b.countLocked(peer, -e.blocks)
		}
	}
	return ids, granted
}

// leased returns the blocks peer holds leased or reserved, and all peers'.
func (b *leaseBook) leased(peer string) (int, int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.byPeer[peer], b.total
}

func (b *leaseBook) countLocked(peer string, d int) {
	b.byPeer[peer] += d
	b.total += d
	if b.byPeer[peer] <= 0 {
		delete(b.byPeer, peer)
	}
}

// expireLocked drops the entries whose deadline has passed: the pool has
// expired those leases, and a late read or release under them is refused
// either way.
func (b *leaseBook) expireLocked(now time.Time) {
	for id, e := range b.leases {
		if now.After(e.deadline) {
			delete(b.leases, id)
			b.countLocked(e.peer, -e.blocks)
		}
	}
}
