package membership

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// A snapshot of millions of blocks does not fit one answer, so it is served
// in pages; the pages of one snapshot must all describe the holdings at the
// same event number, or the node assembling them would hold a mix of two
// moments. The origin therefore freezes a copy of its holdings when the
// first page is asked for and serves the next pages from that copy, which
// it keeps while it is being read.
//
// Many nodes may resynchronise from one busy origin at once (a rolling
// restart). So that every one of them finishes, and memory stays bounded:
//
//   - A first page is served from the newest copy when nothing was
//     published since it was frozen, or when it was frozen less than
//     frozenShare ago: the reader catches up from the copy's Seq by range
//     repair, as after any snapshot. So at most one copy is frozen per
//     frozenShare, and the readers that arrive together share it.
//   - A copy read less than frozenInUse ago is never evicted: a reader
//     that asks for its next page within frozenInUse of the last one is
//     never made to start again, however many others start meanwhile.
//   - At most frozenKept copies are kept. When a new copy is needed and
//     every kept one is in use, the first page is refused with
//     [ErrSnapshotBusy] and the reader asks again later (its next repair).
//     A copy gains readers only during its first frozenShare (or while
//     nothing is published), so it falls out of use at most frozenInUse
//     after its last reader's last page, and a slot frees.
//
// Memory is thus frozenKept copies of the holdings at most; a copy nobody
// reads for frozenIdle is let go even below the cap.

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

// ErrSnapshotBusy is returned by [Membership.SnapshotPage] for a first
// page when the origin already keeps frozenKept snapshots, each of them
// being read; the caller asks again later.
var ErrSnapshotBusy = errors.New("membership: snapshots busy; ask again later")

const (
	// frozenKept bounds the snapshots kept for paging at once.
	frozenKept = 2
	// frozenShare is how long after it was frozen a snapshot is served
	// to new readers although events were published since.
	frozenShare = 3 * time.Second
	// frozenInUse is how long after its last read a snapshot is in use:
	// it is not evicted for a new one. A reader asks for its pages more
	// often than that.
	frozenInUse = 5 * time.Second
	// frozenIdle is how long a snapshot nobody reads is kept.
	frozenIdle = 30 * time.Second
)

type frozenSnapshot struct {
	seq      uint64
	entries  []Entry
	made     time.Time
	lastRead time.Time
}

// snapshotCache holds the snapshots being paged. Its zero value is ready.
type snapshotCache struct {
	mu     sync.Mutex
	frozen []*frozenSnapshot // oldest first
	now    func() time.Time  // if nil, time.Now (tests set a clock)
}

// SnapshotPage serves one page of this node's holdings, at most limit
// entries. seq zero (with offset zero) starts a snapshot; the next pages
// name the Seq of the first and the offset of the first entry wanted. The
// first page may describe holdings a few seconds old (its Seq says as of
// when): the caller catches up from there by range. It fails with
// ErrSnapshotBusy when no snapshot can be started now (the caller asks
// again later), and with ErrRangeGone when the snapshot being paged is no
// longer kept (the caller starts again). The page's Entries are shared
// with later callers: read them, never write them.
func (m *Membership) SnapshotPage(seq, offset uint64, limit int) (SnapshotPage, error) {
	if limit < 1 {
		return SnapshotPage{}, fmt.Errorf("membership: snapshot page of %d entries", limit)
	}
	c := &m.snaps
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	if c.now != nil {
		now = c.now()
	}
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
		var err error
		if f, err = m.freeze(now); err != nil {
			return SnapshotPage{}, err
		}
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

// freeze returns the snapshot a first page is served from: a kept one of
// the current holdings, else the newest if younger than frozenShare, else
// a new copy in a free slot or in place of one out of use. c.mu is held.
func (m *Membership) freeze(now time.Time) (*frozenSnapshot, error) {
	c := &m.snaps
	m.mu.Lock()
	seq := m.seq
	m.mu.Unlock()
	for _, f := range c.frozen {
		if f.seq == seq {
			return f, nil
		}
	}
	if n := len(c.frozen); n > 0 && now.Sub(c.frozen[n-1].made) < frozenShare {
		return c.frozen[n-1], nil
	}
	if len(c.frozen) >= frozenKept {
		victim := -1
		for i, x := range c.frozen {
			if now.Sub(x.lastRead) >= frozenInUse && (victim < 0 || x.lastRead.Before(c.frozen[victim].lastRead)) {
				victim = i
			}
		}
		if victim < 0 {
			return nil, fmt.Errorf("%w: %d snapshots are being read", ErrSnapshotBusy, len(c.frozen))
		}
		c.frozen = slices.Delete(c.frozen, victim, victim+1)
	}
	s := m.Snapshot()
	f := &frozenSnapshot{seq: s.Seq, entries: s.Entries, made: now, lastRead: now}
	c.frozen = append(c.frozen, f)
	return f, nil
}
