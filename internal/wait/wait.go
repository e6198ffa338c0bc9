// Package wait is the tests' one way to wait for something that happens
// asynchronously: poll a condition until it holds or a deadline passes,
// never a bare sleep. Deadlines in tests are generous (CI runs on two
// loaded cores); polling starts fast and backs off to maxPause, so a
// condition that holds at once costs nothing and a long wait does not
// spin. Benchmarks that time how long a condition takes poll at a fixed
// interval instead ([Every]).
package wait

import (
	"testing"
	"time"
)

// maxPause bounds the pause between two polls of For, and so how late
// it notices a condition (and how much a duration it returns overstates).
const maxPause = 10 * time.Millisecond

// For polls cond until it returns nil and returns how long that took. If
// d passes first, it fails t with what and cond's last error.
func For(t testing.TB, d time.Duration, what string, cond func() error) time.Duration {
	t.Helper()
	return poll(t, d, what, cond, time.Millisecond, maxPause)
}

// Every is For polling every interval, for a benchmark that times how
// long cond takes to hold.
func Every(t testing.TB, interval, d time.Duration, what string, cond func() error) time.Duration {
	t.Helper()
	return poll(t, d, what, cond, interval, interval)
}

func poll(t testing.TB, d time.Duration, what string, cond func() error, pause, maxPause time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		err := cond()
		if err == nil {
			return time.Since(start)
		}
		if time.Since(start) > d {
			t.Fatalf("%s: not within %v: %v", what, d, err)
		}
		time.Sleep(pause)
		pause = min(2*pause, maxPause)
	}
}
