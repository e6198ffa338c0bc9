package index

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// streamNode is a member of an in-memory owned-slices cluster.
type streamNode struct {
	name  string
	inc   uint64
	pub   *Publisher
	ix    *Index
	slice *Slice
	held  map[uint64]int
}

type streamCluster struct {
	rng   *rand.Rand
	nodes map[string]*streamNode
	// lossy: calls fail, and applied calls are answered as failed (so
	// that they are sent again), at random.
	lossy bool
	now   time.Time
}

func (c *streamCluster) add(name string, inc uint64) {
	ix, _ := New(Config{Shards: 4})
	c.nodes[name] = &streamNode{name: name, inc: inc, pub: NewPublisher(name, 3, 3*time.Second), ix: ix, slice: NewSlice(ix, nil), held: map[uint64]int{}}
}

// remove takes a node out as a failure does: every other index drops it.
func (c *streamCluster) remove(name string) {
	delete(c.nodes, name)
	for _, n := range c.nodes {
		n.ix.DropName(name)
		n.ix.Sweep()
	}
}

func (c *streamCluster) members() []string {
	var out []string
	for n := range c.nodes {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// pump delivers calls until none but probes that find their stream whole
// is made, with the clock run past any retry wait.
func (c *streamCluster) pump(t *testing.T) {
	t.Helper()
	quiet := 0
	for range 10000 {
		sent := false
		c.now = c.now.Add(2 * time.Second)
		for _, name := range c.members() {
			n := c.nodes[name]
			for _, o := range n.pub.Next(c.now, n.inc) {
				// A probe that finds its stream whole, or is lost (the
				// next finds what it would have), is not work left.
				real := len(o.Call.Ops) > 0 || o.Call.Replace
				sent = sent || real
				w := c.nodes[o.Owner]
				if w == nil || (c.lossy && c.rng.IntN(5) == 0) {
					n.pub.Done(o, Failed, c.now)
					continue
				}
				_, err := w.slice.Apply(name, o.Call)
				switch {
				case errors.Is(err, ErrReplaceNeeded):
					sent = true
					n.pub.Done(o, Replace, c.now)
				case err != nil:
					t.Fatal(err)
				case c.lossy && c.rng.IntN(5) == 0:
					n.pub.Done(o, Failed, c.now) // the answer was lost
				default:
					n.pub.Done(o, Applied, c.now)
				}
			}
		}
		// Quiet long enough that every stream was probed several times,
		// in case probes were lost.
		if quiet++; sent {
			quiet = 0
		}
		if quiet == 20 {
			return
		}
	}
	t.Fatal("calls still pending after 10,000 rounds")
}

// check compares every slice with the holdings.
func (c *streamCluster) check() error {
	members := c.members()
	place := NewPlacement(members, 3)
	for _, name := range members {
		n := c.nodes[name]
		var want int64
		holders := map[uint64][]string{}
		for _, o := range members {
			for h, k := range c.nodes[o].held {
				if k > 0 && place.Owns(name, h) {
					holders[h] = append(holders[h], o)
					want++
				}
			}
		}
		if got := n.ix.Metrics().Pairs; got != want {
			return fmt.Errorf("%s indexes %d pairs, owns %d", name, got, want)
		}
		for h, hs := range holders {
			got := n.slice.Holders([]uint64{h})[0]
			slices.Sort(got)
			if !slices.Equal(got, hs) {
				return fmt.Errorf("%s: holders of %#x %v, want %v", name, h, got, hs)
			}
		}
	}
	return nil
}

func (c *streamCluster) setMembers() {
	m := c.members()
	for _, n := range c.nodes {
		n.pub.SetMembers(m)
	}
}

// Under joins, failures, restarts, removes of copies, an owner dropping
// an origin that never learns of it, and calls lost or answered twice, every owner's slice ends up holding exactly the live
// holders of the hashes it owns.
func TestStreamsConverge(t *testing.T) {
	for _, lossy := range []bool{false, true} {
		t.Run(fmt.Sprintf("lossy=%v", lossy), func(t *testing.T) {
			seed := rand.Uint64()
			t.Logf("seed %d", seed)
			c := &streamCluster{rng: rand.New(rand.NewPCG(seed, 1)), nodes: map[string]*streamNode{}, lossy: lossy, now: time.Unix(0, 0)}
			for i := range 8 {
				c.add(fmt.Sprintf("n%d", i), 1)
			}
			c.setMembers()
			next := 8
			for round := range 30 {
				for _, name := range c.members() {
					n := c.nodes[name]
					for range 20 {
						h := c.rng.Uint64N(500) // hashes shared between nodes
						if n.held[h] > 0 && c.rng.IntN(2) == 0 {
							n.held[h]--
							n.pub.Remove(h)
						} else {
							n.held[h]++
							n.pub.Store(h)
						}
					}
				}
				switch round % 6 {
				case 4:
					// An owner sees an origin fail and come back; the
					// origin never saw the owner go: only a probe of its
					// silent stream tells it to start it afresh.
					m := c.members()
					w, o := c.nodes[m[0]], m[1+c.rng.IntN(len(m)-1)]
					w.ix.DropName(o)
					w.ix.Sweep()
				case 1:
					c.add(fmt.Sprintf("n%d", next), 1)
					next++
				case 2:
					m := c.members()
					c.remove(m[c.rng.IntN(len(m))])
				case 3:
					// A restart under the same name: a new run, holding
					// nothing yet.
					m := c.members()
					name := m[c.rng.IntN(len(m))]
					inc := c.nodes[name].inc + 1
					c.remove(name)
					c.setMembers()
					c.pump(t)
					c.add(name, inc)
				}
				c.setMembers()
				c.pump(t)
				if err := c.check(); err != nil {
					t.Fatalf("round %d: %v", round, err)
				}
			}
		})
	}
}

// A gap in a stream is refused, and a replace starts it afresh.
func TestSliceGap(t *testing.T) {
	ix, _ := New(DefaultConfig())
	s := NewSlice(ix, nil)
	if _, err := s.Apply("a", OpsCall{Inc: 1, First: 1, Ops: []Op{{OpStore, 1}}}); !errors.Is(err, ErrReplaceNeeded) {
		t.Fatalf("a stream that does not start with a replace: %v", err)
	}
	if n, err := s.Apply("a", OpsCall{Inc: 1, First: 1, Replace: true, Ops: []Op{{OpStore, 1}, {OpStore, 2}}}); err != nil || n != 2 {
		t.Fatalf("replace: %d, %v", n, err)
	}
	if n, err := s.Apply("a", OpsCall{Inc: 1, First: 2, Ops: []Op{{OpStore, 2}, {OpStore, 3}}}); err != nil || n != 1 {
		t.Fatalf("a retry overlapping what was applied: %d, %v; want 1 applied", n, err)
	}
	if _, err := s.Apply("a", OpsCall{Inc: 1, First: 9, Ops: []Op{{OpStore, 4}}}); !errors.Is(err, ErrReplaceNeeded) {
		t.Fatalf("a gap: %v", err)
	}
	if n, err := s.Apply("a", OpsCall{Inc: 1, First: 10, Replace: true, Ops: []Op{{OpStore, 7}}}); err != nil || n != 1 {
		t.Fatalf("replace after the gap: %d, %v", n, err)
	}
	if got := s.Holders([]uint64{1, 7}); len(got[0]) != 0 || !slices.Equal(got[1], []string{"a"}) {
		t.Fatalf("after the replace: %v, want only 7", got)
	}
	// An older run's call is ignored.
	if n, err := s.Apply("a", OpsCall{Inc: 2, First: 1, Replace: true, Ops: []Op{{OpStore, 8}}}); err != nil || n != 1 {
		t.Fatalf("a new run: %d, %v", n, err)
	}
	if n, err := s.Apply("a", OpsCall{Inc: 1, First: 11, Ops: []Op{{OpStore, 9}}}); err != nil || n != 0 {
		t.Fatalf("the old run after the new: %d, %v; want ignored", n, err)
	}
}

// An owner's queue holds MaxQueuedOps ops; one more turns it into a
// replace, whose first call carries the replace flag.
func TestPublisherQueueLimit(t *testing.T) {
	now := time.Unix(0, 0)
	p := NewPublisher("a", 2, time.Hour)
	p.SetMembers([]string{"a", "b"})
	for _, o := range p.Next(now, 1) { // the streams' first replaces, empty
		if !o.Call.Replace || len(o.Call.Ops) != 0 {
			t.Fatalf("first call to %s: %+v, want an empty replace", o.Owner, o.Call)
		}
		p.Done(o, Applied, now)
	}
	hs := make([]uint64, MaxQueuedOps+1)
	for i := range hs {
		hs[i] = uint64(i+1) * 0x9e3779b97f4a7c15
	}
	p.Store(hs[:MaxQueuedOps]...)
	if got := p.Stats().Queued; got != 2*MaxQueuedOps {
		t.Fatalf("at the limit: %d ops queued, want %d for each of 2 owners", got, 2*MaxQueuedOps)
	}
	calls := p.Next(now, 1)
	if len(calls) != 2 || calls[0].Call.Replace || len(calls[0].Call.Ops) != MaxOpsPerCall {
		t.Fatalf("at the limit: calls %d, first replace=%v with %d ops; want 2 calls of %d ops, no replace",
			len(calls), calls[0].Call.Replace, len(calls[0].Call.Ops), MaxOpsPerCall)
	}
	for _, o := range calls {
		p.Done(o, Failed, now) // not delivered: still queued
	}
	p.Store(hs[MaxQueuedOps])
	if got := p.Stats().Queued; got != 0 {
		t.Fatalf("one past the limit: %d ops queued, want the queues dropped for replaces", got)
	}
	calls = p.Next(now.Add(time.Hour), 1)
	if len(calls) != 2 {
		t.Fatalf("after the limit: %d calls, want 2", len(calls))
	}
	for _, o := range calls {
		if !o.Call.Replace || len(o.Call.Ops) != MaxOpsPerCall {
			t.Fatalf("after the limit, to %s: replace=%v with %d ops, want a replace of %d ops first", o.Owner, o.Call.Replace, len(o.Call.Ops), MaxOpsPerCall)
		}
	}
	if got := p.Stats().Queued; got != 2*(MaxQueuedOps+1) {
		t.Fatalf("the replaces hold %d ops, want every hash for each owner (%d)", got, 2*(MaxQueuedOps+1))
	}
}

// A member list change that moves some of the origin's hashes counts one
// hand-off and the ops it queued; one that moves none (the first list, a
// list equal to the current) counts nothing.
func TestPublisherHandoffs(t *testing.T) {
	p := NewPublisher("a", 1, 0)
	p.SetMembers([]string{"a"})
	hashes := make([]uint64, 1000)
	for i := range hashes {
		hashes[i] = uint64(i) * 0x9e3779b97f4a7c15
	}
	p.Store(hashes...)
	if s := p.Stats(); s.Handoffs != 0 || s.Moved != 0 {
		t.Fatalf("before any change: %+v", s)
	}
	p.SetMembers([]string{"a"})
	if s := p.Stats(); s.Handoffs != 0 {
		t.Fatalf("the same list counted a hand-off: %+v", s)
	}
	p.SetMembers([]string{"a", "b"})
	s := p.Stats()
	// With one owner a hash, b takes about half: a store to b and a
	// forget to a for each hash moved.
	place := NewPlacement([]string{"a", "b"}, 1)
	moved := 0
	for _, h := range hashes {
		if place.AppendOwners(nil, h)[0] == "b" {
			moved++
		}
	}
	if s.Handoffs != 1 || s.Moved != int64(2*moved) || moved == 0 {
		t.Fatalf("after b joined: %+v, want 1 hand-off of %d ops (%d hashes moved)", s, 2*moved, moved)
	}
}

// Owners keep each holder's tier: a hash the origin stores on disk only
// is named disk-only, one it holds in memory too is not, and the tier
// follows the hash through a hand-off to a new owner and a replace.
func TestSliceKeepsTiers(t *testing.T) {
	c := &streamCluster{rng: rand.New(rand.NewPCG(1, 2)), nodes: map[string]*streamNode{}, now: time.Unix(1000, 0)}
	for _, n := range []string{"a", "b", "c"} {
		c.add(n, 1)
	}
	c.setMembers()
	a := c.nodes["a"]
	const n = 60
	mem, disk, both := make([]uint64, n), make([]uint64, n), make([]uint64, n)
	for i := range n {
		mem[i], disk[i], both[i] = uint64(3*i+1)*0x9e3779b97f4a7c15, uint64(3*i+2)*0x9e3779b97f4a7c15, uint64(3*i+3)*0x9e3779b97f4a7c15
	}
	a.pub.Store(mem...)
	a.pub.StoreDisk(disk...)
	a.pub.Store(both...)
	a.pub.StoreDisk(both...)
	check := func(what string, diskOnly func(h uint64) bool) {
		t.Helper()
		members := c.members()
		place := NewPlacement(members, 3)
		for _, hs := range [][]uint64{mem, disk, both} {
			for _, h := range hs {
				for _, w := range place.AppendOwners(nil, h) {
					got := c.nodes[w].slice.HolderTiers([]uint64{h})[0]
					want := []Holder{{Name: "a", DiskOnly: diskOnly(h)}}
					if !slices.Equal(got, want) {
						t.Fatalf("%s: owner %s names holders %v of %#x, want %v", what, w, got, h, want)
					}
				}
			}
		}
	}
	onDisk := func(h uint64) bool { return slices.Contains(disk, h) }
	c.pump(t)
	check("stored", onDisk)

	// A join: the new owner of a hash gets its copies with their tiers.
	c.add("d", 1)
	c.setMembers()
	c.pump(t)
	check("after d joined", onDisk)

	// The memory copies of both go: they are on disk only now; the disk
	// copies of disk go: those hashes are gone.
	a.pub.Remove(both...)
	a.pub.RemoveDisk(disk...)
	c.pump(t)
	for _, h := range disk {
		for _, w := range c.members() {
			if got := c.nodes[w].slice.HolderTiers([]uint64{h})[0]; len(got) != 0 {
				t.Fatalf("%s still names %v of a hash removed from disk", w, got)
			}
		}
	}
	disk = nil
	check("after removes", func(h uint64) bool { return slices.Contains(both, h) })

	// A replace sends the tiers afresh.
	a.pub.ResetTiers(mem, both)
	c.pump(t)
	check("after a replace", func(h uint64) bool { return slices.Contains(both, h) })

	// A memory remove of a hash held on disk only is ignored: the copy
	// on disk stays.
	a.pub.Remove(both[0])
	c.pump(t)
	check("after a memory remove of a disk-only hash", func(h uint64) bool { return slices.Contains(both, h) })
}
