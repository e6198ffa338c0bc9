package fabric

import (
	"sync"
	"time"
)

// suspectFor is how long, beyond twice the peer timeout, a holder that
// failed an import is tried after the others: about memberlist's failure
// detection time, after which a dead holder has left the index anyway.
const suspectFor = 8 * time.Second

// suspects are holders that recently failed an import.
type suspects struct {
	mu    sync.Mutex
	until map[string]time.Time
}

func (s *suspects) add(name string, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.until == nil {
		s.until = map[string]time.Time{}
	}
	s.until[name] = time.Now().Add(d)
}

func (s *suspects) has(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.until[name]
	if ok && time.Now().After(t) {
		delete(s.until, name)
		return false
	}
	return ok
}
