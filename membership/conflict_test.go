package membership

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// A second node under a taken name refuses to start, naming the first
// one's address, and the third node it joined through keeps every block of
// the real node and goes on applying its events.
func TestDuplicateNameRefusedAtStart(t *testing.T) {
	c := newCluster(t, 2, nil) // node-00 (the real one) and node-01
	waitFor(t, 20*time.Second, "2 nodes see each other", func() bool { return c.allSee(2) })
	real, third := c.nodes[0], c.nodes[1]
	for h := range uint64(50) {
		real.m.Publish(EventStore, 1, 1000+h)
	}
	waitFor(t, 10*time.Second, "the third node indexes the real node's blocks", func() bool {
		return third.sink.count("node-00") == 50
	})

	cfg := testConfig("node-00", 12)
	cfg.Seeds = []string{third.m.Addr().String()}
	cfg.Sink = newMapSink()
	cfg.Logger = slog.New(&logCapture{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dup, err := Start(ctx, cfg)
	if err == nil {
		dup.shutdown(false)
		t.Fatal("a second node-00 started")
	}
	var ne *NameConflictError
	if !errors.Is(err, ErrNameConflict) || !errors.As(err, &ne) {
		t.Fatalf("err = %v, want a NameConflictError", err)
	}
	if ne.Other != real.m.Addr() || !strings.Contains(err.Error(), real.m.Addr().String()) ||
		ne.OtherIncarnation != real.m.Incarnation() {
		t.Fatalf("err = %v (%+v), want it to name %s, run %d", err, ne, real.m.Addr(), real.m.Incarnation())
	}
	checkRealNodeKept(t, c, real, third, 50)
}

// A duplicate that runs for a while alone, with blocks of its own, and then
// meets the cluster: it stops by itself (without a leave, which would name
// the real node too), and its state exchange does not make the third node
// drop the real node's blocks or ignore its later events.
func TestDuplicateNameStopsWhenFoundLater(t *testing.T) {
	c := newCluster(t, 2, nil)
	waitFor(t, 20*time.Second, "2 nodes see each other", func() bool { return c.allSee(2) })
	real, third := c.nodes[0], c.nodes[1]
	for h := range uint64(50) {
		real.m.Publish(EventStore, 1, 1000+h)
	}
	waitFor(t, 10*time.Second, "the third node indexes the real node's blocks", func() bool {
		return third.sink.count("node-00") == 50
	})

	cfg := testConfig("node-00", 12)
	cfg.Sink = newMapSink()
	logs := &logCapture{}
	cfg.Logger = slog.New(logs)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dup, err := Start(ctx, cfg) // alone: nothing to conflict with yet
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dup.Close() })
	for h := range uint64(5) {
		dup.Publish(EventStore, 1, 9000+h)
	}
	dup.flush()
	if dup.Incarnation() <= real.m.Incarnation() {
		t.Fatalf("the duplicate's run %d is not newer than %d", dup.Incarnation(), real.m.Incarnation())
	}
	// The third node reaches the duplicate (as after a partition heals).
	if _, err := third.m.ml.Join([]string{dup.Addr().String()}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-dup.Stopped():
	case <-time.After(10 * time.Second):
		t.Fatal("the duplicate did not stop")
	}
	var ne *NameConflictError
	if err := dup.Err(); !errors.As(err, &ne) || ne.Other != real.m.Addr() {
		t.Fatalf("Err = %v, want a NameConflictError naming %s", err, real.m.Addr())
	}
	waitFor(t, 10*time.Second, "the duplicate closed", func() bool { return dup.closed.Load() })
	if logs.matching("ERROR", "stopping") == 0 {
		t.Error("the duplicate did not log why it stopped")
	}
	if third.sink.count("node-00") != 50 || third.sink.has("node-00", 9000) {
		t.Fatalf("the third node's view of node-00 changed: %d entries, duplicate's block %v",
			third.sink.count("node-00"), third.sink.has("node-00", 9000))
	}
	checkRealNodeKept(t, c, real, third, 50)
}

// checkRealNodeKept: the real node stays a member of the third node, all
// its blocks stay indexed there, and its later events are applied, through
// several push/pull rounds after the duplicate went.
func checkRealNodeKept(t *testing.T, c *cluster, real, third *testNode, have int) {
	t.Helper()
	for h := range uint64(10) {
		real.m.Publish(EventStore, 1, 2000+h)
	}
	waitFor(t, 10*time.Second, "the third node applies the real node's later events", func() bool {
		return third.sink.has("node-00", 2009)
	})
	// Several push/pull intervals: nothing of the duplicate comes back.
	until := time.Now().Add(3 * c.nodes[0].m.cfg.PushPullInterval)
	for time.Now().Before(until) {
		if n := third.sink.count("node-00"); n != have+10 {
			t.Fatalf("the third node indexes %d blocks of node-00, want %d", n, have+10)
		}
		if _, ok := third.m.Member("node-00"); !ok {
			t.Fatal("the real node-00 is no longer a member on the third node")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if mb, _ := third.m.Member("node-00"); mb.Addr != real.m.Addr() {
		t.Fatalf("node-00 is at %s on the third node, want %s", mb.Addr, real.m.Addr())
	}
}

func TestYieldsToTheEarlierRun(t *testing.T) {
	lo, hi := netip.MustParseAddrPort("127.0.0.1:7000"), netip.MustParseAddrPort("127.0.0.2:7000")
	for _, tc := range []struct {
		desc     string
		ours     uint64
		self     netip.AddrPort
		other    Member
		yieldsTo bool
	}{
		{"the other started first", 20, lo, Member{Addr: hi, Meta: Meta{Incarnation: 10}}, true},
		{"the other started later", 10, lo, Member{Addr: hi, Meta: Meta{Incarnation: 20}}, false},
		{"same run, greater address yields", 10, hi, Member{Addr: lo, Meta: Meta{Incarnation: 10}}, true},
		{"same run, smaller address stays", 10, lo, Member{Addr: hi, Meta: Meta{Incarnation: 10}}, false},
		{"unreadable metadata, by address", 5, hi, Member{Addr: lo, MetaErr: errors.New("bad")}, true},
		{"unreadable metadata, by address, stays", 5, lo, Member{Addr: hi, MetaErr: errors.New("bad")}, false},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			m := &Membership{cfg: Config{Incarnation: tc.ours}}
			if got := m.yields(tc.self, tc.other); got != tc.yieldsTo {
				t.Fatalf("yields = %v, want %v", got, tc.yieldsTo)
			}
		})
	}
}

// A node that crashed and restarts at another address before the cluster
// has declared its previous run dead sees its own name at the old address:
// that run does not answer, so the new one starts and stays up. (With
// -kvfabric.long: the cluster then takes the new run in, with its blocks.)
func TestRestartAtNewAddressNotRefused(t *testing.T) {
	c := newCluster(t, 2, nil)
	waitFor(t, 20*time.Second, "2 nodes see each other", func() bool { return c.allSee(2) })
	old, third := c.nodes[0], c.nodes[1]
	old.m.Publish(EventStore, 1, 1000)
	waitFor(t, 10*time.Second, "the third node indexes the old run's block", func() bool {
		return third.sink.has("node-00", 1000)
	})
	oldAddr := old.m.Addr()
	old.m.shutdown(false) // a crash: no leave

	cfg := testConfig("node-00", 12)
	cfg.Seeds = []string{third.m.Addr().String()}
	cfg.Sink = newMapSink()
	cfg.Repairer = c.repairer
	logs := &logCapture{}
	cfg.Logger = slog.New(logs)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	re, err := Start(ctx, cfg)
	if err != nil {
		t.Fatalf("the new run of node-00 refused to start: %v", err)
	}
	t.Cleanup(func() { re.shutdown(false) })
	c.repairer.mu.Lock()
	c.repairer.nodes["node-00"] = re
	c.repairer.mu.Unlock()
	// Alive, suspect or dead, memberlist keeps the old address until it
	// reaps the record, and reports the conflict.
	if logs.matching("INFO", "does not answer") == 0 {
		t.Fatalf("the new run did not meet its previous run's record at %s", oldAddr)
	}
	select {
	case <-re.Stopped():
		t.Fatalf("the new run stopped: %v", re.Err())
	case <-time.After(3 * time.Second):
	}
	if !*long {
		return
	}
	re.Publish(EventStore, 1, 2000)
	waitFor(t, 90*time.Second, "the third node takes the new run in", func() bool {
		mb, ok := third.m.Member("node-00")
		return ok && mb.Addr == re.Addr() && third.sink.has("node-00", 2000) && !third.sink.has("node-00", 1000)
	})
}
