package fabric

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/internal/wait"
	"github.com/kvfabric/kvfabric/membership"
	"github.com/kvfabric/kvfabric/transfer"
)

var long = flag.Bool("kvfabric.long", false, "run the slow suites (late joiners after hundreds of thousands of events)")

// repairAgent starts an agent named name on 127.0.0.ip, under dir shared
// with the agents it joins (join, if not empty), with peer frames capped at
// frameCap (zero: the default).
// repairPair starts n1 and n2, n2 joined to n1, peer frames capped at
// frameCap, and waits until n2 sees n1.
func repairPair(t *testing.T, frameCap uint32) (n1, n2 *Agent) {
	t.Helper()
	dir := t.TempDir()
	n1 = repairAgent(t, dir, "n1", 1, "", frameCap)
	n2 = repairAgent(t, dir, "n2", 2, n1.GossipAddr(), frameCap)
	waitUntil(t, 10*time.Second, "n2 sees n1", func() error {
		if _, ok := n2.member("n1"); !ok {
			return errors.New("n1 is not a member yet")
		}
		return nil
	})
	return n1, n2
}

func repairAgent(t *testing.T, dir, name string, ip int, join string, frameCap uint32) *Agent {
	t.Helper()
	c := DefaultLocalConfig()
	c.NodeName, c.DataDir, c.DevCADir = name, filepath.Join(dir, name), filepath.Join(dir, "ca")
	addr := fmt.Sprintf("127.0.0.%d", ip)
	c.GossipAddr, c.PeerAddr, c.MetricsAddr = addr+":0", addr+":0", "off"
	c.Pools = []string{"host=16MiB"}
	c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		c.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	if join != "" {
		c.Join = []string{join}
	}
	c.maxMessageSize = frameCap
	a, err := Start(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

// indexed is how many blocks of origin a's index holds.
func indexed(a *Agent, origin string) int {
	id, err := a.index.ID(origin)
	if err != nil {
		return -1
	}
	return int(a.index.NodeBlocks(id))
}

func waitUntil(t *testing.T, d time.Duration, what string, cond func() error) time.Duration {
	t.Helper()
	return wait.For(t, d, what, cond)
}

// publishMany publishes n store events of distinct hashes on a, in runs.
func publishMany(t *testing.T, a *Agent, n int) {
	t.Helper()
	hashes := make([]uint64, 0, 4096)
	for i := range n {
		hashes = append(hashes, uint64(i)*0x9e3779b97f4a7c15+1)
		if len(hashes) == cap(hashes) || i == n-1 {
			if _, err := a.members.Publish(membership.EventStore, 1, hashes...); err != nil {
				t.Fatal(err)
			}
			hashes = hashes[:0]
		}
	}
}

// A node that joins after more events than the origin's log keeps catches
// up from a snapshot, fetched in pages when it does not fit one frame.
// The short variant caps frames at 64 KiB so that its snapshot of 100,000
// entries takes many; the long one publishes 450,000 under the default
// 4 MiB frames, a snapshot larger than one of them.
func TestLateJoinerAfterManyEvents(t *testing.T) {
	events, frameCap := 100_000, uint32(64<<10)
	if *long {
		events, frameCap = 450_000, 0
	}
	dir := t.TempDir()
	n1 := repairAgent(t, dir, "n1", 1, "", frameCap)
	publishMany(t, n1, events)
	// The whole snapshot, encoded, is larger than one frame.
	limit := int(frameCap)
	if limit == 0 {
		limit = int(transfer.DefaultConfig().MaxMessageSize)
	}
	if size := membership.MaxBatchLen("n1", events); size <= limit {
		t.Fatalf("a snapshot of %d entries takes %d bytes, not more than a frame of %d", events, size, limit)
	}
	n2 := repairAgent(t, dir, "n2", 2, n1.GossipAddr(), frameCap)
	took := waitUntil(t, 60*time.Second, "the late joiner indexes every block of n1", func() error {
		if got := indexed(n2, "n1"); got != events {
			return fmt.Errorf("n2 indexes %d of n1's %d blocks (metrics %+v)", got, events, n2.members.Metrics())
		}
		return nil
	})
	t.Logf("late joiner indexed %d blocks of n1 %v after joining", events, took)
	m := n2.members.Metrics()
	if m.SnapshotRepairs == 0 {
		t.Errorf("n2 caught up without a snapshot although n1's log keeps fewer events: %+v", m)
	}
	// Status counts the same repairs.
	s, err := (&engineServer{a: n2}).Status(context.Background(), &fabricpb.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if s.GossipSnapshotRepairs != m.SnapshotRepairs || s.GossipRangeRepairs != m.RangeRepairs {
		t.Errorf("status: %d range and %d snapshot repairs, membership's metrics %d and %d",
			s.GossipRangeRepairs, s.GossipSnapshotRepairs, m.RangeRepairs, m.SnapshotRepairs)
	}
}

// The repairer asks the origin for at most transfer.MaxEventRange events
// at a time, and an answer that one frame cannot carry comes back short,
// to be asked for again from after it.
func TestRepairerClampsRanges(t *testing.T) {
	n1, n2 := repairPair(t, 64<<10)
	publishMany(t, n1, 50_000)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r := repairer{n2}
	inc := n1.members.Incarnation()
	var got []membership.Event
	for from := uint64(1); from <= 50_000; {
		evs, err := r.Events(ctx, "n1", inc, from, 1<<40) // far past the cap and the log
		if err != nil {
			t.Fatalf("events from %d: %v", from, err)
		}
		if len(evs) == 0 || len(evs) > transfer.MaxEventRange {
			t.Fatalf("events from %d: %d events", from, len(evs))
		}
		got = append(got, evs...)
		from = evs[len(evs)-1].Seq + 1
	}
	if len(got) != 50_000 {
		t.Fatalf("paged %d events, want 50000", len(got))
	}
	for i, e := range got {
		if e.Seq != uint64(i)+1 || e.Hash != uint64(i)*0x9e3779b97f4a7c15+1 {
			t.Fatalf("event %d is #%d hash %d", i, e.Seq, e.Hash)
		}
	}
	if evs, err := r.Events(ctx, "n1", inc, 50_001, 1<<40); err != nil || len(evs) != 0 {
		t.Fatalf("events past the last: %d, %v; want none", len(evs), err)
	}
	// Past the log: gone, and the snapshot is served instead.
	publishMany(t, n1, 70_000)
	if _, err := r.Events(ctx, "n1", inc, 1, 1<<40); !errors.Is(err, membership.ErrRangeGone) {
		t.Fatalf("events that left the log: %v, want ErrRangeGone", err)
	}
	s, err := r.Snapshot(ctx, "n1")
	if err != nil || len(s.Entries) != int(s.Seq) || s.Seq > 120_000 || s.Incarnation != inc {
		t.Fatalf("snapshot: %d entries as of %d/%d, %v; want as many as its Seq, as of %d/120000", len(s.Entries), s.Incarnation, s.Seq, err, inc)
	}
	// n1 shares a snapshot frozen in the last few seconds: an older one
	// only if n2's own repair took one (counted once it has all pages).
	if s.Seq != 120_000 {
		waitUntil(t, 10*time.Second, fmt.Sprintf("a snapshot as of %d, not 120000, was taken by n2's repair", s.Seq), func() error {
			if n2.members.Metrics().SnapshotRepairs == 0 {
				return errors.New("n2 made no snapshot repair")
			}
			return nil
		})
	}
}

// A snapshot of as many entries as the reader accepts is taken, one more
// is refused (the real limit, membership.MaxSnapshotEntries, is 64 Mi
// entries; the check is the same).
func TestSnapshotEntryLimit(t *testing.T) {
	n1, n2 := repairPair(t, 4<<10)
	publishMany(t, n1, 3000) // several pages of 4 KiB frames
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r := repairer{n2}
	s, err := r.snapshot(ctx, "n1", 3000)
	if err != nil || len(s.Entries) != 3000 {
		t.Fatalf("snapshot at the limit: %d entries, %v", len(s.Entries), err)
	}
	if _, err := r.snapshot(ctx, "n1", 2999); !errors.Is(err, membership.ErrMalformed) {
		t.Fatalf("snapshot one past the limit: %v, want ErrMalformed", err)
	}
}

// While other nodes read every snapshot the origin keeps, a new one is
// refused as unavailable (the reader's next repair asks again), and the
// snapshots being read stay readable.
func TestSnapshotBusyIsUnavailable(t *testing.T) {
	n1, n2 := repairPair(t, 4<<10)
	publishMany(t, n1, 1000) // several pages of 4 KiB frames
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p, err := repairer{n2}.peer(ctx, "n1")
	if err != nil {
		t.Fatal(err)
	}
	first := func() (transfer.EventRange, error) {
		return p.EventRange(ctx, transfer.EventQuery{Origin: "n1", Snapshot: true})
	}
	// reread reads a page of the snapshot as of seq, keeping it in use.
	reread := func(seq uint64) {
		t.Helper()
		er, err := p.EventRange(ctx, transfer.EventQuery{Origin: "n1", Snapshot: true, SnapshotSeq: seq, Offset: 1})
		if err != nil || er.SnapshotNeeded || er.SnapshotSeq != seq {
			t.Fatalf("page of the snapshot as of %d, being read: seq %d, dropped %v, %v", seq, er.SnapshotSeq, er.SnapshotNeeded, err)
		}
	}
	a, err := first()
	if err != nil || !a.More {
		t.Fatalf("first snapshot: more %v, %v; want several pages", a.More, err)
	}
	hash := uint64(1 << 60)
	publish := func() {
		hash++
		if _, err := n1.members.Publish(membership.EventStore, 1, hash); err != nil {
			t.Fatal(err)
		}
	}
	publish()
	var b uint64
	wait.Every(t, 200*time.Millisecond, 30*time.Second, "n1 freezes a second snapshot once the first is too old to share", func() error {
		reread(a.SnapshotSeq)
		er, err := first()
		if err != nil {
			return err
		}
		if er.SnapshotSeq == a.SnapshotSeq {
			return fmt.Errorf("the snapshot as of %d is still shared", a.SnapshotSeq)
		}
		b = er.SnapshotSeq
		return nil
	})
	publish()
	var busy error
	wait.Every(t, 200*time.Millisecond, 30*time.Second, "n1 refuses a third snapshot while both are read", func() error {
		reread(a.SnapshotSeq)
		reread(b)
		er, err := first()
		if err == nil {
			return fmt.Errorf("a first page as of %d was served", er.SnapshotSeq)
		}
		busy = err
		return nil
	})
	if !errors.Is(busy, transfer.ErrUnavailable) {
		t.Fatalf("a third snapshot while both are read: %v, want ErrUnavailable", busy)
	}
	reread(a.SnapshotSeq)
	reread(b)
}
