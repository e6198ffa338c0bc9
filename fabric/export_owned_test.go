package fabric

import "github.com/kvfabric/kvfabric/fabric/index"

// IndexSendOps sends one ops call of a's owned index to owner through the
// agent's own send path, as its send loop would.
func IndexSendOps(a *Agent, owner string, hash uint64) {
	a.owned.send(index.Outgoing{Owner: owner, Call: index.OpsCall{Inc: 1, First: 1, Ops: []index.Op{{Kind: index.OpStore, Hash: hash}}}})
}
