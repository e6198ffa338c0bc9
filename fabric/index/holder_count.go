package index

// HolderCount says whether node id holds hash and how many other live
// nodes do: what cluster-aware eviction asks of every event.
func (ix *Index) HolderCount(hash uint64, id NodeID) (holds bool, others int) {
	s := ix.shardOf(hash)
	s.mu.RLock()
	defer s.mu.RUnlock()
	v, ok := s.get(hash)
	if !ok {
		return false, 0
	}
	s.sp.eachHolder(v, func(slot int) {
		switch live := ix.idAt(slot); {
		case live == 0:
		case live == id:
			holds = true
		default:
			others++
		}
	})
	return holds, others
}
