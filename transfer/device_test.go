package transfer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/rdma"
)

// deviceHandler serves block set 9 as memory the process "cannot address":
// Region refuses it with ErrNeedsRDMA, RegionSpan gives its address, and,
// with stage set, StageRead copies pieces out batch bytes at a time.
type deviceHandler struct {
	*memHandler
	hidden  [][]byte
	batch   uint64
	batches atomic.Int64
	calls   atomic.Int64 // StageRead calls
}

func (h *deviceHandler) Region(blockSet uint64, rank int) ([]byte, error) {
	if blockSet == 9 {
		return nil, fmt.Errorf("%w: block set 9 is device memory", ErrNeedsRDMA)
	}
	return h.memHandler.Region(blockSet, rank)
}

func (h *deviceHandler) RegionSpan(blockSet uint64, rank int) (Span, error) {
	if blockSet != 9 || rank >= len(h.hidden) {
		return Span{}, fmt.Errorf("%w: block set %d rank %d", ErrNotFound, blockSet, rank)
	}
	return spansOf(h.hidden)[rank], nil
}

// stagingHandler adds StageRead to deviceHandler.
type stagingHandler struct{ *deviceHandler }

func (h stagingHandler) StageRead(blockSet uint64, segs []layout.Segment, fn func([]byte) error) error {
	h.calls.Add(1)
	buf := make([]byte, 0, h.batch)
	flush := func() error {
		if len(buf) == 0 {
			return nil
		}
		h.batches.Add(1)
		err := fn(buf)
		buf = buf[:0]
		return err
	}
	for _, seg := range segs {
		src := h.hidden[seg.SrcRank]
		for i := uint64(0); i < seg.Count; i++ {
			off := seg.SrcOffset + i*seg.SrcStride
			piece := src[off : off+seg.Length]
			for len(piece) > 0 {
				k := min(uint64(len(piece)), h.batch-uint64(len(buf)))
				buf = append(buf, piece[:k]...)
				piece = piece[k:]
				if uint64(len(buf)) == h.batch {
					if err := flush(); err != nil {
						return err
					}
				}
			}
		}
	}
	return flush()
}

// A holder serves reads out of memory it cannot hand out as a slice through
// its ReadStager, checked against the span's length and the lease; without
// a ReadStager the read is refused naming the missing path.
func TestReadServedThroughStaging(t *testing.T) {
	ca := newTestCA(t)
	members := newMembers("holder", "reader")
	const srcSize = 8 << 20
	hidden := [][]byte{make([]byte, srcSize), make([]byte, srcSize)}
	fill(hidden[0], 3)
	fill(hidden[1], 4)
	mh := newMemHandler()
	leaseAll(mh, 5, 2, srcSize)
	dh := &deviceHandler{memHandler: mh, hidden: hidden, batch: 4096}
	holder := newTestNode(t, ca, "holder", members, stagingHandler{dh})
	reader := newTestNode(t, ca, "reader", members, nil)
	p := dialPeer(t, reader, holder)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	segs, sizes := stridedPlan(rand.New(rand.NewPCG(seed, 0)), srcSize)
	dst := [][]byte{make([]byte, sizes[0]), make([]byte, sizes[1])}
	want := [][]byte{make([]byte, sizes[0]), make([]byte, sizes[1])}
	execLocal(segs, hidden, want)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := p.Read(ctx, 5, 9, segs, dst); err != nil {
		t.Fatal(err)
	}
	for r := range dst {
		if i := firstDiff(dst[r], want[r]); i >= 0 {
			t.Fatalf("rank %d differs first at byte %d", r, i)
		}
	}
	if dh.batches.Load() == 0 {
		t.Fatal("nothing went through StageRead")
	}
	// Four small staged segments of two ranks in one request: one call
	// for the whole run, so that staging overlaps across segments.
	small := []layout.Segment{
		{SrcRank: 0, SrcOffset: 0, DstOffset: 0, Length: 64, Count: 2, SrcStride: 4096, DstStride: 64},
		{SrcRank: 1, SrcOffset: 100, DstOffset: 128, Length: 32, Count: 1, SrcStride: 32, DstStride: 32},
		{SrcRank: 0, SrcOffset: 9000, DstOffset: 160, Length: 16, Count: 3, SrcStride: 100, DstStride: 16},
		{SrcRank: 1, SrcOffset: 5, DstOffset: 208, Length: 8, Count: 1, SrcStride: 8, DstStride: 8},
	}
	got, wantSmall := [][]byte{make([]byte, 216)}, [][]byte{make([]byte, 216)}
	for i := range small {
		small[i].DstRank = 0
	}
	execLocal(small, hidden, wantSmall)
	before := dh.calls.Load()
	if err := p.Read(ctx, 5, 9, small, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[0], wantSmall[0]) {
		t.Error("four staged segments in one request: bytes differ")
	}
	if n := dh.calls.Load() - before; n != 1 {
		t.Errorf("%d StageRead calls for one request of %d staged segments, want 1", n, len(small))
	}
	// Past the span's end: refused before any byte, as for host memory.
	past := []layout.Segment{{SrcRank: 0, SrcOffset: srcSize - 8, Length: 16, Count: 1}}
	if err := p.Read(ctx, 5, 9, past, [][]byte{make([]byte, 16)}); !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("read past the span: %v, want ErrInvalidRequest", err)
	}

	// The same memory behind a handler without a ReadStager.
	bare := newTestNode(t, ca, "holder", members, dh)
	p2 := dialPeer(t, reader, bare)
	err := p2.Read(ctx, 5, 9, segs, dst)
	if err == nil || !strings.Contains(err.Error(), ErrNeedsRDMA.Error()) {
		t.Fatalf("read from a holder without staging: %v, want it to name %q", err, ErrNeedsRDMA)
	}
}

// ReadSpans without RDMA fails before any call reaches the holder, and
// RegisterDmabuf and RegisterAddr say RDMA is not configured.
func TestReadSpansNeedsRDMA(t *testing.T) {
	ca := newTestCA(t)
	members := newMembers("holder", "reader")
	h := newMemHandler()
	holder := newTestNode(t, ca, "holder", members, h)
	reader := newTestNode(t, ca, "reader", members, nil)
	p := dialPeer(t, reader, holder)
	before := h.calls.Load()
	segs := []layout.Segment{{Length: 64, Count: 1}}
	_, err := p.ReadSpans(context.Background(), 5, 9, segs, []Span{{Addr: 1 << 40, Len: 64}})
	if !errors.Is(err, ErrNeedsRDMA) || h.calls.Load() != before {
		t.Fatalf("ReadSpans without RDMA: %v (%d holder calls), want ErrNeedsRDMA and none", err, h.calls.Load()-before)
	}
	// A plan past its destination is refused first, at the limit it is not.
	if _, err := p.ReadSpans(context.Background(), 5, 9, segs, []Span{{Addr: 1 << 40, Len: 63}}); !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("ReadSpans past the destination: %v, want ErrInvalidRequest", err)
	}
	if _, err := reader.RegisterAddr(0, 1<<40, 4096); !errors.Is(err, rdma.ErrUnavailable) {
		t.Fatalf("RegisterAddr without RDMA: %v", err)
	}
}
