package fabric

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// testFolder returns a folded logger on buf with a clock the test moves
// and window ends the test runs (fire).
func testFolder(buf *bytes.Buffer) (log *slog.Logger, advance func(time.Duration), fire func() int) {
	now := time.Unix(0, 0)
	var due []func()
	h := newRepeatFolder(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}),
		func() time.Time { return now },
		func(_ time.Duration, f func()) { due = append(due, f) })
	fire = func() int {
		n := len(due)
		fs := due
		due = nil
		for _, f := range fs {
			f()
		}
		return n
	}
	return slog.New(h), func(d time.Duration) { now = now.Add(d) }, fire
}

// Identical records within the window are written once, and when the
// window ends the last of them with how many were left out; other records,
// other attributes and debug records pass.
func TestRepeatFolder(t *testing.T) {
	var buf bytes.Buffer
	base, advance, fire := testFolder(&buf)
	log := base.With("node", "n1")
	lines := func() []string { return strings.Split(strings.TrimSpace(buf.String()), "\n") }
	refused := func(peer string) {
		log.Info("transfer: refused a connection", "claimed_peer", peer, "err", "bad certificate")
	}

	for range 10 {
		refused("x")
		advance(100 * time.Millisecond)
	}
	refused("y") // another peer
	log.Debug("debug passes", "i", 1)
	log.Debug("debug passes", "i", 1)
	if got := lines(); len(got) != 4 {
		t.Fatalf("within the window, %d lines, want 4 (x once, y once, two debug):\n%s", len(got), buf.String())
	}
	buf.Reset()
	advance(repeatWindow)
	if n := fire(); n != 1 {
		t.Fatalf("%d window ends scheduled, want 1 (for x)", n)
	}
	if got := lines(); len(got) != 1 || !strings.Contains(got[0], "claimed_peer=x") || !strings.Contains(got[0], "repeated=9") {
		t.Fatalf("at the window's end: %q, want x's line saying repeated=9", buf.String())
	}
	// A burst that goes on after that: the next record past its window says
	// how many were left out, and the window end then has nothing to add.
	buf.Reset()
	refused("x")
	advance(repeatWindow)
	refused("x")
	fire()
	if got := lines(); len(got) != 1 || !strings.Contains(got[0], "repeated=1") {
		t.Fatalf("the next window: %q, want one line saying repeated=1", buf.String())
	}
	// Loggers with other attributes are other records.
	buf.Reset()
	base.With("node", "n2").Info("transfer: refused a connection", "claimed_peer", "x", "err", "bad certificate")
	if got := lines(); len(got) != 1 {
		t.Fatalf("the same message from another node's logger: %q, want it written", buf.String())
	}
}

// The folder remembers maxRepeatKeys records; one more distinct record
// starts its memory afresh.
func TestRepeatFolderMemoryLimit(t *testing.T) {
	var buf bytes.Buffer
	log, _, _ := testFolder(&buf)
	for i := range maxRepeatKeys {
		log.Info("distinct", "i", i)
	}
	buf.Reset()
	log.Info("distinct", "i", 0)
	if buf.Len() != 0 {
		t.Fatalf("at the limit the first record is forgotten: %q", buf.String())
	}
	log.Info("distinct", "i", maxRepeatKeys) // one past: the memory starts afresh
	buf.Reset()
	log.Info("distinct", "i", 0)
	if !strings.Contains(buf.String(), fmt.Sprintf("i=%d", 0)) {
		t.Fatalf("past the limit the first record should be written again, got %q", buf.String())
	}
}

// A logSpacing logs the first event, then the first at least its interval
// after the one logged before (exactly at the interval included), each
// with the events not logged since; an event that is not logged counts
// nothing itself. Concurrent events log one line between them.
func TestLogSpacing(t *testing.T) {
	const every = 10 * time.Second
	var s logSpacing
	at := time.Unix(1000, 0)
	for _, step := range []struct {
		after     time.Duration // since the start
		log       bool
		notLogged int
	}{
		{0, true, 0},
		{time.Second, false, 0},
		{every - 1, false, 0},
		{every, true, 2},
		{every + 1, false, 0},
		{3 * every, true, 1},
		{5 * every, true, 0},
	} {
		log, notLogged := s.due(at.Add(step.after), every)
		if log != step.log || notLogged != step.notLogged {
			t.Fatalf("at %v: logged %v with %d not logged, want %v with %d", step.after, log, notLogged, step.log, step.notLogged)
		}
	}

	// Many at once: one logs, and the next line counts the others.
	var c logSpacing
	const n = 16
	logged := make(chan bool, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			log, _ := c.due(at, every)
			logged <- log
		})
	}
	wg.Wait()
	close(logged)
	lines := 0
	for l := range logged {
		if l {
			lines++
		}
	}
	if log, notLogged := c.due(at.Add(every), every); lines != 1 || !log || notLogged != n-1 {
		t.Fatalf("%d concurrent events logged %d lines, then the next: logged %v with %d not logged; want 1, then true with %d",
			n, lines, log, notLogged, n-1)
	}
}
