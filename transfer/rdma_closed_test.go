package transfer

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/transfer/transferpb"
)

// scriptedRMA is an rmaPeer whose reads end as a script says: the lane
// whose segments start at byte i×minLaneBytes of the destination runs
// lanes[i], which may close the handle first.
type scriptedRMA struct {
	lanes []func(ctx context.Context) error
	ran   atomic.Int32
}

func (s *scriptedRMA) regionKey(g *transferpb.RdmaRegion) uint64     { return uint64(g.Rkey) }
func (s *scriptedRMA) answered(resp *transferpb.LeaseResponse) error { return nil }
func (s *scriptedRMA) readsInline() []byte                           { return nil }
func (s *scriptedRMA) close()                                        {}
func (s *scriptedRMA) read(ctx context.Context, _ uint64, _ nicPair, segs []layout.Segment, n uint64, _ []remoteRegion, _ []Span, _ []registration) groupRead {
	s.ran.Add(1)
	if err := s.lanes[segs[0].DstOffset/minLaneBytes](ctx); err != nil {
		return groupRead{err: err}
	}
	return groupRead{bytes: n}
}

// heapRegion is a memRegion over a Go slice: the reader's destination, as
// registered.
type heapRegion struct{ addr, n uint64 }

func (h heapRegion) Addr() uint64 { return h.addr }
func (h heapRegion) Len() uint64  { return h.n }
func (h heapRegion) Close() error { return nil }

// A read that fails while its peer handle closes counts as a read failure
// only if the peer failed and the read failed on its own: not if it was
// stopped by the closing (ErrClosed), nor if its other lane was (its
// lane then ends cancelled), nor if the peer left gracefully (its
// endpoint closing after it left fails the read with the provider's own
// error), nor if this node let go of it.
func TestRDMAReadFailureWhileHandleCloses(t *testing.T) {
	own := errors.New("provider: remote I/O error")
	closing := fmt.Errorf("transfer: waiting for a queue pair: %w", ErrClosed)
	cancelled := func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
	for _, tc := range []struct {
		name  string
		why   CloseReason
		close bool  // the handle closes before the first lane fails
		lanes int   // 1, or 2: the other waits until it is cancelled
		err   error // the first lane's
		want  uint64
	}{
		{"failed/closing", ClosePeerFailed, true, 1, closing, 0},
		{"failed/own", ClosePeerFailed, true, 1, own, 1},
		{"failed/closing+cancelled", ClosePeerFailed, true, 2, closing, 0},
		{"failed/own+cancelled", ClosePeerFailed, true, 2, own, 1},
		{"left/own", ClosePeerLeft, true, 1, own, 0},
		{"left/own+cancelled", ClosePeerLeft, true, 2, own, 0},
		{"local/own", CloseLocal, true, 1, own, 0},
		{"open/own", 0, false, 1, own, 1},
	} {
		// Of two lanes, either may be the one that fails first.
		for failing := range tc.lanes {
			t.Run(fmt.Sprintf("%s/lane%d", tc.name, failing), func(t *testing.T) {
				p, read := scriptedPeer(t, tc.lanes)
				rma := p.rdma.tp.(*scriptedRMA)
				rma.lanes = []func(context.Context) error{cancelled, cancelled}
				rma.lanes[failing] = func(ctx context.Context) error {
					if tc.close {
						p.CloseFor(tc.why)
					}
					return tc.err
				}
				done, err := read()
				if !done || !errors.Is(err, tc.err) {
					t.Fatalf("read: done %v, %v; want RDMA tried and %v", done, err, tc.err)
				}
				if got := int(rma.ran.Load()); got != tc.lanes {
					t.Fatalf("%d lanes read, want %d", got, tc.lanes)
				}
				if got := p.n.rdma.readFails.Load(); got != tc.want {
					t.Fatalf("%d read failures counted, want %d", got, tc.want)
				}
			})
		}
	}
}

// scriptedPeer returns a peer handle whose RDMA reads run on a
// scriptedRMA, and a read of lanes lanes' worth (one lane, or two) that
// it may go on.
func scriptedPeer(t *testing.T, lanes int) (*Peer, func() (bool, error)) {
	t.Helper()
	n := &Node{log: quietLogger(), ctx: context.Background()}
	n.rdma = &rdmaNode{cfg: RDMAConfig{QPsPerPeer: 2, Backoff: 1, MaxBackoff: 1}, fallback: map[string]uint64{},
		nicBytes: make([]atomic.Uint64, 1)}
	size := uint64(lanes) * minLaneBytes
	dst := make([]byte, size)
	addr := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(dst))))
	if err := n.rdma.mem.add(heapRegion{addr, size}, 0); err != nil {
		t.Fatal(err)
	}
	p := &Peer{n: n, name: "holder", lane: newPeerLane(1),
		rdma: &peerRDMA{tp: &scriptedRMA{}, leases: map[uint64]map[uint64][]remoteRegion{
			1: {7: {{addr: 1 << 20, length: size, key: 9}}},
		}, keyless: map[uint64]bool{}}}
	segs := []layout.Segment{{Length: size, Count: 1}}
	return p, func() (bool, error) {
		done, err := p.readRDMA(context.Background(), 1, 7, segs, []Span{{Addr: addr, Len: size}}, size)
		_ = dst[0] // dst stays reachable while the read names it
		return done, err
	}
}
