package fabric

import (
	"sync"

	"github.com/kvfabric/kvfabric/pool"
)

// flights makes concurrent imports of the same block on one node share
// one transfer: the first claims it, the others wait for it to finish.
type flights struct {
	mu sync.Mutex
	m  map[flightKey]*flight
}

type flightKey struct {
	set  pool.SetID
	hash uint64
}

type flight struct{ done chan struct{} }

func (f *flights) claim(set pool.SetID, hash uint64) (*flight, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := flightKey{set, hash}
	if fl, ok := f.m[k]; ok {
		return fl, false
	}
	if f.m == nil {
		f.m = map[flightKey]*flight{}
	}
	fl := &flight{done: make(chan struct{})}
	f.m[k] = fl
	return fl, true
}

func (f *flights) finish(set pool.SetID, hash uint64, fl *flight) {
	f.mu.Lock()
	delete(f.m, flightKey{set, hash})
	f.mu.Unlock()
	close(fl.done)
}
