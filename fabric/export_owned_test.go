package fabric

import "github.com/kvfabric/kvfabric/fabric/index"

// IndexSendOps sends one ops call of a's owned index to owner through the
// agent's own send path, as its send loop would.
func IndexSendOps(a *Agent, owner string, hash uint64) {
	a.owned.send(index.Outgoing{Owner: owner, Call: index.OpsCall{Inc: 1, First: 1, Ops: []index.Op{{Kind: index.OpStore, Hash: hash}}}})
}

// IndexDiskOnly counts the hashes a's index (whole, or the owners asked)
// says peer holds on a disk tier only.
func IndexDiskOnly(a *Agent, peer string, hashes []uint64) int {
	_, onDisk := a.findHolders(hashes)
	id, ok := a.index.Lookup(peer)
	if !ok {
		return 0
	}
	return onDisk(id, hashes)
}
