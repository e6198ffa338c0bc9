package fabric

import (
	"context"
	"errors"
	"fmt"

	"github.com/kvfabric/kvfabric/fabric/index"
	"github.com/kvfabric/kvfabric/transfer"
)

var _ transfer.IndexHandler = (*peerService)(nil)

// IndexCall serves the owned-slices index's calls: a peer's block events
// for the hashes this node owns, and lookups of them.
func (s *peerService) IndexCall(ctx context.Context, peer string, payload []byte) ([]byte, error) {
	o := s.a.owned
	if o == nil {
		return nil, fmt.Errorf("%w: this node keeps the whole index (index_mode whole), not owned slices", transfer.ErrUnavailable)
	}
	return o.serve(ctx, peer, payload)
}

func (o *ownedIndex) serve(ctx context.Context, peer string, payload []byte) ([]byte, error) {
	switch payload[0] {
	case ownedCallOps:
		c, err := decodeOpsCall(payload)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", transfer.ErrInvalidRequest, err)
		}
		return o.applyOps(peer, c)
	case ownedCallLookup:
		hashes, err := decodeLookupCall(payload)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", transfer.ErrInvalidRequest, err)
		}
		return appendLookupAnswer(nil, o.localHolders(hashes)), nil
	}
	return nil, fmt.Errorf("%w: index call of unknown kind %d", transfer.ErrInvalidRequest, payload[0])
}

// applyOps applies an origin's ops to this node's slice, each once and in
// order, and answers ansReplace where it cannot continue the stream.
func (o *ownedIndex) applyOps(origin string, c opsCall) ([]byte, error) {
	o.inMu.Lock()
	st := o.in[origin]
	if st == nil {
		st = &inStream{}
		o.in[origin] = st
	}
	o.inMu.Unlock()
	st.mu.Lock()
	defer st.mu.Unlock()
	// The stream holds while the index still has the id its ops went to:
	// membership drops a member that failed, and a lookup may name it
	// again afresh.
	cur, ok := o.a.index.Lookup(origin)
	if ok {
		if inc, _ := o.a.index.Incarnation(cur); inc > c.inc {
			return []byte{ansApplied}, nil // an older run's: it is gone
		}
	}
	valid := st.id != 0 && ok && cur == st.id && st.inc == c.inc
	if valid && c.first > st.next {
		return []byte{ansReplace}, nil // a gap
	}
	ops := c.ops
	switch {
	case c.replace && !(valid && c.first < st.next):
		// A new run of the stream: forget what the origin held here.
		o.a.sink.Drop(origin)
		id, err := o.a.index.Node(origin, c.inc)
		if errors.Is(err, index.ErrStaleIncarnation) {
			return []byte{ansApplied}, nil // an older run's: it is gone
		}
		if err != nil {
			st.id = 0
			return nil, fmt.Errorf("%w: %w", transfer.ErrUnavailable, err)
		}
		st.id, st.inc, st.next = id, c.inc, c.first
	case !valid:
		st.id = 0
		return []byte{ansReplace}, nil
	default:
		// A retry may repeat ops already applied.
		skip := st.next - c.first
		if skip >= uint64(len(ops)) {
			return []byte{ansApplied}, nil
		}
		ops = ops[skip:]
	}
	for _, op := range ops {
		var err error
		switch op.kind {
		case opStore:
			err = o.a.index.Store(st.id, op.hash)
		case opRemove:
			err = o.a.index.Remove(st.id, op.hash)
		case opForget:
			err = o.a.index.Forget(st.id, op.hash)
		}
		if err != nil {
			// Dropped meanwhile (the origin failed, or restarted).
			st.id = 0
			return []byte{ansReplace}, nil
		}
		st.next++
	}
	o.stats.opsApplied.Add(uint64(len(ops)))
	return []byte{ansApplied}, nil
}

// localHolders returns the holder names of each hash in this node's slice.
func (o *ownedIndex) localHolders(hashes []uint64) [][]string {
	out := make([][]string, len(hashes))
	for i, h := range hashes {
		ids := o.a.index.Holders(h)
		names := make([]string, 0, len(ids))
		for _, id := range ids {
			if n := o.a.index.Name(id); n != "" {
				names = append(names, n)
			}
		}
		out[i] = names
	}
	return out
}
