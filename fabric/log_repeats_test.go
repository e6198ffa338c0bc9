package fabric

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// Identical records within the window are written once; the next one
// after it says how many were left out; other records, other attributes
// and debug records pass.
func TestRepeatFolder(t *testing.T) {
	var buf bytes.Buffer
	now := time.Unix(0, 0)
	clock := func() time.Time { return now }
	log := slog.New(newRepeatFolder(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}), clock)).With("node", "n1")
	lines := func() []string { return strings.Split(strings.TrimSpace(buf.String()), "\n") }

	for range 10 {
		log.Info("transfer: refused a connection", "claimed_peer", "x", "err", "bad certificate")
		now = now.Add(100 * time.Millisecond)
	}
	log.Info("transfer: refused a connection", "claimed_peer", "y", "err", "bad certificate") // another peer
	log.Debug("debug passes", "i", 1)
	log.Debug("debug passes", "i", 1)
	if got := lines(); len(got) != 4 {
		t.Fatalf("within the window, %d lines, want 4 (x once, y once, two debug):\n%s", len(got), buf.String())
	}
	buf.Reset()
	now = now.Add(repeatWindow) // the window of x's first line has passed
	log.Info("transfer: refused a connection", "claimed_peer", "x", "err", "bad certificate")
	if got := lines(); len(got) != 1 || !strings.Contains(got[0], "claimed_peer=x") || !strings.Contains(got[0], "repeated=9") {
		t.Fatalf("after the window: %q, want x's line saying repeated=9", buf.String())
	}
	buf.Reset()
	// The count starts again from the line just written.
	log.Info("transfer: refused a connection", "claimed_peer", "x", "err", "bad certificate")
	now = now.Add(repeatWindow)
	log.Info("transfer: refused a connection", "claimed_peer", "x", "err", "bad certificate")
	if got := lines(); len(got) != 1 || !strings.Contains(got[0], "repeated=1") {
		t.Fatalf("the next window: %q, want one line saying repeated=1", buf.String())
	}
	// Loggers with other attributes are other records.
	buf.Reset()
	log.With("node", "n2").Info("transfer: refused a connection", "claimed_peer", "x", "err", "bad certificate")
	if got := lines(); len(got) != 1 {
		t.Fatalf("the same message from another node's logger: %q, want it written", buf.String())
	}
}
