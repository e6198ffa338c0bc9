package membership

// Synced reports whether this node has caught up once with what its
// cluster holds: it joined, took a peer's push/pull state (which names
// every origin's latest event), and has no origin with events missing, so
// its Sink holds every member's blocks. A restarted node is not ready to
// answer lookups before then. Once true it stays true: later gaps are the
// ordinary lag that repair closes. While no other member is alive the node
// has nothing to wait for and reports true, without latching. behind is how
// many origins still have a gap (or a repair running).
func (m *Membership) Synced() (synced bool, behind int) {
	if m.synced.Load() {
		return true, 0
	}
	if joined, _ := m.Joined(); !joined {
		return false, 0
	}
	m.mu.Lock()
	others := len(m.alive)
	for _, st := range m.origins {
		if !st.gapSince.IsZero() || st.repairing {
			behind++
		}
	}
	m.mu.Unlock()
	if others == 0 {
		return behind == 0, behind
	}
	if !m.merged.Load() || behind > 0 {
		return false, behind
	}
	m.synced.Store(true)
	return true, 0
}

// Resync forgets what this node applied of origin's current run and
// repairs it from the origin again, from its first event or its snapshot,
// as if the node had just joined. A Sink that lost events it had been
// handed (membership counts them as applied, so repair would never fetch
// them again) drops the origin's entries and calls this. It reports false
// if origin is not a member whose events this node follows.
func (m *Membership) Resync(origin string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := m.origins[origin]
	if st == nil || !m.alive[origin] {
		return false
	}
	st.known = max(st.known, st.applied, 1)
	st.applied = 0
	st.pending = nil
	m.noteGapLocked(st)
	m.metrics.resyncs.Add(1)
	return true
}
