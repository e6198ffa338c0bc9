package fabric

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvfabric/kvfabric/pool"
	"github.com/kvfabric/kvfabric/pool/disk"
)

// BlockSetHolds says whether a's block set id holds hash in memory, without
// restoring anything.
func BlockSetHolds(a *Agent, id, hash uint64) bool {
	s, err := a.pool.BlockSet(pool.SetID(id))
	if err != nil {
		return false
	}
	_, ok := s.Lookup(hash)
	return ok
}

// ImportCandidates names the holders an import of hashes on a would try,
// in order.
func ImportCandidates(a *Agent, hashes []uint64) []string {
	var out []string
	for _, c := range a.candidates(hashes, 1) {
		out = append(out, c.member.Name)
	}
	return out
}

// TierCopyDown copies the blocks of hashes in a's block set id down to its
// disk tiers as the tiers' workers do (as many goroutines, each taking the
// blocks queued in batches, each block written straight from its slot or
// gathered into canonical order, each batch committed at once), and
// returns how many went down.
func TierCopyDown(a *Agent, id uint64, hashes []uint64) (int, error) {
	s, err := a.pool.BlockSet(pool.SetID(id))
	if err != nil {
		return 0, err
	}
	queue := make(chan *offloadJob, len(hashes))
	for _, h := range hashes {
		if blk, ok := s.Lookup(h); ok {
			queue <- &offloadJob{set: s, blk: blk, hash: h, held: true}
		}
	}
	close(queue)
	var done atomic.Int64
	var wg sync.WaitGroup
	for range tierCopiers * len(a.tiers.list) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				var batch []*offloadJob
				for j := range queue {
					if batch = append(batch, j); len(batch) == a.tiers.batchLen() {
						break
					}
				}
				if len(batch) == 0 {
					return
				}
				for _, c := range a.tiers.copyDownBatch(batch) {
					if c.ok {
						done.Add(1)
					}
				}
			}
		}()
	}
	wg.Wait()
	return int(done.Load()), nil
}

// TierDrop drops hashes of a's block set id's shape from its disk tiers.
func TierDrop(a *Agent, id uint64, hashes []uint64) error {
	s, err := a.pool.BlockSet(pool.SetID(id))
	if err != nil {
		return err
	}
	tag := shapeTag(s.Layout())
	for _, h := range hashes {
		k := disk.Key{Hash: h, Tag: tag}
		if d := a.tiers.where(k); d != nil {
			if err := d.store.Load().Delete(k); err != nil {
				return err
			}
			forgetKey(a.tiers, d, k)
		}
	}
	return nil
}

// TierCopiesPending is how many copies down a's tiers have queued or
// under way.
func TierCopiesPending(a *Agent) int {
	a.tiers.jobsMu.Lock()
	defer a.tiers.jobsMu.Unlock()
	return len(a.tiers.jobs)
}

// TierHoldPuts makes every copy down of a's tiers wait, its block read
// and not yet written, until release is called; held reports how many
// are waiting. Call it before the first copy.
func TierHoldPuts(a *Agent) (held func() int, release func()) {
	return holdAt(&a.tiers.beforePut)
}

// TierPendingWaits returns a channel that receives once each time a's
// tiers begin to wait for the copies down of a hash under way
// (whereWait), as many as it has room for; the others are not sent.
func TierPendingWaits(a *Agent) <-chan struct{} {
	ch := make(chan struct{}, 64)
	f := func() {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	a.tiers.pendingWait.Store(&f)
	return ch
}

// TierCountWaitCap sets the bound on a's look-ups' wait for copies down
// where the call has no deadline (noDeadlineCountWait), for the test.
func TierCountWaitCap(a *Agent, d time.Duration) {
	a.tiers.countWaitCap.Store(int64(d))
}

// TierHoldCommits makes every copy down of a's tiers wait, its writes
// ended (or failed) and its batch not yet committed, until release is
// called; held reports how many are waiting.
func TierHoldCommits(a *Agent) (held func() int, release func()) {
	return holdAt(&a.tiers.beforeCommit)
}

// TierFailIO makes a's tiers' stores ask f before each read and write
// (disk.Config.FailIO); nil runs them all again.
func TierFailIO(a *Agent, f func(write, straight bool) error) {
	if f == nil {
		a.tiers.failIO.Store(nil)
		return
	}
	a.tiers.failIO.Store(&f)
}

// TierDirectOff says whether a's tiers turned writes and reads straight
// from and into pool memory off.
func TierDirectOff(a *Agent) bool { return a.tiers.noDirect.Load() }

func holdAt(hook *atomic.Pointer[func()]) (held func() int, release func()) {
	gate := make(chan struct{})
	var n atomic.Int64
	f := func() {
		n.Add(1)
		<-gate
		n.Add(-1)
	}
	hook.Store(&f)
	var once sync.Once
	return func() int { return int(n.Load()) }, func() { once.Do(func() { close(gate) }) }
}

// TierCommits is how many journal commits a's disk tiers' stores made
// (each a data sync and a journal sync).
func TierCommits(a *Agent) uint64 {
	var n uint64
	for _, d := range a.tiers.list {
		if st := d.store.Load(); st != nil {
			n += st.Stats().Commits
		}
	}
	return n
}

// TierLinkRecords is how many link records a's disk tiers' stores wrote
// (disk.Stats.Links): one for each block whose parent the tiers kept with
// its copy after its put (SetParent). Read after a.Close to count those
// its Close wrote too.
func TierLinkRecords(a *Agent) uint64 {
	var n uint64
	for _, d := range a.tiers.list {
		if st := d.store.Load(); st != nil {
			n += st.Stats().Links
		}
	}
	return n
}

// TierDirectWrites is how many blocks a's tiers committed as written
// straight from pool memory, and how many blocks written straight were
// written again from bytes copied out because an allocation took the slot
// under the write.
func TierDirectWrites(a *Agent) (direct, rewritten uint64) {
	return a.tiers.direct.Load(), a.tiers.rewritten.Load()
}

// TierForgetQueued makes a's tiers forget the copies down queued or under
// way now, so that an allocation that takes one of their slots finds no
// copy to copy the block out for (OffloadTake refuses): the block is
// dropped. Their copies still end; TierHashesPending counts them.
func TierForgetQueued(a *Agent) {
	a.tiers.jobsMu.Lock()
	defer a.tiers.jobsMu.Unlock()
	clear(a.tiers.jobs)
}

// TierHashesPending is how many hashes have copies down queued or under
// way on a's tiers, forgotten ones (TierForgetQueued) included.
func TierHashesPending(a *Agent) int {
	a.tiers.jobsMu.Lock()
	defer a.tiers.jobsMu.Unlock()
	return len(a.tiers.pending)
}

// TierFailSlotReads makes every copy down of a's tiers read slots into
// buffers (straight writes off), as it does a device set's, and fail each
// read with f's error; nil lets reads succeed again (straight writes stay
// off).
func TierFailSlotReads(a *Agent, f func(hash uint64) error) {
	if f == nil {
		a.tiers.failSlotRead.Store(nil)
		return
	}
	a.tiers.noDirect.Store(true)
	a.tiers.failSlotRead.Store(&f)
}

// TierSlotPieces is the memory of hash's slot in a's block set id as a
// copy down writes it straight (slotPieces: the block in canonical order,
// its contiguous chunks joined), nil where it is not written straight.
func TierSlotPieces(a *Agent, id, hash uint64) [][]byte {
	s, err := a.pool.BlockSet(pool.SetID(id))
	if err != nil {
		return nil
	}
	blk, ok := s.Lookup(hash)
	if !ok {
		return nil
	}
	regions, err := s.RegionBytes()
	if err != nil {
		return nil
	}
	return slotPieces(s.Layout(), regions, blk.Slot)
}

// OnTierAnnounced runs f each time the tiers publish that the node holds
// (store) or no longer holds hashes, under block set number set.
func OnTierAnnounced(c *Config, f func(store bool, set uint32, hashes []uint64)) {
	c.hooks.tierAnnounced = f
}

// TierAnnounceSet is the block set number tier n's blocks are announced
// under.
func TierAnnounceSet(a *Agent, n int) uint32 { return a.tiers.tierSet(n) }

// OwnHoldingSets counts a's published holdings (whole index mode) by
// block set number.
func OwnHoldingSets(a *Agent) map[uint32]int {
	out := map[uint32]int{}
	for _, e := range a.joined.Load().Snapshot().Entries {
		out[e.BlockSet]++
	}
	return out
}
