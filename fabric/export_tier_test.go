package fabric

import "github.com/kvfabric/kvfabric/pool"

// BlockSetHolds says whether a's block set id holds hash in memory, without
// restoring anything.
func BlockSetHolds(a *Agent, id, hash uint64) bool {
	s, err := a.pool.BlockSet(pool.SetID(id))
	if err != nil {
		return false
	}
	_, ok := s.Lookup(hash)
	return ok
}
