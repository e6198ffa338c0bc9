package fabric

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// A node that joins (or restarts into) a cluster answers /healthz 503
// "not ready" (no peer authenticated yet, then syncing) until its first
// full repair, and its first 200 comes with
// every block the cluster published before it came already in its index.
func TestReadyAfterFirstRepair(t *testing.T) {
	const events = 20_000
	dir := t.TempDir()
	n1 := repairAgent(t, dir, "n1", 1, "", 0)
	publishMany(t, n1, events)
	n2 := repairAgent(t, dir, "n2", 2, n1.GossipAddr(), 0)
	health := func() (int, string) {
		rec := httptest.NewRecorder()
		n2.serveHealth(rec, httptest.NewRequest("GET", "/healthz", nil))
		return rec.Code, rec.Body.String()
	}
	var syncing int
	waitUntil(t, 60*time.Second, "n2 ready", func() error {
		code, body := health()
		if code == http.StatusOK {
			return nil
		}
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "not ready") {
			t.Fatalf("/healthz %d %q, want 503 not ready", code, body)
		}
		syncing++
		return fmt.Errorf("%d %q", code, body)
	})
	if got := indexed(n2, "n1"); got != events {
		t.Fatalf("ready with %d of n1's %d blocks indexed (/healthz answered syncing %d times)", got, events, syncing)
	}
	t.Logf("/healthz answered syncing %d times before ok", syncing)
	// Ready stays: a later gap is lag, not a restart.
	publishMany(t, n1, 10)
	if code, body := health(); code != http.StatusOK {
		t.Fatalf("after more events: %d %q", code, body)
	}
}
