package fabric

import (
	"testing"
	"time"
)

// Estimates follow what reads measured: a holder's own figures first,
// then the mean of those measured, then none; a read too small to say
// anything about throughput counts only its round trip.
func TestLinkEstimates(t *testing.T) {
	var l links
	if d, basis, _ := l.estimate("a", 1<<20); d != 0 || basis != estimateNone {
		t.Fatalf("nothing measured: %v %s", d, basis)
	}
	// 100 MB in 100 ms after a 1 ms round trip: 1 GB/s.
	l.observe("a", "quic", time.Millisecond, 100e6, 101*time.Millisecond)
	d, basis, tr := l.estimate("a", 50e6)
	if basis != estimateMeasured || tr != "quic" || d < 51*time.Millisecond || d > 53*time.Millisecond {
		t.Fatalf("50 MB from a: %v %s %s, want 52 ms measured over quic", d, basis, tr)
	}
	// A small read moves the round trip, not the throughput.
	l.observe("a", "quic", 3*time.Millisecond, 4<<10, 10*time.Millisecond)
	if d, _, _ := l.estimate("a", 50e6); d < 52*time.Millisecond || d > 54*time.Millisecond {
		t.Fatalf("after a small read: %v, want 50 ms and two 1.5 ms round trips", d)
	}
	// b was never read from: the mean of the measured.
	l.observe("c", "quic", time.Millisecond, 100e6, 201*time.Millisecond)
	if _, basis, tr := l.estimate("b", 1); basis != estimateCluster || tr != "" {
		t.Fatalf("b: %s %q, want cluster", basis, tr)
	}
	// A holder reached by another transport starts afresh.
	l.observe("a", "rdma", 10*time.Microsecond, 100e6, 10*time.Millisecond)
	if d, _, tr := l.estimate("a", 100e6); tr != "rdma" || d > 11*time.Millisecond {
		t.Fatalf("after rdma: %v over %s", d, tr)
	}
	l.forget("a")
	if _, basis, _ := l.estimate("a", 1); basis != estimateCluster {
		t.Fatalf("forgotten a: %s, want cluster (c is measured)", basis)
	}
}
