package fabric

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric/index"
	"github.com/kvfabric/kvfabric/membership"
	"github.com/kvfabric/kvfabric/pool"
)

// lockedLog collects log records written from any goroutine.
type lockedLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// lines counts the records that contain s.
func (l *lockedLog) lines(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.b.String(), s)
}

// refusedLine is in the record of a refusal past index_max_node_blocks.
const refusedLine = "more blocks than the index keeps for one node"

// cappedSink returns a sink of node "self" over an index that keeps most
// hashes per node, as the agent makes it, and the log it writes.
func cappedSink(t *testing.T, most int) (*indexSink, *index.Index, *lockedLog) {
	t.Helper()
	ix, err := index.New(index.Config{Shards: 4, MaxNodeBlocks: int64(most), Self: "self"})
	if err != nil {
		t.Fatal(err)
	}
	log := &lockedLog{}
	a := &Agent{index: ix, log: slog.New(slog.NewTextHandler(log, nil)), done: make(chan struct{})}
	a.cfg.IndexMaxNodeBlocks, a.cfg.NodeName, a.cfg.NoClusterEviction = most, "self", true
	return newIndexSink(a), ix, log
}

func hashRange(from, n uint64) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = from + uint64(i)
	}
	return out
}

// heldOf returns the hashes of hs that holder name holds in ix.
func heldOf(ix *index.Index, name string, hs []uint64) []uint64 {
	id, ok := ix.Lookup(name)
	if !ok {
		return nil
	}
	var out []uint64
	for _, h := range hs {
		if slices.Contains(ix.Holders(h), id) {
			out = append(out, h)
		}
	}
	return out
}

// Whole mode: a holder that gossips stores of more hashes than the index
// keeps for one node has the first ones indexed and the rest refused and
// counted, logged once however many calls pass the bound; its removes
// make room again, and another holder's events are indexed as before.
func TestSinkStopsAtIndexMaxNodeBlocks(t *testing.T) {
	const most = 16
	s, ix, log := cappedSink(t, most)
	s.Apply(sinkEvents("m", 1, membership.EventStore, hashRange(1, most)...))
	if got := len(heldOf(ix, "m", hashRange(1, most))); got != most {
		t.Fatalf("at the bound: %d of m's hashes indexed, want %d", got, most)
	}
	if n := log.lines(refusedLine); n != 0 {
		t.Fatalf("at the bound: %d refusals logged, want none", n)
	}
	for i := range 3 {
		s.Apply(sinkEvents("m", 1, membership.EventStore, hashRange(uint64(1000*(i+1)), 500)...))
	}
	if got := ix.Metrics().Refused; got != 1500 {
		t.Fatalf("past the bound: %d stores refused, want 1500", got)
	}
	if got := heldOf(ix, "m", hashRange(1000, 3000)); len(got) != 0 {
		t.Fatalf("past the bound, hashes %v of m are indexed", got)
	}
	if n := log.lines(refusedLine); n != 1 {
		t.Fatalf("three calls past the bound logged %d times, want once", n)
	}
	// A disk tier's stores past the bound are not counted as disk copies
	// either; those of hashes held are.
	onDisk := sinkEvents("m", 1, membership.EventStore, 1, 9000, 9001)
	for i := range onDisk {
		onDisk[i].BlockSet = tierSetBase
	}
	s.Apply(onDisk)
	if got := s.a.tierHeld.Len(); got != 1 {
		t.Fatalf("disk copies counted past the bound: %d, want 1 (of a hash held)", got)
	}
	// Another holder is indexed as before, m's removes make room.
	s.Apply(sinkEvents("o", 1, membership.EventStore, hashRange(1000, most)...))
	if got := len(heldOf(ix, "o", hashRange(1000, most))); got != most {
		t.Fatalf("another holder: %d of its %d hashes indexed", got, most)
	}
	s.Apply(append(sinkEvents("m", 1, membership.EventRemove, 2, 3), sinkEvents("m", 1, membership.EventStore, 7000, 7001, 7002)...))
	if got := heldOf(ix, "m", []uint64{2, 3, 7000, 7001, 7002}); !slices.Equal(got, []uint64{7000, 7001}) {
		t.Fatalf("after two removes and three stores m holds %v, want [7000 7001]", got)
	}
}

// Owned mode: an origin's ops calls past the bound are answered applied
// (its stream goes on), their stores past it are not kept and are counted,
// and another origin's ops are kept as before.
func TestOwnedApplyStopsAtIndexMaxNodeBlocks(t *testing.T) {
	const most = 32
	s, ix, log := cappedSink(t, most)
	slice := index.NewSlice(ix, s.Drop)
	var applied atomic.Uint64
	call := func(origin string, first uint64, replace bool, hs []uint64) {
		t.Helper()
		ops := make([]index.Op, len(hs))
		for i, h := range hs {
			ops[i] = index.Op{Kind: index.OpStore, Hash: h}
		}
		ans, err := applyOps(slice, origin, index.OpsCall{Inc: 1, First: first, Replace: replace, Ops: ops}, &applied, s.refused)
		if err != nil || !slices.Equal(ans, []byte{ansApplied}) {
			t.Fatalf("%s's call of %d stores from %d: %v, %v; want applied", origin, len(ops), first, ans, err)
		}
	}
	call("m", 1, true, hashRange(1, index.MaxOpsPerCall))
	call("m", 1+index.MaxOpsPerCall, false, hashRange(1+index.MaxOpsPerCall, index.MaxOpsPerCall))
	if got := applied.Load(); got != 2*index.MaxOpsPerCall {
		t.Fatalf("%d ops counted applied, want %d", got, 2*index.MaxOpsPerCall)
	}
	m, _ := ix.Lookup("m")
	if got := ix.NodeBlocks(m); got != most {
		t.Fatalf("the slice holds %d hashes of m, want %d", got, most)
	}
	if got, want := ix.Metrics().Refused, int64(2*index.MaxOpsPerCall-most); got != want {
		t.Fatalf("%d stores refused, want %d", got, want)
	}
	if n := log.lines(refusedLine); n != 1 {
		t.Fatalf("two calls past the bound logged %d times, want once", n)
	}
	call("o", 1, true, hashRange(1, most))
	if got := len(heldOf(ix, "o", hashRange(1, most))); got != most {
		t.Fatalf("another origin: %d of its %d hashes kept", got, most)
	}
}

// The agent's --index-max-node-blocks bounds its index: an ops call served
// past it keeps that many of the origin's hashes.
func TestOwnedAgentIndexMaxNodeBlocks(t *testing.T) {
	const most = 64
	a := tierAgentWith(t, IndexOwned, func(c *Config) { c.IndexMaxNodeBlocks = most })
	ops := make([]index.Op, 1000)
	for i := range ops {
		ops[i] = index.Op{Kind: index.OpStore, Hash: uint64(i+1) * 0x9e3779b97f4a7c15}
	}
	ans, err := a.owned.serve(context.Background(), "m", appendOpsCall(nil, index.OpsCall{Inc: 1, First: 1, Replace: true, Ops: ops}))
	if err != nil || !slices.Equal(ans, []byte{ansApplied}) {
		t.Fatalf("an ops call past the bound: %v, %v; want applied", ans, err)
	}
	m, _ := a.index.Lookup("m")
	if got := a.index.NodeBlocks(m); got != most {
		t.Fatalf("the agent's index holds %d hashes of m, want %d", got, most)
	}
	if got := a.Metrics().Index.Refused; got != int64(len(ops)-most) {
		t.Fatalf("Metrics().Index.Refused = %d, want %d", got, len(ops)-most)
	}
}

// Whole mode: this node's own events are indexed past the bound, disk
// copies included (its pools and tiers bound them, and a store refused
// would lose its local hits for good), while another holder's past it are
// refused, counted and logged, naming that holder.
func TestSinkStoresOwnPastIndexMaxNodeBlocks(t *testing.T) {
	const most = 16
	s, ix, log := cappedSink(t, most)
	own := sinkEvents("self", 1, membership.EventStore, hashRange(1, 3*most)...)
	for i := range own[:most] {
		own[i].BlockSet = tierSetBase
	}
	s.Apply(own)
	if got := len(heldOf(ix, "self", hashRange(1, 3*most))); got != 3*most {
		t.Fatalf("this node's own stores: %d of %d indexed", got, 3*most)
	}
	if got := s.a.tierHeld.Len(); got != most {
		t.Fatalf("this node's disk copies counted: %d, want %d", got, most)
	}
	s.Apply(sinkEvents("m", 1, membership.EventStore, hashRange(1, 3*most)...))
	if got := len(heldOf(ix, "m", hashRange(1, 3*most))); got != most {
		t.Fatalf("another holder's stores: %d indexed, want %d", got, most)
	}
	if got := ix.Metrics().Refused; got != 2*most {
		t.Fatalf("%d stores refused, want %d (none of this node's)", got, 2*most)
	}
	if n, m := log.lines(refusedLine), log.lines("peer=m "); n != 1 || m != 1 {
		t.Fatalf("refusals logged %d times, %d naming m; want once, naming m", n, m)
	}
}

// Owned mode: the agent's slice keeps the stores of its own blocks past
// the bound (alone in its cluster, it owns every hash of its own), sent
// as its holdings are, and another origin's past it are refused.
func TestOwnedAgentStoresOwnPastIndexMaxNodeBlocks(t *testing.T) {
	const most, own = 64, 1000
	a := tierAgentWith(t, IndexOwned, func(c *Config) { c.IndexMaxNodeBlocks = most })
	hashes := make([]uint64, own)
	for i := range hashes {
		hashes[i] = uint64(i+1) * 0x9e3779b97f4a7c15
	}
	a.owned.publishHeld(true, true, hashes)
	waitUntil(t, 10*time.Second, "the agent's own stores indexed", func() error {
		if id, ok := a.index.Lookup(a.cfg.NodeName); !ok || a.index.NodeBlocks(id) < own {
			return fmt.Errorf("%d of its own hashes indexed, want %d", a.index.NodeBlocks(id), own)
		}
		return nil
	})
	ops := make([]index.Op, own)
	for i, h := range hashes {
		ops[i] = index.Op{Kind: index.OpStore, Hash: h}
	}
	ans, err := a.owned.serve(context.Background(), "m", appendOpsCall(nil, index.OpsCall{Inc: 1, First: 1, Replace: true, Ops: ops}))
	if err != nil || !slices.Equal(ans, []byte{ansApplied}) {
		t.Fatalf("m's ops call past the bound: %v, %v; want applied", ans, err)
	}
	m, _ := a.index.Lookup("m")
	if got := a.index.NodeBlocks(m); got != most {
		t.Fatalf("the agent's index holds %d hashes of m, want %d", got, most)
	}
	if got := a.Metrics().Index.Refused; got != own-most {
		t.Fatalf("Metrics().Index.Refused = %d, want %d (m's alone)", got, own-most)
	}
}

// indexBoundLine is in the record of a node whose pools and tiers hold
// more blocks than --index-max-node-blocks.
const indexBoundLine = "raise --index-max-node-blocks"

// The agent warns where its pools and tiers hold more blocks than
// --index-max-node-blocks: at start, of the tiers' configured block size,
// and as a block set of a smaller block size is made; once a size.
func TestIndexBoundWarned(t *testing.T) {
	// A 16 MiB pool and a 64 MiB tier: 256 + 1024 blocks of 64 KiB.
	const room = 16<<20/(64<<10) + 64<<20/(64<<10)
	start := func(most int) (*Agent, *lockedLog) {
		log := &lockedLog{}
		a := tierAgentWith(t, IndexWhole, func(c *Config) {
			c.IndexMaxNodeBlocks, c.TierBlockBytes = most, 64<<10
			c.Logger = slog.New(slog.NewTextHandler(log, nil))
		})
		return a, log
	}
	_, log := start(room - 1)
	if n := log.lines(indexBoundLine); n != 1 {
		t.Fatalf("%d blocks of room past a bound of %d: %d warnings at start, want 1", room, room-1, n)
	}
	a, log := start(room)
	if n := log.lines(indexBoundLine); n != 0 {
		t.Fatalf("%d blocks of room at the bound: %d warnings at start, want none", room, n)
	}
	// Blocks of 1 KiB: the pool holds 16,384 of them.
	sess := &session{id: 7, engine: "e", sets: map[pool.SetID]*engineSet{}}
	if _, err := a.blockSetForSession(sess, "e", belowLayout(16), nil, 0); err != nil {
		t.Fatal(err)
	}
	if n := log.lines(indexBoundLine); n != 1 {
		t.Fatalf("a block set of small blocks: %d warnings, want 1", n)
	}
	a.warnIndexBound(belowLayout(16).Strides().Block, "the same size again")
	if n := log.lines(indexBoundLine); n != 1 {
		t.Fatalf("the same block size again: %d warnings, want still 1", n)
	}
}
