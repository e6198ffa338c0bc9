package fabric

import (
	"fmt"
	"testing"

	"github.com/kvfabric/kvfabric/layout"
)

// splitParts keeps every piece's bytes in order, each part at most the
// limit: rows grouped while they fit, a piece at the limit whole, a piece
// a byte past it cut in two.
func TestSplitParts(t *testing.T) {
	const limit = 1024
	for _, tc := range []struct {
		name  string
		segs  []layout.Segment
		parts int
	}{
		{"rows that fill parts exactly", []layout.Segment{{Length: 256, Count: 8, SrcStride: 512, DstStride: 256}}, 2},
		{"a piece at the limit", []layout.Segment{{Length: limit, Count: 3, SrcStride: 2 * limit, DstStride: limit}}, 3},
		{"a piece past the limit", []layout.Segment{{Length: limit + 1, Count: 2, SrcStride: 4 * limit, DstStride: limit + 1}}, 3},
		{"rows that do not divide it", []layout.Segment{{Length: 300, Count: 7, SrcStride: 300, DstStride: 600}, {SrcRank: 1, DstRank: 1, Length: 1, Count: 1}}, 3},
		{"nothing", []layout.Segment{{Length: 0, Count: 4}}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parts := splitParts(tc.segs, limit)
			if len(parts) != tc.parts {
				t.Fatalf("%d parts, want %d: %v", len(parts), tc.parts, parts)
			}
			type piece struct {
				src, dst   int
				sOff, dOff uint64
			}
			bytes := func(segs []layout.Segment) []piece {
				var out []piece
				for _, s := range segs {
					for i := range s.Count {
						so, do := s.Piece(i)
						for b := range s.Length {
							out = append(out, piece{s.SrcRank, s.DstRank, so + b, do + b})
						}
					}
				}
				return out
			}
			var got []piece
			for i, p := range parts {
				var n uint64
				for _, s := range p {
					n += s.Bytes()
				}
				if n > limit || n == 0 {
					t.Fatalf("part %d has %d bytes (limit %d)", i, n, limit)
				}
				got = append(got, bytes(p)...)
			}
			want := bytes(tc.segs)
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("the parts move other bytes than the plan, or in another order")
			}
		})
	}
}

// The copy engines are told each rank's GPU: a plan between ranks on two
// GPUs is then a peer copy (pool/cuda's Region.Device).
func TestDeviceRegionsNameTheirGPU(t *testing.T) {
	l := &layout.Layout{Regions: []layout.Region{
		{Base: 1 << 40, Size: 4096, Kind: layout.Device, Device: 1},
		{Base: 2 << 40, Size: 8192, Kind: layout.Device, Device: 0},
		{Base: 3 << 40, Size: 4096, Kind: layout.Device, Device: 3},
	}}
	got := deviceRegions(l)
	for r, reg := range l.Regions {
		if got[r].Addr != reg.Base || got[r].Size != reg.Size || got[r].Device != int(reg.Device) {
			t.Fatalf("rank %d: %+v from %+v", r, got[r], reg)
		}
	}
}

// PCI addresses compare as numbers: the driver's four-digit domain and
// NVML's eight-digit one, in either case, name one device.
func TestSamePCIAddress(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		same bool
	}{
		{"0000:3b:00.0", "00000000:3B:00.0", true},
		{"0000:3b:00.0", "0000:3b:00.0", true},
		{"0000:3b:00.0", "0000:3b:00.1", false},
		{"0000:3b:00.0", "0001:3b:00.0", false},
		{"0000:3b:00.0", "3b:00.0", false},
		{"0000:3b:00.0", "0000:3b:00", false},
		{"0000:3b:00.0", "0000:3g:00.0", false},
		{"0000:3b:00.0", "0000::00.0", false},
		{"0000:3b:00.0", "2", false},
	} {
		if got := samePCIAddress(tc.a, tc.b); got != tc.same {
			t.Errorf("samePCIAddress(%q, %q) = %v", tc.a, tc.b, got)
		}
	}
}
