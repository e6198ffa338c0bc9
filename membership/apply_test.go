package membership

import (
	"math/rand/v2"
	"testing"
	"time"
)

type orderSink struct {
	t    *testing.T
	next uint64
}

func (s *orderSink) Apply(events []Event) {
	for _, e := range events {
		if e.Seq != s.next {
			s.t.Fatalf("sink got event %d, want %d", e.Seq, s.next)
		}
		s.next++
	}
}
func (s *orderSink) Drop(string) { s.next = 1 }

// TestApplyInOrder delivers an origin's batches shuffled, duplicated and
// overlapping; the sink must see every event once, in order.
func TestApplyInOrder(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	r := rand.New(rand.NewPCG(seed, 3))
	for trial := range 200 {
		sink := &orderSink{t: t, next: 1}
		cfg, _ := Config{Name: "self"}.withDefaults()
		cfg.Sink = sink
		m := &Membership{cfg: cfg, origins: map[string]*originState{}, alive: map[string]bool{"o": true}}
		const total = 200
		var batches [][]Event
		for len(batches) < 60 {
			first := uint64(1 + r.IntN(total))
			n := uint64(1 + r.IntN(20))
			var b []Event
			for s := first; s < first+n && s <= total; s++ {
				b = append(b, Event{Origin: "o", Incarnation: 1, Seq: s, Kind: EventStore, Hash: s})
			}
			batches = append(batches, b)
		}
		// Make sure every number is covered at least once.
		for s := uint64(1); s <= total; s += 10 {
			var b []Event
			for x := s; x < s+10; x++ {
				b = append(b, Event{Origin: "o", Incarnation: 1, Seq: x, Kind: EventStore, Hash: x})
			}
			batches = append(batches, b)
		}
		r.Shuffle(len(batches), func(i, j int) { batches[i], batches[j] = batches[j], batches[i] })
		for _, b := range batches {
			m.apply(b, true)
		}
		if sink.next != total+1 {
			t.Fatalf("seed %d trial %d: sink reached %d, want %d", seed, trial, sink.next-1, total)
		}
		if st := m.origins["o"]; st.applied != total || len(st.pending) != 0 || !st.gapSince.IsZero() {
			t.Fatalf("seed %d trial %d: state %+v after everything arrived", seed, trial, st)
		}
	}
}
