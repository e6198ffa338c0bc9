package fabric

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/transfer"
)

// A peer forgotten while its dial holds it is closed on a goroutine of its
// own; closeAll waits for that close, so nothing outlives the agent's
// Close, and nothing is dialed afterwards.
func TestPeersCloseAllWaitsForForgottenPeers(t *testing.T) {
	var ps peers
	e := &peerEntry{addr: "127.0.0.1:1"}
	ps.m = map[string]*peerEntry{"holder": e}
	e.mu.Lock() // a dial in progress
	ps.forget("holder", transfer.ClosePeerFailed)
	done := make(chan struct{})
	go func() {
		ps.closeAll()
		close(done)
	}()
	// Nothing may happen while the dial holds the entry: wide window.
	select {
	case <-done:
		t.Fatal("closeAll returned while a forgotten peer's close was still waiting")
	case <-time.After(200 * time.Millisecond):
	}
	e.mu.Unlock()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("closeAll did not return after the dial let go")
	}
	if !e.gone {
		t.Error("the forgotten peer is not marked closed")
	}
	if _, err := ps.get(context.Background(), nil, "holder", "127.0.0.1:1"); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Errorf("get after closeAll: %v, want an error saying the agent is closed", err)
	}
}
