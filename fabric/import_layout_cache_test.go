package fabric

import (
	"context"
	"strings"
	"testing"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/transfer"
)

// fakeLayouts serves layouts by digest under one block-set id, as a
// holder that restarted and reused the id would.
type fakeLayouts struct {
	sets  map[layout.Digest]*layout.Layout
	calls int
	lie   bool // serve every layout under the digest asked for
}

func (f *fakeLayouts) Name() string { return "holder" }

func (f *fakeLayouts) Layouts(ctx context.Context, digests [][]byte) ([]transfer.LayoutEntry, error) {
	f.calls++
	var out []transfer.LayoutEntry
	for d, l := range f.sets {
		for _, want := range digests {
			if f.lie || string(want) == string(d[:]) {
				out = append(out, transfer.LayoutEntry{Digest: want, BlockSet: 1, Layout: l.Marshal()})
			}
		}
	}
	return out, nil
}

// hostLayout is a valid host layout of m with regions of the right size.
func hostLayout(m layout.ModelConfig, tp int, order layout.KVOrder) *layout.Layout {
	l := &layout.Layout{Model: m, PageSize: 16, TPSize: tp, Order: order, Arrangement: layout.FullyContiguous, Alignment: 64, Slots: 8}
	l.Regions = make([]layout.Region, tp)
	for r := range l.Regions {
		l.Regions[r] = layout.Region{Base: uint64(r+1) << 30, Size: l.Strides().Region, Kind: layout.Host}
	}
	return l
}

func TestLayoutCacheFollowsTheLeasedDigest(t *testing.T) {
	m := layout.ModelConfig{Layers: 2, KVHeads: 4, HeadDim: 8, DType: layout.DTypeF16}
	before, after := hostLayout(m, 4, layout.HND), hostLayout(m, 2, layout.NHD)
	d1, d2 := before.Digest(), after.Digest()
	f := &fakeLayouts{sets: map[layout.Digest]*layout.Layout{d1: before}}
	var c layoutCache
	ctx := context.Background()
	if l, err := c.get(ctx, f, d1[:]); err != nil || !l.Equal(before) {
		t.Fatalf("first layout: %v %v", l, err)
	}
	if _, err := c.get(ctx, f, d1[:]); err != nil || f.calls != 1 {
		t.Fatalf("cached layout fetched again (%d calls, %v)", f.calls, err)
	}
	// The holder restarts: block set 1 now has another layout, and its
	// leases name the new digest.
	f.sets = map[layout.Digest]*layout.Layout{d2: after}
	l, err := c.get(ctx, f, d2[:])
	if err != nil || !l.Equal(after) {
		t.Fatalf("after the holder's restart the leased digest gave %+v, %v; want the new layout", l, err)
	}
	// A holder that serves another layout under the digest asked for is
	// caught.
	f.lie = true
	f.sets = map[layout.Digest]*layout.Layout{d1: before}
	d3 := hostLayout(m, 1, layout.NHD).Digest()
	if _, err := c.get(ctx, f, d3[:]); err == nil || !strings.Contains(err.Error(), "does not match its digest") {
		t.Fatalf("a layout served under another's digest: err = %v", err)
	}
	if _, err := c.get(ctx, f, d3[:7]); err == nil {
		t.Fatal("a digest of 7 bytes was accepted")
	}
}
