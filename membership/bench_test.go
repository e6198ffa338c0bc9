package membership

import (
	"testing"
)

type nopSink struct{ n int }

func (s *nopSink) Apply(events []Event) { s.n += len(events) }
func (s *nopSink) Drop(string)          {}

// BenchmarkReceiveBatch measures the event apply rate of a receiver:
// decoding a gossiped batch and applying it in order. The baseline is
// decoding alone, the floor for any receiver.
func BenchmarkReceiveBatch(b *testing.B) {
	const perBatch = 64
	mk := func(first uint64) []byte {
		evs := make([]Event, perBatch)
		for i := range evs {
			evs[i] = Event{Origin: "node-01", Incarnation: 1, Seq: first + uint64(i), Kind: EventStore, Hash: first*31 + uint64(i), BlockSet: 1}
		}
		raw, err := AppendBatch(nil, evs)
		if err != nil {
			b.Fatal(err)
		}
		return raw
	}
	var base float64
	b.Run("baseline=decode", func(b *testing.B) {
		raw := mk(1)
		for b.Loop() {
			if _, err := DecodeBatch(raw); err != nil {
				b.Fatal(err)
			}
		}
		base = float64(b.Elapsed().Nanoseconds()) / float64(b.N*perBatch)
		b.ReportMetric(1e9/base, "events/s")
	})
	b.Run("decode+apply", func(b *testing.B) {
		sink := &nopSink{}
		cfg, _ := Config{Name: "self"}.withDefaults()
		cfg.Sink = sink
		m := &Membership{cfg: cfg, origins: map[string]*originState{}, alive: map[string]bool{"node-01": true}}
		// Pre-encode a ring of consecutive batches so each one applies.
		raws := make([][]byte, 1024)
		for i := range raws {
			raws[i] = mk(uint64(i*perBatch + 1))
		}
		i := 0
		for b.Loop() {
			if i == len(raws) {
				i = 0
				m.origins = map[string]*originState{} // start the stream again
			}
			events, err := DecodeBatch(raws[i])
			if err != nil {
				b.Fatal(err)
			}
			m.apply(events, true)
			i++
		}
		ns := float64(b.Elapsed().Nanoseconds()) / float64(b.N*perBatch)
		b.ReportMetric(1e9/ns, "events/s")
		if base > 0 {
			b.ReportMetric(ns/base, "x-baseline")
		}
		if sink.n == 0 {
			b.Fatal("nothing applied")
		}
	})
}
