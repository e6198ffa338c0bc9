package sim

import (
	"math"
	"testing"
	"time"
)

// A delay counts as over d only where its whole bucket lies past d: the
// bucket that holds d itself does not, the next one does.
func TestHistogramOver(t *testing.T) {
	var h histogram
	edge := time.Duration(float64(histBase) * math.Pow(1.05, 200)) // about 173 ms
	for _, d := range []time.Duration{time.Microsecond, 100 * time.Millisecond, edge, edge + 2*time.Millisecond, time.Second} {
		h.add(d)
	}
	for _, tc := range []struct {
		d    time.Duration
		want int64
	}{
		{0, 4}, // the first bucket, up to 10 µs, is never over
		{edge - time.Millisecond, 2},
		{edge - time.Nanosecond, 2},
		{edge + 2*time.Millisecond, 1},
		{time.Second, 0},
		{time.Hour, 0},
	} {
		if got, n := h.over(tc.d); got != tc.want || n != 5 {
			t.Errorf("over(%v) = %d of %d, want %d of 5", tc.d, got, n, tc.want)
		}
	}
}

// DelaysOver counts the blocks that reached every index late, not each
// index's copy.
func TestDelaysOver(t *testing.T) {
	c := &Cluster{}
	c.track.init()
	t0 := time.Now()
	c.track.published([]uint64{1, 2, 3}, 2, t0)
	c.track.applied(1, t0.Add(50*time.Millisecond))
	c.track.applied(1, t0.Add(60*time.Millisecond))
	c.track.applied(2, t0.Add(40*time.Millisecond))
	c.track.applied(2, t0.Add(900*time.Millisecond))
	c.track.applied(3, t0.Add(800*time.Millisecond)) // one index of two
	if over, complete := c.DelaysOver(500 * time.Millisecond); over != 1 || complete != 2 {
		t.Fatalf("DelaysOver(500ms) = %d of %d, want 1 of 2", over, complete)
	}
}
