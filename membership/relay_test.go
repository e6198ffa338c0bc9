package membership

import "testing"

// A receiver relays every batch that is news to it, in whatever order
// batches arrive (memberlist sends equal ones newest first), and not a
// batch it already has.
func TestRelayWhatIsNews(t *testing.T) {
	m := &Membership{cfg: Config{Name: "me", MaxPending: 100}, origins: map[string]*originState{}, alive: map[string]bool{"o": true}}
	batch := func(from, n uint64) []Event {
		var ev []Event
		for i := range n {
			ev = append(ev, Event{Origin: "o", Incarnation: 1, Seq: from + i, Kind: EventStore, Hash: from + i})
		}
		return ev
	}
	steps := []struct {
		name  string
		from  uint64
		relay bool
	}{
		{"newer batch first: held behind the gap", 11, true},
		{"the same newer batch again", 11, false},
		{"older batch after it: closes the gap", 1, true},
		{"older batch again", 1, false},
		{"next batch", 21, true},
	}
	for _, s := range steps {
		if got := m.apply(batch(s.from, 10), true); got != s.relay {
			t.Errorf("%s: relay = %v, want %v", s.name, got, s.relay)
		}
	}
	if st := m.origins["o"]; st.applied != 30 || len(st.pending) != 0 {
		t.Errorf("applied %d with %d pending, want 30 and none", st.applied, len(st.pending))
	}
}
