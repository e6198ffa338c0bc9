package fabric

import (
	"context"

	"github.com/kvfabric/kvfabric/pool"
	"github.com/kvfabric/kvfabric/pool/disk"
)

// ReadAheadCounts are a's read-aheads started and ended, and the restores
// that waited for one.
func ReadAheadCounts(a *Agent) (started, ended, waits uint64) {
	r := &a.tiers.ahead
	return r.started.Load(), r.ended.Load(), r.waits.Load()
}

// HoldReadAheads makes each read-ahead of a, once it holds its slots, call
// f (with its ctx) before it reads; nil: no call.
func HoldReadAheads(a *Agent, f func(ctx context.Context)) {
	if f == nil {
		a.tiers.ahead.allocated.Store(nil)
		return
	}
	a.tiers.ahead.allocated.Store(&f)
}

// HoldReadAheadReads makes each read-ahead of a call f (with its ctx and
// the block's hash) before each block's read; nil: no call.
func HoldReadAheadReads(a *Agent, f func(ctx context.Context, hash uint64)) {
	if f == nil {
		a.tiers.ahead.reading.Store(nil)
		return
	}
	a.tiers.ahead.reading.Store(&f)
}

// TierLinks is how many child links a's tiers keep.
func TierLinks(a *Agent) int { return a.tiers.links() }

// TierLink links parent to hash in a's tiers (block set id's shape), as a
// copy down of hash after parent does; false if the tiers do not hold it.
func TierLink(a *Agent, id, hash, parent uint64) bool {
	s, err := a.pool.BlockSet(pool.SetID(id))
	if err != nil {
		return false
	}
	k := disk.Key{Hash: hash, Tag: shapeTag(s.Layout())}
	if a.tiers.where(k) == nil {
		return false
	}
	a.tiers.link(k, parent)
	return true
}

// TierChild is the block a's tiers link to parent in block set id's
// shape, if any.
func TierChild(a *Agent, id, parent uint64) (uint64, bool) {
	s, err := a.pool.BlockSet(pool.SetID(id))
	if err != nil {
		return 0, false
	}
	return a.tiers.childOf(disk.Key{Hash: parent, Tag: shapeTag(s.Layout())})
}

// TierMoveDown moves up to n of a's host tier's blocks down, as its
// mover does, and returns how many moved.
func TierMoveDown(a *Agent, n int) int {
	h := a.tiers.hostTier()
	if h == nil {
		return 0
	}
	return a.tiers.moveDown(h, n)
}

// LockAgent takes a's lock, as an engine call that frees a set for room
// holds it, until the function it returns is called.
func LockAgent(a *Agent) (unlock func()) {
	a.mu.Lock()
	return a.mu.Unlock
}

// TierDropStored deletes hash from the store of the tier that holds it,
// leaving the tiers' record, as an eviction does just before it forgets
// the record; false if no tier holds it.
func TierDropStored(a *Agent, hash uint64) bool {
	k, ok := a.tiers.find(hash)
	if !ok {
		return false
	}
	d := a.tiers.where(k)
	return d != nil && d.store.Load().Delete(k) == nil
}

// TierHolds says whether a's tiers keep a record of hash.
func TierHolds(a *Agent, hash uint64) bool {
	_, ok := a.tiers.find(hash)
	return ok
}

// ReadAheadsWait waits until every read-ahead of a started has returned.
func ReadAheadsWait(a *Agent) { a.tiers.ahead.wg.Wait() }

// BlockSetLinks is the parent a's block set id recorded for hash, and how
// many blocks registered after hash extend it in the set; false if the
// set does not hold hash.
func BlockSetLinks(a *Agent, id, hash uint64) (parent uint64, children int, ok bool) {
	s, err := a.pool.BlockSet(pool.SetID(id))
	if err != nil {
		return 0, 0, false
	}
	b, ok := s.Lookup(hash)
	if !ok {
		return 0, 0, false
	}
	si, err := s.Slot(b.Slot)
	if err != nil || si.Generation != b.Generation || si.Hash != hash {
		return 0, 0, false
	}
	return si.Parent, si.Children, true
}

// BlockSetWithdraw takes hash out of a's block set id, as a block found
// bad is (pool.BlockSet.Withdraw); false if the set does not hold it.
func BlockSetWithdraw(a *Agent, id, hash uint64) bool {
	s, err := a.pool.BlockSet(pool.SetID(id))
	if err != nil {
		return false
	}
	b, ok := s.Lookup(hash)
	return ok && s.Withdraw(b) == nil
}

// TierKeepParent puts hash's block again in the store of a's tier that
// holds it, with parent kept beside it, whatever parent is (0, the
// block's own hash), as a journal a restarted agent replays may name it;
// false if no tier holds it or the put failed.
func TierKeepParent(a *Agent, hash, parent uint64) bool {
	k, ok := a.tiers.find(hash)
	if !ok {
		return false
	}
	d := a.tiers.where(k)
	if d == nil {
		return false
	}
	st := d.store.Load()
	a.tiers.mu.Lock()
	buf := make([]byte, a.tiers.blockBytes)
	a.tiers.mu.Unlock()
	ctx := context.Background()
	n, err := st.Get(ctx, k, buf)
	if err != nil {
		return false
	}
	return st.PutBatch(ctx, []disk.PutItem{{Key: k, Data: buf[:n], Parent: parent, HasParent: true}})[0] == nil
}

// HoldReadAheadEnds makes each read-ahead of a, once it has looked for
// room for the last time, call f before it releases its blocks; nil: no
// call.
func HoldReadAheadEnds(a *Agent, f func()) {
	if f == nil {
		a.tiers.ahead.closing.Store(nil)
		return
	}
	a.tiers.ahead.closing.Store(&f)
}

// HoldRestores makes each restore of a that is not a read-ahead call f
// once it has its slots, before it reads; nil: no call.
func HoldRestores(a *Agent, f func()) {
	if f == nil {
		a.tiers.restoring.Store(nil)
		return
	}
	a.tiers.restoring.Store(&f)
}

// AheadUntaken is how many blocks read ahead into set id nothing has
// taken yet, as the set's read-ahead lists them; -1 if no such set.
func AheadUntaken(a *Agent, id uint64) int {
	es, err := a.engineSet(id)
	if err != nil {
		return -1
	}
	es.ahead.mu.Lock()
	defer es.ahead.mu.Unlock()
	return len(es.ahead.blocks)
}

// BlockUsers is the references on hash's block in set id, -1 if the set
// does not hold it.
func BlockUsers(a *Agent, id, hash uint64) int {
	es, err := a.engineSet(id)
	if err != nil {
		return -1
	}
	b, ok := es.set.Lookup(hash)
	if !ok {
		return -1
	}
	si, err := es.set.Slot(b.Slot)
	if err != nil {
		return -1
	}
	return si.Users
}

// OnReadAheadRegistered makes a's read-aheads call f once they have
// registered a batch of blocks, before they record them as read ahead,
// under the set's read-ahead lock (nil: none).
func OnReadAheadRegistered(a *Agent, f func()) {
	if f == nil {
		a.tiers.ahead.registered.Store(nil)
		return
	}
	a.tiers.ahead.registered.Store(&f)
}
