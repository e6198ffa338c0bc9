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

// ImportCandidates names the holders an import of hashes on a would try,
// in order.
func ImportCandidates(a *Agent, hashes []uint64) []string {
	var out []string
	for _, c := range a.candidates(hashes, 1) {
		out = append(out, c.member.Name)
	}
	return out
}

// TierDiskHeld counts the hashes a's index says peer holds on a disk tier
// only.
func TierDiskHeld(a *Agent, peer string, hashes []uint64) int {
	id, ok := a.index.Lookup(peer)
	if !ok {
		return 0
	}
	return a.tierHeld.onDisk(a.index, id, hashes)
}
