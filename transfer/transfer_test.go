package transfer

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"reflect"
	"runtime"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/layout"
)

func TestControlRoundTrips(t *testing.T) {
	ca := newTestCA(t)
	members := newMembers("a", "b")
	h := newMemHandler()
	a := newTestNode(t, ca, "a", members, h)
	b := newTestNode(t, ca, "b", members, nil)
	p := dialPeer(t, b, a)
	ctx := context.Background()

	hello, err := p.Hello(ctx, []string{"rdma"})
	if err != nil {
		t.Fatal(err)
	}
	if hello.Node != "a" || !reflect.DeepEqual(hello.Features, []string{"echo", "rdma"}) || string(hello.LayoutSetDigest) != "digest-1" || !reflect.DeepEqual(hello.Versions, []uint32{ProtocolVersion}) {
		t.Errorf("hello = %+v", hello)
	}

	ls, err := p.Layouts(ctx, [][]byte{[]byte("unknown"), []byte("known")})
	if err != nil {
		t.Fatal(err)
	}
	if len(ls) != 1 || string(ls[0].Digest) != "known" || ls[0].BlockSet != 7 || string(ls[0].Layout) != "layout-bytes" {
		t.Errorf("layouts = %+v", ls)
	}

	all, err := p.Layouts(ctx, nil)
	if err != nil || len(all) != 1 || all[0].BlockSet != 7 {
		t.Errorf("every layout: %+v, %v", all, err)
	}

	l, err := p.Lease(ctx, []uint64{10, 11, 12}, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	want := Lease{ID: 42, Duration: 2 * time.Second, LayoutDigests: map[uint64][]byte{7: testDigest[:]}, Blocks: []LeasedBlock{
		{Hash: 10, Present: true, BlockSet: 7, Slot: 0, Generation: 11},
		{Hash: 11},
		{Hash: 12, Present: true, BlockSet: 7, Slot: 2, Generation: 13},
	}}
	if !reflect.DeepEqual(l, want) {
		t.Errorf("lease = %+v, want %+v", l, want)
	}

	if d, err := p.Renew(ctx, 42, 1500*time.Millisecond); err != nil || d != 1500*time.Millisecond {
		t.Errorf("renew = %v, %v; want 1.5s", d, err)
	}
	if d, err := p.Renew(ctx, 43, 1500*time.Millisecond); err != nil || d != 0 {
		t.Errorf("renew of unknown lease = %v, %v; want 0", d, err)
	}
	if ok, err := p.Release(ctx, 42); err != nil || !ok {
		t.Errorf("release = %v, %v; want true", ok, err)
	}
	_, err = p.Release(ctx, 0)
	var re *RemoteError
	if !errors.Is(err, ErrNotFound) || !errors.As(err, &re) || re.Peer != "a" || re.Method != "release" {
		t.Errorf("release of lease 0: err = %v, want a RemoteError matching ErrNotFound", err)
	}

	er, err := p.EventRange(ctx, EventQuery{Origin: "c", From: 100, To: 103})
	if err != nil {
		t.Fatal(err)
	}
	if er.SnapshotNeeded || len(er.Events) != 3 || er.Events[2].Seq != 102 || string(er.Events[2].Payload) != "c/102" {
		t.Errorf("event range = %+v", er)
	}
	if er, err := p.EventRange(ctx, EventQuery{Origin: "c", From: 1, To: 5}); err != nil || !er.SnapshotNeeded {
		t.Errorf("old event range = %+v, %v; want snapshot needed", er, err)
	}

	if er, err := p.EventRange(ctx, EventQuery{Origin: "c", Incarnation: 9, Snapshot: true}); err != nil || string(er.Events[0].Payload) != "c@9" {
		t.Errorf("snapshot = %+v, %v", er, err)
	}
	if _, err := p.EventRange(ctx, EventQuery{Origin: "liar", From: 100, To: 103}); !errors.Is(err, ErrFrame) {
		t.Errorf("event range with an event outside it: err = %v, want ErrFrame", err)
	}

	h.mu.Lock()
	for _, peer := range h.peers {
		if peer != "b" {
			t.Errorf("handler saw peer %q, want b", peer)
		}
	}
	h.mu.Unlock()

	// Requests that fail validation on the holder come back as errors.
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"lease without hashes", func() error { _, err := p.Lease(ctx, nil, time.Second); return err }},
		{"lease of zero duration", func() error { _, err := p.Lease(ctx, []uint64{1}, 0); return err }},
		{"lease too long", func() error { _, err := p.Lease(ctx, []uint64{1}, time.Hour); return err }},
		{"empty event range", func() error { _, err := p.EventRange(ctx, EventQuery{Origin: "c", From: 5, To: 5}); return err }},
		{"snapshot with a range", func() error {
			_, err := p.EventRange(ctx, EventQuery{Origin: "c", From: 1, To: 2, Snapshot: true})
			return err
		}},
		{"event range without origin", func() error { _, err := p.EventRange(ctx, EventQuery{From: 5, To: 6}); return err }},
	} {
		if err := tc.call(); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("%s: err = %v, want ErrInvalidRequest", tc.name, err)
		}
	}
}

// stridedPlan builds a plan of several shapes over two source ranks into
// two destination ranks, each destination written once: contiguous runs,
// strided layer-like runs, NHD-like rows of 128 bytes, and pieces of odd
// sizes. It returns the plan and the destination sizes.
func stridedPlan(rng *rand.Rand, srcSize uint64) ([]layout.Segment, []uint64) {
	var segs []layout.Segment
	dstNext := []uint64{0, 0}
	add := func(srcRank, dstRank int, srcOff, length, count, srcStride uint64) {
		if srcOff+(count-1)*srcStride+length > srcSize {
			panic("plan exceeds source")
		}
		segs = append(segs, layout.Segment{
			SrcRank: srcRank, DstRank: dstRank, SrcOffset: srcOff, DstOffset: dstNext[dstRank],
			Length: length, Count: count, SrcStride: srcStride, DstStride: length,
		})
		dstNext[dstRank] += length * count
	}
	add(0, 0, 0, 3<<20, 1, 0)                         // one long run
	add(1, 0, 4096, 32<<10, 64, 96<<10)               // layer-separate: 64 chunks at a block stride
	add(0, 1, 3<<20+64, 128, 8192, 512)               // NHD rows of a head slice
	add(1, 1, 1<<20, 4099, 100, 4099+rng.Uint64N(64)) // odd sizes
	add(0, 1, 7, 1, 1, 0)                             // a single byte
	return segs, dstNext
}

func leaseAll(h *memHandler, id uint64, ranks int, size uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for r := 0; r < ranks; r++ {
		h.leases[id] = append(h.leases[id], span{rank: r, off: 0, len: size})
	}
}

func TestReadStridedPlan(t *testing.T) {
	ca := newTestCA(t)
	members := newMembers("holder", "reader")
	h := newMemHandler()
	const srcSize = 8 << 20
	src := [][]byte{make([]byte, srcSize), make([]byte, srcSize)}
	fill(src[0], 1)
	fill(src[1], 2)
	h.regions[9] = src
	leaseAll(h, 5, 2, srcSize)

	holder := newTestNode(t, ca, "holder", members, h)
	for _, tc := range []struct {
		name           string
		conns, streams int
		minStreamBytes uint64
	}{
		{"one stream", 1, 1, 1 << 30},
		{"defaults", 0, 0, 0},
		{"many small parts", 3, 4, 64 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seed := uint64(time.Now().UnixNano())
			t.Logf("seed %d", seed)
			rng := rand.New(rand.NewPCG(seed, 0))
			reader := newTestNode(t, ca, "reader", members, nil, func(c *Config) {
				c.ConnsPerPeer, c.StreamsPerConn, c.MinStreamBytes = tc.conns, tc.streams, tc.minStreamBytes
			})
			p := dialPeer(t, reader, holder)
			segs, sizes := stridedPlan(rng, srcSize)
			// Slack after each destination catches writes past the plan.
			dst := [][]byte{make([]byte, sizes[0]+4096), make([]byte, sizes[1]+4096)}
			want := [][]byte{make([]byte, len(dst[0])), make([]byte, len(dst[1]))}
			execLocal(segs, src, want)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := p.Read(ctx, 5, 9, segs, dst); err != nil {
				t.Fatal(err)
			}
			for r := range dst {
				if i := firstDiff(dst[r], want[r]); i >= 0 {
					t.Fatalf("rank %d differs first at byte %d of %d", r, i, len(dst[r]))
				}
			}
			st := reader.Metrics()
			if st.Reads != 1 || st.BytesRead != sizes[0]+sizes[1] {
				t.Errorf("reader stats = %+v, want 1 read of %d bytes", st, sizes[0]+sizes[1])
			}
		})
	}
}

func firstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return len(a)
}

func TestReadOutsideLeaseRefused(t *testing.T) {
	ca := newTestCA(t)
	members := newMembers("holder", "reader")
	h := newMemHandler()
	src := [][]byte{make([]byte, 1<<20)}
	fill(src[0], 3)
	h.regions[1] = src
	h.leases[8] = []span{{rank: 0, off: 0, len: 64 << 10}}
	holder := newTestNode(t, ca, "holder", members, h)
	reader := newTestNode(t, ca, "reader", members, nil)
	p := dialPeer(t, reader, holder)
	ctx := context.Background()

	cases := []struct {
		name string
		segs []layout.Segment
		want error
	}{
		{"piece past the lease", []layout.Segment{
			{SrcOffset: 0, DstOffset: 0, Length: 4096, Count: 1},
			{SrcOffset: 60 << 10, DstOffset: 4096, Length: 8192, Count: 1},
		}, ErrLeaseRefused},
		{"stride walks out of the lease", []layout.Segment{
			{SrcOffset: 0, DstOffset: 0, Length: 1024, Count: 16, SrcStride: 8192, DstStride: 1024},
		}, ErrLeaseRefused},
		{"unknown lease", []layout.Segment{{Length: 16, Count: 1}}, ErrLeaseRefused},
		{"past the region", []layout.Segment{{SrcOffset: 1 << 20, Length: 16, Count: 1}}, ErrInvalidRequest},
		{"unknown rank", []layout.Segment{{SrcRank: 3, Length: 16, Count: 1}}, ErrNotFound},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dst := [][]byte{make([]byte, 64<<10)}
			lease := uint64(8)
			if tc.name == "unknown lease" {
				lease = 99
			}
			err := p.Read(ctx, lease, 1, tc.segs, dst)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if !bytes.Equal(dst[0], make([]byte, len(dst[0]))) {
				t.Errorf("a refused read wrote into the destination")
			}
		})
	}

	// Bad plans are refused by the reader before anything is sent.
	for _, tc := range []struct {
		name string
		seg  layout.Segment
	}{
		{"destination rank out of range", layout.Segment{DstRank: 1, Length: 1, Count: 1}},
		{"negative destination rank", layout.Segment{DstRank: -1, Length: 1, Count: 1}},
		{"past the destination", layout.Segment{DstOffset: 64 << 10, Length: 1, Count: 1}},
		{"zero count", layout.Segment{Length: 1}},
		{"overlapping source pieces", layout.Segment{Length: 8, Count: 2, SrcStride: 4, DstStride: 8}},
		{"overflowing stride", layout.Segment{Length: 8, Count: 3, SrcStride: 1 << 63, DstStride: 8}},
	} {
		before := holder.Metrics().StreamsAccepted
		if err := p.Read(ctx, 8, 1, []layout.Segment{tc.seg}, [][]byte{make([]byte, 64<<10)}); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("%s: err = %v, want ErrInvalidRequest", tc.name, err)
		}
		if after := holder.Metrics().StreamsAccepted; after != before {
			t.Errorf("%s: the holder saw %d streams for a plan refused locally", tc.name, after-before)
		}
	}

	// The holder keeps serving the same reader.
	dst := [][]byte{make([]byte, 4096)}
	if err := p.Read(ctx, 8, 1, []layout.Segment{{SrcOffset: 100, Length: 4096, Count: 1}}, dst); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dst[0], src[0][100:4196]) {
		t.Error("read after refusals returned wrong bytes")
	}
}

func TestSplitPlanKeepsEveryByte(t *testing.T) {
	for seed := uint64(0); seed < 2000; seed++ {
		rng := rand.New(rand.NewPCG(seed, 1))
		var segs []layout.Segment
		var total uint64
		var dstOff uint64
		for range 1 + rng.IntN(6) {
			l := 1 + rng.Uint64N(5000)
			c := 1 + rng.Uint64N(50)
			s := layout.Segment{SrcRank: rng.IntN(3), SrcOffset: rng.Uint64N(1000), DstOffset: dstOff,
				Length: l, Count: c, SrcStride: l + rng.Uint64N(100), DstStride: l}
			segs = append(segs, s)
			dstOff += l * c
			total += l * c
		}
		parallel := 1 + rng.IntN(9)
		minBytes := 1 + rng.Uint64N(20000)
		maxSegs := 1 + rng.IntN(10)
		parts := splitPlan(segs, total, parallel, minBytes, maxSegs)
		var got []layout.Segment
		target := max((total+uint64(parallel)-1)/uint64(parallel), minBytes)
		for i, p := range parts {
			var n uint64
			for _, s := range p {
				n += s.Bytes()
			}
			if len(p) > maxSegs || n > target || n == 0 {
				t.Fatalf("seed %d: part %d has %d segments, %d bytes (caps %d, %d)", seed, i, len(p), n, maxSegs, target)
			}
			got = append(got, p...)
		}
		if !reflect.DeepEqual(expand(got), expand(segs)) {
			t.Fatalf("seed %d: split plan moves different bytes", seed)
		}
	}
}

// expand lists a plan's bytes as maximal runs (src rank, src, dst rank,
// dst, length) in order: a canonical form, equal for two plans that move
// the same bytes in the same order however their segments are cut.
func expand(segs []layout.Segment) [][5]uint64 {
	var out [][5]uint64
	for _, s := range segs {
		for i := uint64(0); i < s.Count; i++ {
			so, do := s.Piece(i)
			if k := len(out) - 1; k >= 0 {
				l := &out[k]
				if l[0] == uint64(s.SrcRank) && l[2] == uint64(s.DstRank) && l[1]+l[4] == so && l[3]+l[4] == do {
					l[4] += s.Length
					continue
				}
			}
			out = append(out, [5]uint64{uint64(s.SrcRank), so, uint64(s.DstRank), do, s.Length})
		}
	}
	return out
}

func TestUDPBufferFix(t *testing.T) {
	if _, ok := udpBufferFix(wantUDPBuffer, wantUDPBuffer); !ok {
		t.Error("buffers of the wanted size reported too small")
	}
	if runtime.GOOS != "linux" {
		t.Skip("the advice checked here is Linux's sysctl")
	}
	for _, c := range [][2]int{{wantUDPBuffer - 1, wantUDPBuffer}, {wantUDPBuffer, 212992}} {
		fix, ok := udpBufferFix(c[0], c[1])
		if ok || fix != "sysctl -w net.core.rmem_max=7340032 net.core.wmem_max=7340032" {
			t.Errorf("udpBufferFix(%d, %d) = %q, %v", c[0], c[1], fix, ok)
		}
	}
}

func TestConfigValidation(t *testing.T) {
	ca := newTestCA(t)
	good := func() Config {
		c := DefaultLocalConfig()
		c.NodeName = "n"
		c.Certificate = ca.cert(t, "n")
		c.CAs = ca.ca.Pool()
		c.Members = newMembers("n")
		return c
	}
	for _, tc := range []struct {
		name string
		edit func(*Config)
	}{
		{"no name", func(c *Config) { c.NodeName = "" }},
		{"no certificate", func(c *Config) { c.Certificate.Certificate = nil }},
		{"certificate for another node", func(c *Config) { c.Certificate = ca.cert(t, "m") }},
		{"tiny message cap", func(c *Config) { c.MaxMessageSize = 100 }},
		{"no CAs", func(c *Config) { c.CAs = nil }},
		{"no members", func(c *Config) { c.Members = nil }},
		{"too many connections", func(c *Config) { c.ConnsPerPeer = 65 }},
		{"negative timeout", func(c *Config) { c.IdleTimeout = -1 }},
		{"peer request cap under the message cap", func(c *Config) { c.MaxMessageSize, c.MaxPeerRequestBytes = 1<<20, 1<<20-1 }},
		{"bad listen address", func(c *Config) { c.ListenAddr = "nowhere:xyz" }},
	} {
		c := good()
		tc.edit(&c)
		if n, err := NewNode(c); err == nil {
			n.Close()
			t.Errorf("%s: NewNode succeeded", tc.name)
		} else if tc.name != "bad listen address" && !errors.Is(err, ErrConfig) {
			t.Errorf("%s: err = %v, want ErrConfig", tc.name, err)
		}
	}
	// The peer request cap at the message cap is allowed.
	c := good()
	c.MaxMessageSize, c.MaxPeerRequestBytes = 1<<20, 1<<20
	n, err := NewNode(c)
	if err != nil {
		t.Fatalf("MaxPeerRequestBytes = MaxMessageSize: %v", err)
	}
	n.Close()
	c = good()
	c.ListenAddr = ""
	n, err = NewNode(c)
	if err != nil {
		t.Fatal(err)
	}
	if n.Addr() != nil {
		t.Error("dial-only node has a listen address")
	}
	n.Close()
	n.Close() // idempotent
}
