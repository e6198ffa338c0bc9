package transfer

import (
	"context"
	"fmt"

	"github.com/kvfabric/kvfabric/transfer/transferpb"
)

// IndexHandler is implemented by a Handler that serves the owned-slices
// block index (method 10): a peer sends the events of its blocks to their
// hashes' owners and asks owners who holds a hash. The payload is opaque
// here, at least one byte and at most one frame; the handler decodes and
// validates it, and its answer must fit one frame too. Called concurrently;
// a Handler without it refuses the call as unavailable.
type IndexHandler interface {
	IndexCall(ctx context.Context, peer string, payload []byte) ([]byte, error)
}

func serveIndex(ctx context.Context, h Handler, peer string, payload []byte) (*transferpb.IndexResponse, error) {
	ih, ok := h.(IndexHandler)
	if !ok {
		return nil, fmt.Errorf("%w: this node serves no index calls", ErrUnavailable)
	}
	out, err := ih.IndexCall(ctx, peer, payload)
	if err != nil {
		return nil, err
	}
	return &transferpb.IndexResponse{Payload: out}, nil
}

// IndexCall sends an owned-slices index call (see [IndexHandler]) and
// returns the owner's answer.
func (p *Peer) IndexCall(ctx context.Context, payload []byte) ([]byte, error) {
	if len(payload) == 0 {
		return nil, fmt.Errorf("%w: index call with an empty payload", ErrInvalidRequest)
	}
	var resp transferpb.IndexResponse
	if err := p.call(ctx, methodIndex, &transferpb.IndexRequest{Payload: payload}, &resp); err != nil {
		return nil, err
	}
	return resp.Payload, nil
}
