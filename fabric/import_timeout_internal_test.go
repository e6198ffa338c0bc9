package fabric

import (
	"math"
	"testing"
	"time"
)

// An engine's import timeout is what it asks up to the agent's
// import_timeout, and that bound at it, one past it, and where it asks
// none; a bound that is no whole number of milliseconds is kept as it is.
func TestImportTimeout(t *testing.T) {
	for _, tc := range []struct {
		desc  string
		ms    uint32
		limit time.Duration
		want  time.Duration
	}{
		{"none asked", 0, 30 * time.Second, 30 * time.Second},
		{"a millisecond", 1, 30 * time.Second, time.Millisecond},
		{"a millisecond under the bound", 29999, 30 * time.Second, 29999 * time.Millisecond},
		{"at the bound", 30000, 30 * time.Second, 30 * time.Second},
		{"a millisecond past the bound", 30001, 30 * time.Second, 30 * time.Second},
		{"49 days", math.MaxUint32, 30 * time.Second, 30 * time.Second},
		{"past a bound of 1.5 ms", 2, 1500 * time.Microsecond, 1500 * time.Microsecond},
		{"within a bound of 1.5 ms", 1, 1500 * time.Microsecond, time.Millisecond},
	} {
		if got := importTimeout(tc.ms, tc.limit); got != tc.want {
			t.Errorf("%s: timeout_ms %d, import_timeout %v: %v, want %v", tc.desc, tc.ms, tc.limit, got, tc.want)
		}
	}
}
