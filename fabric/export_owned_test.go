package fabric

import (
	"fmt"
	"time"

	"github.com/kvfabric/kvfabric/fabric/index"
	"github.com/kvfabric/kvfabric/transfer"
)

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

// ServeIndexBeforeTiers makes an agent started with c answer index calls
// as an owner that predates lookups with tiers and disk copies did: it
// refuses a lookup of kind 3 and an ops call with a disk copy's op as
// invalid requests, with that owner's words, and serves the rest.
func ServeIndexBeforeTiers(c *Config) {
	c.hooks.beforeServeIndex = func(payload []byte) error {
		switch payload[0] {
		case ownedCallOps:
			call, err := decodeOpsCall(payload)
			if err != nil {
				return nil // refused as it was
			}
			for i, op := range call.Ops {
				if op.Kind > index.OpForget {
					return fmt.Errorf("%w: %w: op %d of unknown kind %d", transfer.ErrInvalidRequest, errOwnedWire, i, op.Kind)
				}
			}
		case ownedCallLookup:
		default:
			return fmt.Errorf("%w: index call of unknown kind %d", transfer.ErrInvalidRequest, payload[0])
		}
		return nil
	}
}

// IndexLookupBeforeTiers asks owner, from a, who holds hashes as a node
// that predates lookups with tiers does (a lookup of kind 2), and returns
// each hash's holders' names.
func IndexLookupBeforeTiers(a *Agent, owner string, hashes []uint64) ([][]string, error) {
	ans, err := a.owned.call(owner, appendLookupCall(nil, hashes, false))
	if err != nil {
		return nil, err
	}
	hs, err := decodeLookupAnswer(ans, len(hashes), false)
	if err != nil {
		return nil, err
	}
	out := make([][]string, len(hs))
	for i, h := range hs {
		for _, x := range h {
			out[i] = append(out[i], x.Name)
		}
	}
	return out, nil
}

// IndexLegacyOwner says whether a sends owner the index calls that
// predate lookups with tiers and disk copies.
func IndexLegacyOwner(a *Agent, owner string) bool { return a.owned.legacy.is(owner, time.Now()) }

// IndexQueuedOps is how many of a's ops wait for their owners to apply
// them.
func IndexQueuedOps(a *Agent) int64 { return a.owned.pub.Stats().Queued }
