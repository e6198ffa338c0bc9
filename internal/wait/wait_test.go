package wait

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestForReturnsOnceTheConditionHolds(t *testing.T) {
	n := 0
	For(t, 10*time.Second, "third call", func() error {
		if n++; n < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	if n != 3 {
		t.Fatalf("cond called %d times, want 3", n)
	}
}

// recorder is a testing.TB whose Fatalf records instead of stopping.
type recorder struct {
	testing.TB
	msg string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.msg = format
	for _, a := range args {
		r.msg += " " + toString(a)
	}
}

func toString(a any) string {
	switch v := a.(type) {
	case string:
		return v
	case error:
		return v.Error()
	case time.Duration:
		return v.String()
	}
	return "?"
}

func TestForFailsWithTheLastError(t *testing.T) {
	r := &recorder{TB: t}
	calls := 0
	For(r, 20*time.Millisecond, "never", func() error {
		calls++
		if r.msg != "" {
			return nil // Fatalf was called: let For return
		}
		return errors.New("still false")
	})
	if !strings.Contains(r.msg, "never") || !strings.Contains(r.msg, "still false") {
		t.Fatalf("failure message %q does not name what and the last error", r.msg)
	}
	if calls < 2 {
		t.Fatalf("cond called %d times before failing", calls)
	}
}

func TestEveryPollsAtItsInterval(t *testing.T) {
	calls := 0
	took := Every(t, 2*time.Millisecond, 10*time.Second, "fifth call", func() error {
		if calls++; calls < 5 {
			return errors.New("not yet")
		}
		return nil
	})
	if calls != 5 || took < 8*time.Millisecond {
		t.Fatalf("%d calls in %v, want 5 calls at least 2 ms apart", calls, took)
	}
}
