package fabric

import (
	"context"
	"testing"
	"time"
)

// endAhead says a read-ahead ended only when it did: not when the tiers
// closed or ctx ended first (else allocateNow, which tries again after
// each true, would spin), and true once it has.
func TestEndAheadTrueOnlyWhenItEnded(t *testing.T) {
	closed := make(chan struct{})
	close(closed)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name  string
		done  chan struct{} // the tiers'
		ctx   context.Context
		ended bool // the read-ahead's done closed
		want  bool
	}{
		{"tiers closed", closed, context.Background(), false, false},
		{"ctx ended", make(chan struct{}), cancelled, false, false},
		{"ended", make(chan struct{}), context.Background(), true, true},
		{"ended, tiers closed", closed, context.Background(), true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := &tiers{done: tc.done}
			r := &aheadRun{done: make(chan struct{}), cancel: func() {}}
			if tc.ended {
				close(r.done)
			}
			es := &engineSet{}
			es.ahead.run = r
			ctx, cancel := context.WithTimeout(tc.ctx, 30*time.Second)
			defer cancel()
			if got := tr.endAhead(ctx, es); got != tc.want {
				t.Fatalf("endAhead = %v; want %v", got, tc.want)
			}
		})
	}
	if (&tiers{done: closed}).endAhead(context.Background(), &engineSet{}) {
		t.Fatal("endAhead = true with no read-ahead under way")
	}
}
