package membership

import (
	"fmt"
	"sync"
	"time"
)

// A snapshot of millions of blocks does not fit one answer, so it is served
// in pages; the pages of one snapshot must all describe the holdings at the
// same event number, or the node assembling them would hold a mix of two
// moments. The origin therefore freezes a copy of its holdings when the
// first page is asked for and serves the next pages from that copy, which
// it keeps while it is being read.

// SnapshotPage is part of a snapshot: Entries are entries Offset.. of the
// snapshot of Origin's holdings as of event Seq of Incarnation.
type SnapshotPage struct {
	Origin      string
	Incarnation uint64
	Seq         uint64
	Offset      uint64
	Entries     []Entry
	// More says entries follow: ask for the page at Offset+len(Entries).
	More bool
}

const (
	// frozenKept bounds the snapshots kept for paging at once: nodes
	// that resynchronise together share the newest when nothing was
	// published between their requests; a third evicts the least
	// recently read.
	frozenKept = 2
	// frozenIdle is how long a snapshot nobody reads is kept.
	frozenIdle = 30 * time.Second
)

type frozenSnapshot struct {
	seq      uint64
	entries  []Entry
	lastRead time.Time
}

// snapshotCache holds the snapshots being paged. Its zero value is ready.
type snapshotCache struct {
	mu     sync.Mutex
	frozen []*frozenSnapshot
}

// SnapshotPage serves one page of this node's holdings, at most limit
// entries. seq zero (with offset zero) starts a snapshot; the next pages
// name the Seq of the first and the offset of the first entry wanted. It
// fails with ErrRangeGone when that snapshot is no longer kept (the caller
// starts again). The page's Entries are shared with later callers: read
// them, never write them.
func (m *Membership) SnapshotPage(seq, offset uint64, limit int) (SnapshotPage, error) {
	if limit < 1 {
		return SnapshotPage{}, fmt.Errorf("membership: snapshot page of %d entries", limit)
	}
	c := &m.snaps
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	kept := c.frozen[:0]
	for _, f := range c.frozen {
		if now.Sub(f.lastRead) < frozenIdle {
			kept = append(kept, f)
		}
	}
	clear(c.frozen[len(kept):])
	c.frozen = kept
	var f *frozenSnapshot
	if seq == 0 && offset == 0 {
		f = m.freeze(now)
	} else {
		for _, x := range c.frozen {
			if x.seq == seq {
				f = x
			}
		}
		if f == nil {
			return SnapshotPage{}, fmt.Errorf("%w: snapshot as of %d is no longer kept; start again", ErrRangeGone, seq)
		}
	}
	if offset > uint64(len(f.entries)) {
		return SnapshotPage{}, fmt.Errorf("membership: snapshot page at %d, past the snapshot's %d entries", offset, len(f.entries))
	}
	f.lastRead = now
	end := min(uint64(len(f.entries)), offset+uint64(limit))
	return SnapshotPage{Origin: m.cfg.Name, Incarnation: m.cfg.Incarnation, Seq: f.seq, Offset: offset,
		Entries: f.entries[offset:end], More: end < uint64(len(f.entries))}, nil
}

// freeze returns a snapshot of the current holdings: a kept one if nothing
// was published since, else a new copy. c.mu is held.
func (m *Membership) freeze(now time.Time) *frozenSnapshot {
	c := &m.snaps
	m.mu.Lock()
	seq := m.seq
	m.mu.Unlock()
	for _, f := range c.frozen {
		if f.seq == seq {
			return f
		}
	}
	s := m.Snapshot()
	f := &frozenSnapshot{seq: s.Seq, entries: s.Entries, lastRead: now}
	if len(c.frozen) >= frozenKept {
		oldest := 0
		for i, x := range c.frozen {
			if x.lastRead.Before(c.frozen[oldest].lastRead) {
				oldest = i
			}
		}
		c.frozen = append(c.frozen[:oldest], c.frozen[oldest+1:]...)
	}
	c.frozen = append(c.frozen, f)
	return f
}
