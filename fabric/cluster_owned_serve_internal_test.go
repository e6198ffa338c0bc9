package fabric

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/kvfabric/kvfabric/fabric/index"
	"github.com/kvfabric/kvfabric/transfer"
)

// A remote index call that names this node as its peer (a certificate in
// its name held by another node) is refused, and stores nothing: this
// node's own stores, exempt from --index-max-node-blocks, come only from
// its own calls, served in process. Another peer's call is served.
func TestOwnedIndexRefusesARemoteCallInItsOwnName(t *testing.T) {
	a := ownedTierAgent(t)
	s := newPeerService(a)
	const other, own = 0xa1, 0xa2
	// An incarnation past any the index has for the peer, so that the ops
	// are not dropped as an older run's.
	call := func(h uint64) []byte {
		return appendOpsCall(nil, index.OpsCall{Inc: 1 << 62, First: 1, Replace: true, Ops: []index.Op{{Kind: index.OpStore, Hash: h}}})
	}
	if _, err := s.IndexCall(context.Background(), "n2", call(other)); err != nil {
		t.Fatalf("another peer's ops call: %v", err)
	}
	_, err := s.IndexCall(context.Background(), a.cfg.NodeName, call(own))
	if !errors.Is(err, transfer.ErrInvalidRequest) || !strings.Contains(err.Error(), "own name") {
		t.Fatalf("a remote ops call in this node's own name: %v, want an invalid request naming why", err)
	}
	if _, err := s.IndexCall(context.Background(), a.cfg.NodeName, appendLookupCall(nil, []uint64{other}, false)); !errors.Is(err, transfer.ErrInvalidRequest) {
		t.Fatalf("a remote lookup in this node's own name: %v, want an invalid request", err)
	}
	got := a.owned.slice.Load().HolderTiers([]uint64{other, own})
	if len(got[0]) != 1 || got[0][0].Name != "n2" {
		t.Errorf("holders of the other peer's hash: %v, want n2", got[0])
	}
	if len(got[1]) != 0 {
		t.Errorf("holders of the hash stored in this node's name: %v, want none", got[1])
	}
}
