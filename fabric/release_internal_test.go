package fabric

import (
	"context"
	"testing"
	"testing/synctest"
	"time"
)

// A release the holder does not answer (it hangs) is tried again until it
// answers: a holder that resumes after 5 s of a 30 s term ends the lease
// then, not at the term's end. One that never answers is asked until the
// term has passed, and no longer.
func TestReleaseRetriedUntilTheHolderAnswers(t *testing.T) {
	const term, try = 30 * time.Second, 2 * time.Second
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		resume := start.Add(5 * time.Second)
		var answered time.Time
		tries, ok := releaseUntil(make(chan struct{}), term, try, func(ctx context.Context) error {
			if time.Now().Before(resume) {
				<-ctx.Done() // hung: no answer within the try
				return ctx.Err()
			}
			answered = time.Now()
			return nil
		})
		if !ok || answered.Sub(start) > 8*time.Second {
			t.Fatalf("released %v after %d tries, %v after the start; want soon after the holder resumed at 5s", ok, tries, answered.Sub(start))
		}
	})
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		tries, ok := releaseUntil(make(chan struct{}), term, try, func(ctx context.Context) error {
			<-ctx.Done()
			return ctx.Err()
		})
		if took := time.Since(start); ok || took < term || took > term+try+releasePause {
			t.Fatalf("a holder that never answers: ok %v after %d tries and %v; want to give up just past the %v term", ok, tries, took, term)
		}
	})
	synctest.Test(t, func(t *testing.T) {
		done := make(chan struct{})
		close(done)
		if tries, ok := releaseUntil(done, term, try, func(ctx context.Context) error { return context.DeadlineExceeded }); ok || tries != 1 {
			t.Fatalf("with the agent closing: %d tries, ok %v; want 1 and false", tries, ok)
		}
	})
}
