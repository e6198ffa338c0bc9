package index

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// Pod churn: far more names than MaxNodes come and go. Ids are recycled
// (a slot's generation grows), and a dropped id neither answers nor sees
// its successor's holdings.
func TestNodeIDsRecycledThroughChurn(t *testing.T) {
	const names, window = 5000, 100
	ix, _ := New(Config{Shards: 8})
	ids := make([]NodeID, names)
	lastGen := map[int]uint32{}
	sweeps := 0
	for i := range names {
		id, err := ix.ID(fmt.Sprintf("pod-%d", i))
		if errors.Is(err, ErrTooManyNodes) && ix.Pending() > 0 {
			// Every slot is live or dropped: the caller sweeps (the
			// agent wakes its sweeper) and asks again.
			sweeps++
			ix.Sweep()
			id, err = ix.ID(fmt.Sprintf("pod-%d", i))
		}
		if err != nil {
			t.Fatalf("name %d: %v", i, err)
		}
		slot, gen := id.slot(), uint32(id>>32)
		if slot >= MaxNodes {
			t.Fatalf("name %d: slot %d", i, slot)
		}
		if g, seen := lastGen[slot]; seen && gen <= g {
			t.Fatalf("name %d: slot %d reused with generation %d after %d", i, slot, gen, g)
		}
		lastGen[slot] = gen
		ids[i] = id
		if err := ix.Store(id, 1, 1000+uint64(i)); err != nil {
			t.Fatal(err)
		}
		if i >= window {
			ix.DropNode(ids[i-window]) // no sweep until every slot is used
		}
	}
	if sweeps == 0 {
		t.Fatal("names past MaxNodes never needed a sweep")
	}
	if len(lastGen) > MaxNodes {
		t.Fatalf("%d slots used", len(lastGen))
	}
	reused := 0
	for _, g := range lastGen {
		if g > 1 {
			reused++
		}
	}
	if reused == 0 {
		t.Fatal("no slot was reused")
	}
	live := ids[names-window:]
	want := slices.Clone(live)
	slices.SortFunc(want, func(a, b NodeID) int { return a.slot() - b.slot() })
	if got := ix.Holders(1); !slices.Equal(got, want) {
		t.Fatalf("holders of the shared block: %d nodes, want the %d live ones", len(got), len(want))
	}
	for i, id := range ids[:names-window] {
		if err := ix.Store(id, 7); !errors.Is(err, ErrUnknownNode) {
			t.Fatalf("Store with dropped id of name %d = %v, want ErrUnknownNode", i, err)
		}
		if err := ix.Remove(id, 1); !errors.Is(err, ErrUnknownNode) {
			t.Fatalf("Remove with dropped id of name %d = %v, want ErrUnknownNode", i, err)
		}
		if ix.NodeBlocks(id) != 0 || ix.Name(id) != "" {
			t.Fatalf("dropped id of name %d still answers: %d blocks, name %q", i, ix.NodeBlocks(id), ix.Name(id))
		}
		if m := ix.FindMatches([]uint64{1000 + uint64(i)}); len(m) != 0 {
			t.Fatalf("dropped name %d still matches: %v", i, m)
		}
	}
	for k, id := range live {
		i := names - window + k
		if got := ix.FindMatches([]uint64{1000 + uint64(i), 1}); !slices.Equal(got, []Match{{id, 2}}) {
			t.Fatalf("live name %d: matches %v, want [{%#x 2}]", i, got, uint64(id))
		}
		if n := ix.NodeBlocks(id); n != 2 {
			t.Fatalf("live name %d holds %d, want 2", i, n)
		}
	}
	ix.Sweep()
	st := ix.Metrics()
	if st.Nodes != window || st.Pairs != 2*window || st.Hashes != window+1 || st.Pending != 0 {
		t.Fatalf("stats %+v, want %d nodes, %d pairs, %d hashes", st, window, 2*window, window+1)
	}
	fresh, _ := New(Config{Shards: 8})
	for k := range window {
		i := names - window + k
		fresh.Store(mustID(t, fresh, fmt.Sprintf("pod-%d", i)), 1, 1000+uint64(i))
	}
	if ix.Digest() != fresh.Digest() {
		t.Fatal("digest differs from a fresh index with the live pairs")
	}
}

// MaxNodes live names fit; one more does not until one is dropped.
func TestMaxNodesLive(t *testing.T) {
	ix, _ := New(Config{Shards: 4})
	ids := make([]NodeID, MaxNodes)
	for i := range ids {
		ids[i] = mustID(t, ix, fmt.Sprintf("n%d", i))
		if err := ix.Store(ids[i], uint64(i)); err != nil {
			t.Fatal(err)
		}
	}
	if st := ix.Metrics(); st.Nodes != MaxNodes || st.Pairs != MaxNodes {
		t.Fatalf("at the limit: %+v", st)
	}
	_, err := ix.ID("one-past")
	if !errors.Is(err, ErrTooManyNodes) || !strings.Contains(err.Error(), "one-past") ||
		!strings.Contains(err.Error(), fmt.Sprint(MaxNodes)) {
		t.Fatalf("past the limit: %v, want ErrTooManyNodes naming the name and the limit", err)
	}
	// A live name is still found at the limit.
	if id, err := ix.ID("n7"); err != nil || id != ids[7] {
		t.Fatalf("ID of a live name at the limit = %#x, %v", uint64(id), err)
	}
	victim := ids[MaxNodes/2]
	ix.DropNode(victim)
	// The dropped slot waits for a sweep: Node does not sweep.
	if _, err := ix.ID("one-past"); !errors.Is(err, ErrTooManyNodes) || !strings.Contains(err.Error(), "waiting for a sweep") {
		t.Fatalf("after a drop, before the sweep: %v, want ErrTooManyNodes naming the sweep", err)
	}
	if n := ix.Sweep(); n != 1 {
		t.Fatalf("swept %d nodes, want 1", n)
	}
	id, err := ix.ID("one-past")
	if err != nil {
		t.Fatalf("after a drop and a sweep: %v", err)
	}
	if id.slot() != victim.slot() || id == victim {
		t.Fatalf("new id %#x, want the dropped slot %d with a new generation (old %#x)", uint64(id), victim.slot(), uint64(victim))
	}
	if got := ix.Holders(uint64(MaxNodes / 2)); len(got) != 0 {
		t.Fatalf("the successor inherited the dropped node's block: %v", got)
	}
	if err := ix.Store(victim, 1); !errors.Is(err, ErrUnknownNode) {
		t.Fatalf("Store with the dropped id = %v", err)
	}
	if _, err := ix.ID("two-past"); !errors.Is(err, ErrTooManyNodes) {
		t.Fatalf("past the limit again: %v", err)
	}
}

// A dropped id's slot goes to the next node only after a sweep, with a new
// generation; neither id sees the other's holdings.
func TestStaleIDNeverSeesSuccessor(t *testing.T) {
	ix, _ := New(Config{Shards: 4})
	a := mustID(t, ix, "a")
	ix.Store(a, 10, 11)
	ix.Store(a, 10) // two copies
	ix.DropNode(a)
	if got := ix.Holders(10); got != nil {
		t.Fatalf("a dropped node holds: %v", got)
	}
	if n := ix.Sweep(); n != 1 {
		t.Fatalf("swept %d, want 1", n)
	}
	b := mustID(t, ix, "b")
	if b.slot() != a.slot() || b == a {
		t.Fatalf("b = %#x, want a's slot with the next generation (a = %#x)", uint64(b), uint64(a))
	}
	ix.Store(b, 20)
	if got := ix.Holders(10); got != nil {
		t.Fatalf("b inherited a's block: %v", got)
	}
	if err := ix.Remove(a, 20); !errors.Is(err, ErrUnknownNode) {
		t.Fatalf("Remove with a's id = %v", err)
	}
	if got := ix.Holders(20); !slices.Equal(got, []NodeID{b}) {
		t.Fatalf("holders of b's block = %v", got)
	}
	if st := ix.Metrics(); st.Hashes != 1 || st.Pairs != 1 || ix.NodeBlocks(b) != 1 {
		t.Fatalf("stats %+v, b holds %d", st, ix.NodeBlocks(b))
	}
}

// DropNode is O(1): it takes no shard lock, so it cannot stall behind
// queries or scan inside membership's callbacks.
func TestDropNodeTakesNoShardLock(t *testing.T) {
	ix, _ := New(Config{Shards: 1})
	id := mustID(t, ix, "a")
	for h := range uint64(1000) {
		ix.Store(id, h)
	}
	ix.shards[0].mu.Lock()
	done := make(chan struct{})
	go func() {
		ix.DropNode(id)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("DropNode waited for a shard lock")
	}
	ix.shards[0].mu.Unlock()
	if got := ix.FindMatches([]uint64{1}); len(got) != 0 {
		t.Fatalf("a dropped node matches: %v", got)
	}
	if st := ix.Metrics(); st.Pending != 1 || st.Pairs != 0 || st.Hashes != 1000 {
		t.Fatalf("before the sweep: %+v", st)
	}
	ix.Sweep()
	if st := ix.Metrics(); st.Pending != 0 || st.Hashes != 0 {
		t.Fatalf("after the sweep: %+v", st)
	}
}

// With MaxNodes slots live or dropped but not swept, Node for a new name
// fails at once with ErrTooManyNodes and does not sweep (it runs inside
// membership's callbacks): it never waits for the sweep lock. Once the
// sweep runs, the name gets one of the freed slots.
func TestNodeNeverSweeps(t *testing.T) {
	const dropped = 3
	ix, _ := New(Config{Shards: 1})
	ids := make([]NodeID, MaxNodes)
	for i := range ids {
		ids[i] = mustID(t, ix, fmt.Sprintf("n%d", i))
		if err := ix.Store(ids[i], uint64(i)); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range ids[:dropped] {
		ix.DropNode(id)
	}
	// Held as a sweep under way would hold it: a Node that swept would
	// block here.
	ix.sweepMu.Lock()
	type result struct {
		id  NodeID
		err error
	}
	done := make(chan result, 1)
	go func() {
		id, err := ix.Node("new", 7)
		done <- result{id, err}
	}()
	select {
	case r := <-done:
		if !errors.Is(r.err, ErrTooManyNodes) || r.id != 0 {
			t.Fatalf("Node with every slot live or unswept = %#x, %v, want ErrTooManyNodes", uint64(r.id), r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Node waited for the sweep lock")
	}
	ix.sweepMu.Unlock()
	if st := ix.Metrics(); st.Pending != dropped || st.Nodes != MaxNodes-dropped || st.Hashes != MaxNodes {
		t.Fatalf("Node swept: %+v", st)
	}
	if n := ix.Sweep(); n != dropped {
		t.Fatalf("swept %d, want %d", n, dropped)
	}
	id, err := ix.Node("new", 7)
	if err != nil {
		t.Fatalf("after the sweep: %v", err)
	}
	if inc, ok := ix.Incarnation(id); !ok || inc != 7 {
		t.Fatalf("new id %#x: run %d, live %v", uint64(id), inc, ok)
	}
	if !slices.ContainsFunc(ids[:dropped], func(old NodeID) bool { return old.slot() == id.slot() }) {
		t.Fatalf("new id %#x is not in a swept slot", uint64(id))
	}
	if got := ix.Holders(uint64(id.slot())); len(got) != 0 {
		t.Fatalf("the new node inherited a swept block: %v", got)
	}
}

// Runs of a node: an older run is refused, a newer one replaces the old
// run's entries, and an id named before its run was known takes it.
func TestIncarnations(t *testing.T) {
	ix, _ := New(Config{Shards: 4})
	first, err := ix.Node("a", 5)
	if err != nil {
		t.Fatal(err)
	}
	ix.Store(first, 1)
	if id, err := ix.Node("a", 5); err != nil || id != first {
		t.Fatalf("same run: %#x, %v", uint64(id), err)
	}
	if id, err := ix.ID("a"); err != nil || id != first {
		t.Fatalf("any run: %#x, %v", uint64(id), err)
	}
	if _, err := ix.Node("a", 4); !errors.Is(err, ErrStaleIncarnation) {
		t.Fatalf("older run: %v, want ErrStaleIncarnation", err)
	}
	if got := ix.Holders(1); !slices.Equal(got, []NodeID{first}) {
		t.Fatalf("an older run's attempt changed the holders: %v", got)
	}
	next, err := ix.Node("a", 9)
	if err != nil || next == first {
		t.Fatalf("newer run: %#x, %v", uint64(next), err)
	}
	if got := ix.Holders(1); got != nil {
		t.Fatalf("the old run's block survived its restart: %v", got)
	}
	if inc, ok := ix.Incarnation(next); !ok || inc != 9 {
		t.Fatalf("incarnation %d %v, want 9", inc, ok)
	}
	// Named before the run was known.
	b, _ := ix.ID("b")
	if id, err := ix.Node("b", 3); err != nil || id != b {
		t.Fatalf("adopting a run: %#x, %v", uint64(id), err)
	}
	if _, err := ix.Node("b", 2); !errors.Is(err, ErrStaleIncarnation) {
		t.Fatalf("after adopting run 3, run 2: %v", err)
	}
}

// Writers, drops and sweeps at once: every live node holds exactly what it
// stored, never a predecessor's leftovers.
func TestChurnConcurrentWithSweeps(t *testing.T) {
	ix, _ := New(Config{Shards: 8})
	const writers, rounds = 4, 300
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var sweeper sync.WaitGroup
	sweeper.Add(1)
	go func() {
		defer sweeper.Done()
		for {
			select {
			case <-stop:
				return
			default:
				ix.Sweep()
			}
		}
	}()
	kept := make([][]NodeID, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				id, err := ix.ID(fmt.Sprintf("w%d-%d", w, r))
				if err != nil {
					t.Error(err)
					return
				}
				for h := range uint64(20) {
					if err := ix.Store(id, h, 1<<20+h*uint64(writers)+uint64(w)); err != nil {
						t.Error(err)
						return
					}
				}
				if r%5 == 0 {
					kept[w] = append(kept[w], id)
				} else {
					ix.DropNode(id)
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	sweeper.Wait()
	ix.Sweep()
	live := 0
	for w := range writers {
		for _, id := range kept[w] {
			live++
			if n := ix.NodeBlocks(id); n != 40 {
				t.Fatalf("%s holds %d, want 40", ix.Name(id), n)
			}
		}
	}
	if st := ix.Metrics(); st.Nodes != live || st.Pairs != int64(40*live) || st.Hashes != 20+20*writers {
		t.Fatalf("stats %+v, want %d nodes and %d pairs", st, live, 40*live)
	}
	if got := ix.Holders(3); len(got) != live {
		t.Fatalf("holders of a shared block: %d, want %d", len(got), live)
	}
}
