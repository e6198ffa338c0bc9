// Package wait is the tests' one way to wait for something that happens
// asynchronously: poll a condition until it holds or a deadline passes,
// never a bare sleep. Deadlines in tests are generous (CI runs on two
// loaded cores); polling starts fast and backs off, so a condition that
// holds at once costs nothing and a long wait does not spin.
package wait

import (
	"testing"
	"time"
)

// For polls cond until it returns nil and returns how long that took. If
// d passes first, it fails t with what and cond's last error.
func For(t testing.TB, d time.Duration, what string, cond func() error) time.Duration {
	t.Helper()
	start := time.Now()
	pause := time.Millisecond
	for {
		err := cond()
		if err == nil {
			return time.Since(start)
		}
		if time.Since(start) > d {
			t.Fatalf("%s: not within %v: %v", what, d, err)
		}
		time.Sleep(pause)
		pause = min(2*pause, 50*time.Millisecond)
	}
}
