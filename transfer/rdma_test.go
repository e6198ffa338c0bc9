//go:build cgo && linux

package transfer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/rdma"
	"github.com/kvfabric/kvfabric/rdma/softverbs"
	"github.com/kvfabric/kvfabric/transfer/transferpb"
)

// softNIC points this test's RDMA at softverbs, the software NIC, with a
// registry of its own, and returns the control file its faults are
// written to. The library is built once per test binary.
func softNIC(t testing.TB) (lib, control string) {
	t.Helper()
	softPath, err := softverbs.BuildShared()
	if err != nil {
		t.Fatalf("softverbs (make test installs libibverbs-dev): %v", err)
	}
	dir := t.TempDir()
	control = filepath.Join(dir, "control")
	if err := os.WriteFile(control, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SOFTVERBS_REGISTRY", filepath.Join(dir, "registry"))
	t.Setenv("SOFTVERBS_CONTROL", control)
	return softPath, control
}

// withRDMADevices opens the named softverbs devices for a node, in order.
func withRDMADevices(t testing.TB, lib string, names []string, tune func(*RDMAConfig)) nodeOpt {
	t.Helper()
	l, err := rdma.Open(rdma.Config{Library: lib, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	var devs []*rdma.Device
	for _, name := range names {
		dev, err := l.OpenDevice(name, 1)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { dev.Close() })
		devs = append(devs, dev)
	}
	return func(c *Config) {
		c.RDMA = &RDMAConfig{Devices: devs, Backoff: 200 * time.Millisecond}
		if tune != nil {
			tune(c.RDMA)
		}
	}
}

// rdmaPair is a holder serving block set 7 (the test handler's lease
// names it) from two registered 8 MiB regions, and a reader with
// registered destinations, both with RDMA on unless told otherwise.
type rdmaPair struct {
	holder, reader *Node
	peer           *Peer
	src, dst, want [][]byte
	segs           []layout.Segment
}

func newRDMAPair(t *testing.T, lib string, holderRDMA bool, tune func(*RDMAConfig)) *rdmaPair {
	t.Helper()
	return newRDMAPairOn(t, lib, holderRDMA, tune, nil, nil, nil)
}

// newRDMAPairOn is newRDMAPair with both nodes on the named devices (nil:
// softverbs0), the holder's region r registered with its device
// holderNIC[r] and the reader's destination r with readerNIC[r] (nil: 0).
func newRDMAPairOn(t *testing.T, lib string, holderRDMA bool, tune func(*RDMAConfig), devices []string, holderNIC, readerNIC []int) *rdmaPair {
	t.Helper()
	if devices == nil {
		devices = []string{"softverbs0"}
	}
	var hopts []nodeOpt
	if holderRDMA {
		hopts = append(hopts, withRDMADevices(t, lib, devices, tune))
	}
	return newPairWith(t, hopts, []nodeOpt{withRDMADevices(t, lib, devices, tune)}, holderNIC, readerNIC)
}

// newPairWith is newRDMAPairOn with the nodes' options given: a holder
// without RDMA registers nothing.
func newPairWith(t *testing.T, hopts, ropts []nodeOpt, holderNIC, readerNIC []int) *rdmaPair {
	t.Helper()
	nic := func(of []int, r int) int {
		if of == nil {
			return 0
		}
		return of[r]
	}
	ca := newTestCA(t)
	members := newMembers("holder", "reader")
	h := newMemHandler()
	const srcSize = 8 << 20
	p := &rdmaPair{src: [][]byte{make([]byte, srcSize), make([]byte, srcSize)}}
	fill(p.src[0], 1)
	fill(p.src[1], 2)
	h.regions[7] = p.src
	leaseAll(h, 42, 2, srcSize)
	holderRDMA := len(hopts) > 0
	p.holder = newTestNode(t, ca, "holder", members, h, hopts...)
	if holderRDMA {
		for i, r := range p.src {
			if _, err := p.holder.registerMemory(nic(holderNIC, i), r); err != nil {
				t.Fatal(err)
			}
		}
	}
	p.reader = newTestNode(t, ca, "reader", members, nil, ropts...)
	p.peer = dialPeer(t, p.reader, p.holder)
	var sizes []uint64
	p.segs, sizes = stridedPlan(rand.New(rand.NewPCG(1, 2)), srcSize)
	// HND heads read into NHD rows: contiguous in the holder's memory,
	// strided in ours, so that work requests gather scatter lists.
	p.segs = append(p.segs, layout.Segment{SrcRank: 1, DstRank: 0, SrcOffset: 5 << 20, DstOffset: sizes[0],
		Length: 256, Count: 100, SrcStride: 256, DstStride: 1024})
	sizes[0] += 100 * 1024
	p.dst = [][]byte{make([]byte, sizes[0]+4096), make([]byte, sizes[1]+4096)}
	p.want = [][]byte{make([]byte, len(p.dst[0])), make([]byte, len(p.dst[1]))}
	execLocal(p.segs, p.src, p.want)
	for i, d := range p.dst {
		if _, err := p.reader.registerMemory(nic(readerNIC, i), d); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// read leases and reads the plan, checks every byte (and that nothing
// past the plan was written), and returns the transport that moved it.
func (p *rdmaPair) read(t *testing.T) Transport {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l, err := p.peer.Lease(ctx, []uint64{2}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range p.dst {
		clear(d)
	}
	via, err := p.peer.ReadVia(ctx, l.ID, 7, p.segs, p.dst)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	for r := range p.dst {
		if i := firstDiff(p.dst[r], p.want[r]); i >= 0 {
			t.Fatalf("read over %s: rank %d differs first at byte %d of %d", via, r, i, len(p.dst[r]))
		}
	}
	if _, err := p.peer.Release(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	return via
}

func (p *rdmaPair) metrics(t *testing.T) RDMAMetrics {
	t.Helper()
	m, ok := p.reader.RDMAMetrics()
	if !ok {
		t.Fatal("reader has no RDMA")
	}
	return m
}

// A strided plan (long runs, layer-separate chunks, NHD rows, odd sizes, a
// single byte) moves over RDMA byte for byte, pieces contiguous in the
// holder's memory merged into fewer work requests than pieces.
func TestReadOverRDMA(t *testing.T) {
	lib, _ := softNIC(t)
	p := newRDMAPair(t, lib, true, nil)
	if via := p.read(t); via != TransportRDMA {
		t.Fatalf("read went over %s, want rdma", via)
	}
	m := p.metrics(t)
	pieces := uint64(0)
	for _, s := range p.segs {
		pieces += s.Count
	}
	// The 100 gathered rows take 7 work requests of at most 16 entries.
	if m.Reads != 1 || m.Connects != 1 || m.Ops != pieces-100+7 || m.SGEs != pieces {
		t.Errorf("metrics %+v: want 1 read on 1 queue pair, %d work requests for %d pieces", m, pieces-100+7, pieces)
	}
	if m.ReadCPU <= 0 {
		t.Errorf("ReadCPU %v after a read over RDMA, want the posting and polling thread's time", m.ReadCPU)
	}
	if hm, _ := p.holder.RDMAMetrics(); hm.QPsServed != 1 || hm.RegisteredBytes != 16<<20 {
		t.Errorf("holder metrics %+v: want 1 queue pair served, 16 MiB registered", hm)
	}
	if st := p.holder.Metrics(); st.ReadsServed != 0 {
		t.Errorf("holder served %d reads over QUIC", st.ReadsServed)
	}
	// The queue pair is kept for the next read.
	if via := p.read(t); via != TransportRDMA || p.metrics(t).Connects != 1 {
		t.Errorf("second read over %s with %d connects, want rdma on the same queue pair", via, p.metrics(t).Connects)
	}
}

// With a NIC per GPU, each side's memory is registered with one of two
// devices: a read's pieces go on queue pairs between the device its
// destination is registered with and the one its source is, all four
// pairs at once here, byte for byte, each device counting what landed in
// its memory. A mismatched pair would fail (softverbs checks that keys
// belong to the queue pair's protection domain, as a NIC does).
func TestReadOverRDMAAcrossNICs(t *testing.T) {
	lib, _ := softNIC(t)
	t.Setenv("SOFTVERBS_DEVICES", "sva,svb")
	p := newRDMAPairOn(t, lib, true, nil, []string{"sva", "svb"}, []int{0, 1}, []int{1, 0})
	for range 2 {
		if via := p.read(t); via != TransportRDMA {
			t.Fatalf("read went over %s, want rdma", via)
		}
	}
	m := p.metrics(t)
	pairs := map[nicPair]bool{}
	var want [2]uint64
	for _, s := range p.segs {
		k := nicPair{local: 1 - s.DstRank, remote: s.SrcRank}
		pairs[k] = true
		want[k.local] += 2 * s.Bytes()
	}
	if len(m.Devices) != 2 || m.Devices[0].Name != "sva" || m.Devices[1].Name != "svb" ||
		m.Devices[0].ReadBytes != want[0] || m.Devices[1].ReadBytes != want[1] || m.Bytes != want[0]+want[1] {
		t.Fatalf("reader devices %+v (%d bytes in all), want %d bytes into sva's memory and %d into svb's", m.Devices, m.Bytes, want[0], want[1])
	}
	// One queue pair per device pair, kept for the second read.
	if m.Reads != 2 || m.Connects != uint64(len(pairs)) || m.Fallbacks[FallbackReadFailed] != 0 {
		t.Fatalf("metrics %+v: want 2 reads on %d queue pairs", m, len(pairs))
	}
	hm, _ := p.holder.RDMAMetrics()
	if hm.QPsServed != len(pairs) || hm.Devices[0].Registered != 8<<20 || hm.Devices[1].Registered != 8<<20 {
		t.Fatalf("holder metrics %+v: want %d queue pairs served, 8 MiB on each device", hm, len(pairs))
	}
}

// A holder without RDMA is read over QUIC, with the reason counted, and
// is not asked for keys again until the backoff ends.
func TestRDMAFallsBackForAHolderWithout(t *testing.T) {
	lib, _ := softNIC(t)
	p := newRDMAPair(t, lib, false, func(c *RDMAConfig) { c.Backoff = time.Minute })
	if via := p.read(t); via != TransportQUIC {
		t.Fatalf("read went over %s, want quic", via)
	}
	if m := p.metrics(t); m.Fallbacks[FallbackPeerHasNoRDMA] != 1 || m.Reads != 0 {
		t.Errorf("metrics %+v: want one fallback for peer-has-no-rdma", m)
	}
	if p.peer.wantRDMA() {
		t.Error("a lease right after asks a holder without RDMA for keys again")
	}
}

// An RDMA READ that completes with an error fails the read over RDMA: the
// same read goes over QUIC under the same lease, byte for byte; the peer
// is read over QUIC until its backoff ends, then over RDMA again on a new
// queue pair.
func TestRDMAReadErrorFallsBackToQUIC(t *testing.T) {
	lib, control := softNIC(t)
	p := newRDMAPair(t, lib, true, func(c *RDMAConfig) { c.Backoff = time.Minute })
	if err := os.WriteFile(control, []byte("fail_read=3"), 0o644); err != nil {
		t.Fatal(err)
	}
	if via := p.read(t); via != TransportQUIC {
		t.Fatalf("read with a failing READ went over %s, want quic", via)
	}
	os.WriteFile(control, nil, 0o644)
	m := p.metrics(t)
	if m.ReadFailures != 1 || m.Fallbacks[FallbackReadFailed] != 1 || m.Reads != 0 {
		t.Fatalf("metrics %+v: want one failed RDMA read, counted as read-failed", m)
	}
	// The bytes count as QUIC's, once.
	var total uint64
	for _, d := range p.dst {
		total += uint64(len(d))
	}
	if st := p.reader.Metrics(); st.Reads != 1 || st.BytesReadQUIC != st.BytesRead || st.BytesRead == 0 || st.BytesRead > total {
		t.Errorf("transfer metrics %+v: want one read, all of its bytes over QUIC", st)
	}
	if via := p.read(t); via != TransportQUIC {
		t.Fatalf("read during backoff went over %s, want quic", via)
	}
	if m := p.metrics(t); m.Fallbacks[FallbackBackoff] != 1 {
		t.Errorf("metrics %+v: want one backoff fallback", m)
	}
	// A lease taken during the backoff (it asks for no keys) and read
	// after it ends goes over QUIC too, counted as the backoff's.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	keyless, err := p.peer.Lease(ctx, []uint64{2}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// The backoff ends.
	p.peer.rdma.mu.Lock()
	p.peer.rdma.failedUntil = time.Now()
	p.peer.rdma.mu.Unlock()
	if via, err := p.peer.ReadVia(ctx, keyless.ID, 7, p.segs, p.dst); err != nil || via != TransportQUIC {
		t.Fatalf("read under a lease taken during the backoff: over %s, %v; want quic", via, err)
	}
	if _, err := p.peer.Release(ctx, keyless.ID); err != nil {
		t.Fatal(err)
	}
	if m := p.metrics(t); m.Fallbacks[FallbackBackoff] != 2 || m.Fallbacks[FallbackPeerHasNoRDMA] != 0 {
		t.Errorf("metrics %+v: want the keyless lease's read counted as backoff, not as a holder without RDMA", m)
	}
	if via := p.read(t); via != TransportRDMA {
		t.Fatalf("read after backoff went over %s, want rdma", via)
	}
	if st, m := p.reader.Metrics(), p.metrics(t); st.BytesRead != st.BytesReadQUIC+m.Bytes || m.Bytes == 0 {
		t.Errorf("transfer metrics %+v, rdma %+v: want bytes read = over QUIC + over RDMA", st, m)
	}
	if m := p.metrics(t); m.Connects != 2 {
		t.Errorf("metrics %+v: want a second queue pair after the failed one was destroyed", m)
	}
}

// Destination memory that is not registered is read over QUIC.
func TestRDMAUnregisteredDestinationGoesOverQUIC(t *testing.T) {
	lib, _ := softNIC(t)
	p := newRDMAPair(t, lib, true, nil)
	p.dst = [][]byte{make([]byte, len(p.dst[0])), make([]byte, len(p.dst[1]))}
	if via := p.read(t); via != TransportQUIC {
		t.Fatalf("read into unregistered memory went over %s, want quic", via)
	}
	if m := p.metrics(t); m.Fallbacks[FallbackNotRegistered] != 1 {
		t.Errorf("metrics %+v: want one not-registered fallback", m)
	}
}

// A reader whose connects reach MaxConnectsPerMinute reads over QUIC.
func TestRDMAConnectsPerMinuteBound(t *testing.T) {
	lib, control := softNIC(t)
	p := newRDMAPair(t, lib, true, func(c *RDMAConfig) {
		c.QPsPerPeer, c.MaxConnectsPerMinute, c.Backoff = 1, 1, time.Millisecond
	})
	os.WriteFile(control, []byte("fail_read=1"), 0o644)
	if via := p.read(t); via != TransportQUIC {
		t.Fatalf("first read went over %s, want quic after the injected failure", via)
	}
	os.WriteFile(control, nil, 0o644)
	time.Sleep(10 * time.Millisecond)
	if via := p.read(t); via != TransportQUIC {
		t.Fatalf("read past the connect bound went over %s, want quic", via)
	}
	if m := p.metrics(t); m.Connects != 1 || m.Fallbacks[FallbackConnectLimited] != 1 {
		t.Errorf("metrics %+v: want 1 connect and 1 connect-limited fallback", m)
	}
}

// Memory registered twice is refused; a node without RDMA refuses to
// register.
func TestRegisterMemory(t *testing.T) {
	lib, _ := softNIC(t)
	p := newRDMAPair(t, lib, true, nil)
	if _, err := p.holder.RegisterMemory(p.src[0][:4096]); err == nil {
		t.Error("a range already registered was registered again")
	}
	// A range that only overlaps a registration is refused too; one that
	// ends where a registration starts is not an overlap.
	both := make([]byte, 3<<20)
	if _, err := p.holder.RegisterMemory(both[1<<20 : 2<<20]); err != nil {
		t.Fatal(err)
	}
	if _, err := p.holder.RegisterMemory(both[:1<<20+1]); err == nil {
		t.Error("a range overlapping a registration by one byte was registered")
	}
	if _, err := p.holder.RegisterMemory(both[:1<<20]); err != nil {
		t.Errorf("a range ending where a registration starts: %v", err)
	}
	plain := newTestNode(t, newTestCA(t), "plain", newMembers(), nil)
	if _, err := plain.RegisterMemory(make([]byte, 4096)); err == nil || plain.RDMAEnabled() {
		t.Errorf("register without RDMA: %v", err)
	}
}

// readOps merges pieces contiguous in the holder's memory into one work
// request (at most maxSGE entries), pieces contiguous on both sides into
// one entry, splits what passes maxReadOp, and refuses pieces outside the
// holder's announced region.
func TestReadOps(t *testing.T) {
	dst := [][]byte{make([]byte, 1<<20)}
	base := uint64(uintptr(unsafePointer(dst[0])))
	regions := []remoteRegion{{addr: 1 << 40, length: 1 << 20, key: 9}}
	lkeys := []uint32{5}
	for _, tc := range []struct {
		name          string
		seg           layout.Segment
		maxSGE        int
		ops, sges     int
		firstEntryLen uint32
	}{
		{"contiguous both sides: one entry", layout.Segment{Length: 256, Count: 64, SrcStride: 256, DstStride: 256}, 4, 1, 1, 64 * 256},
		{"gathered rows at the SGE limit", layout.Segment{Length: 256, Count: 4, SrcStride: 256, DstStride: 512}, 4, 1, 4, 256},
		{"one row past the SGE limit", layout.Segment{Length: 256, Count: 5, SrcStride: 256, DstStride: 512}, 4, 2, 5, 256},
		{"strided in the holder: one request a piece", layout.Segment{Length: 128, Count: 10, SrcStride: 512, DstStride: 128}, 4, 10, 10, 128},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ops, sges, err := readOps([]layout.Segment{tc.seg}, regions, spansOf(dst), lkeys, tc.maxSGE)
			if err != nil {
				t.Fatal(err)
			}
			if len(ops) != tc.ops || sges != tc.sges || ops[0].Local[0].Length != tc.firstEntryLen {
				t.Fatalf("%d ops, %d entries, first entry %d bytes; want %d, %d, %d", len(ops), sges, ops[0].Local[0].Length, tc.ops, tc.sges, tc.firstEntryLen)
			}
			if ops[0].RemoteAddr != 1<<40 || ops[0].RKey != 9 || ops[0].Local[0].Addr != base || ops[0].Local[0].LKey != 5 {
				t.Fatalf("first op %+v", ops[0])
			}
			total := uint64(0)
			for _, op := range ops {
				for _, e := range op.Local {
					total += uint64(e.Length)
				}
			}
			if total != tc.seg.Bytes() {
				t.Fatalf("ops move %d bytes, the segment %d", total, tc.seg.Bytes())
			}
		})
	}
	// A piece over rdma.MaxReadBytes is split; at the limit it is not.
	big := []remoteRegion{{addr: 1 << 40, length: 5 << 30, key: 9}}
	fake := [][]byte{reserved(t, 5<<30)}
	if ops, _, err := readOps([]layout.Segment{{Length: rdma.MaxReadBytes, Count: 1}}, big, spansOf(fake), lkeys, 4); err != nil || len(ops) != 1 {
		t.Fatalf("a piece of MaxReadBytes: %d ops, %v", len(ops), err)
	}
	if ops, _, err := readOps([]layout.Segment{{Length: rdma.MaxReadBytes + 1, Count: 1}}, big, spansOf(fake), lkeys, 4); err != nil || len(ops) != 2 {
		t.Fatalf("a piece of MaxReadBytes+1: %d ops, %v", len(ops), err)
	}
	// At the region's end, and one byte past it.
	if _, _, err := readOps([]layout.Segment{{SrcOffset: 1<<20 - 256, Length: 256, Count: 1}}, regions, spansOf(dst), lkeys, 4); err != nil {
		t.Fatalf("a piece ending at the region's end: %v", err)
	}
	if _, _, err := readOps([]layout.Segment{{SrcOffset: 1<<20 - 255, Length: 256, Count: 1}}, regions, spansOf(dst), lkeys, 4); err == nil {
		t.Fatal("a piece past the holder's region was accepted")
	}
	if _, _, err := readOps([]layout.Segment{{SrcRank: 1, Length: 1, Count: 1}}, regions, spansOf(dst), lkeys, 4); err == nil {
		t.Fatal("a rank the holder gave no region for was accepted")
	}
}

func unsafePointer(b []byte) unsafe.Pointer { return unsafe.Pointer(unsafe.SliceData(b)) }

// reserved returns n bytes of address space that nothing may touch, for
// readOps, which computes addresses and never touches the memory.
func reserved(t *testing.T, n int) []byte {
	b, err := unix.Mmap(-1, 0, n, unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANON|unix.MAP_NORESERVE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	return b
}

// A connect names the holder's device within MaxNICs (the last index is
// decoded, one past it refused), and a holder refuses a device it does
// not have; a lease naming a device past MaxNICs is a bad frame.
func TestRDMADeviceIndexLimits(t *testing.T) {
	gid := make([]byte, 16)
	gid[10], gid[11], gid[12], gid[15] = 0xff, 0xff, 127, 1
	ep := &transferpb.RdmaEndpoint{Qpn: 5, Psn: 1, Gid: gid, Mtu: 1024, LinkLayer: 2, ReadDepth: 16}
	for _, tc := range []struct {
		nic uint32
		ok  bool
	}{{0, true}, {MaxNICs - 1, true}, {MaxNICs, false}, {1 << 31, false}} {
		b, err := proto.Marshal(&transferpb.RdmaConnectRequest{Endpoint: ep, Nic: tc.nic})
		if err != nil {
			t.Fatal(err)
		}
		r, err := decodeRequest(methodRdmaConnect, b, 1)
		if tc.ok != (err == nil) || (err == nil && r.nic != int(tc.nic)) {
			t.Fatalf("connect to nic %d: %+v %v", tc.nic, r, err)
		}
		if err != nil && !errors.Is(err, ErrInvalidRequest) {
			t.Fatalf("connect to nic %d: %v, want ErrInvalidRequest", tc.nic, err)
		}
	}

	lib, _ := softNIC(t)
	p := newRDMAPair(t, lib, true, nil)
	remote := rdma.Endpoint{QPN: 5, PSN: 1, MTU: 1024, LinkLayer: rdma.LinkLayerEthernet, ReadDepth: 16}
	if _, err := p.holder.serveConnect("reader", nicPair{local: 1}, 2, remote); !errors.Is(err, ErrInvalidRequest) || !strings.Contains(err.Error(), "1 RDMA devices") {
		t.Fatalf("connect to the second device of a holder with one: %v", err)
	}
	lease := &Lease{ID: 9, LayoutDigests: map[uint64][]byte{7: nil}}
	for _, tc := range []struct {
		nic uint32
		ok  bool
	}{{MaxNICs - 1, true}, {MaxNICs, false}} {
		err := p.peer.keepRegions(9, lease, []*transferpb.RdmaRegion{{BlockSet: 7, Rank: 0, Addr: 4096, Length: 4096, Rkey: 3, Nic: tc.nic}}, nil)
		if tc.ok != (err == nil) || (err != nil && !errors.Is(err, ErrFrame)) {
			t.Fatalf("lease region on nic %d: %v", tc.nic, err)
		}
	}

	// What the reader keeps of a lease's keys is sized by what the lease
	// carried: a set's ranks below its highest region without one (memory
	// the holder did not register) are at most maxLeaseRegionHoles in all.
	two := &Lease{ID: 10, LayoutDigests: map[uint64][]byte{7: nil, 8: nil}}
	for _, tc := range []struct {
		rank7, rank8 uint32
		ok           bool
	}{
		{maxRank - 1, 0, true},  // 4,096 ranks kept for 1 region + 4,095 holes, 1 for 1
		{maxRank - 1, 1, true},  // holes: 4,095 + 1, at the limit
		{maxRank - 1, 2, false}, // one past it
		{maxRank - 1, maxRank - 1, false},
	} {
		err := p.peer.keepRegions(10, two, []*transferpb.RdmaRegion{
			{BlockSet: 7, Rank: tc.rank7, Addr: 4096, Length: 4096, Rkey: 3},
			{BlockSet: 8, Rank: tc.rank8, Addr: 4096, Length: 4096, Rkey: 3},
		}, nil)
		if tc.ok != (err == nil) || (err != nil && (!errors.Is(err, ErrFrame) || !strings.Contains(err.Error(), "without a region"))) {
			t.Fatalf("lease regions at ranks %d and %d: %v", tc.rank7, tc.rank8, err)
		}
	}
}

// A read waiting for a queue pair (all of its pair's busy) stops with
// ErrClosed when the peer handle is closed, not at its deadline.
func TestRDMAQueuePairWaitEndsWithThePeer(t *testing.T) {
	lib, _ := softNIC(t)
	p := newRDMAPair(t, lib, true, func(c *RDMAConfig) { c.QPsPerPeer = 1 })
	k := nicPair{}
	v := p.peer.rdma.tp.(*verbsPeer)
	v.mu.Lock()
	v.qps[k] = &qpPool{open: 1} // one queue pair, reading elsewhere
	v.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := v.takeQP(ctx, k)
		done <- err
	}()
	// Until it waits: a goroutine blocked in takeQP's select.
	deadline := time.Now().Add(10 * time.Second)
	for buf := make([]byte, 1<<20); ; {
		waiting := false
		for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
			waiting = waiting || strings.Contains(g, " [select]:\n") && strings.Contains(g, ".takeQP(")
		}
		if waiting {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the read never waited for a queue pair")
		}
		runtime.Gosched()
	}
	start := time.Now()
	p.peer.Close()
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("waiting read after the peer closed: %v, want ErrClosed", err)
		}
		t.Logf("woken %v after the close", time.Since(start))
	case <-time.After(20 * time.Second):
		t.Fatal("a read waiting for a queue pair still waits 20 s after its peer closed")
	}
}

// rankReads reads, reads times, one contiguous run of size bytes per
// rank from a holder on holderDevs (rank r's region registered with
// holderNIC[r]) into a reader on readerDevs (readerNIC[r]), checking every
// byte, and returns both nodes. holderTune and readerTune adjust their
// configs.
func rankReads(t *testing.T, lib string, reads int, size int, holderDevs, readerDevs []string, holderNIC, readerNIC []int, holderTune, readerTune func(*RDMAConfig)) (holder, reader *Node) {
	t.Helper()
	ranks := len(holderNIC)
	ca := newTestCA(t)
	members := newMembers("holder", "reader")
	h := newMemHandler()
	src := make([][]byte, ranks)
	for r := range src {
		src[r] = make([]byte, size)
		fill(src[r], uint64(r+1))
	}
	h.regions[7] = src
	leaseAll(h, 42, ranks, uint64(size))
	holder = newTestNode(t, ca, "holder", members, h, withRDMADevices(t, lib, holderDevs, holderTune))
	reader = newTestNode(t, ca, "reader", members, nil, withRDMADevices(t, lib, readerDevs, readerTune))
	dst := make([][]byte, ranks)
	var segs []layout.Segment
	for r := range src {
		if _, err := holder.registerMemory(holderNIC[r], src[r]); err != nil {
			t.Fatal(err)
		}
		dst[r] = make([]byte, size)
		if _, err := reader.registerMemory(readerNIC[r], dst[r]); err != nil {
			t.Fatal(err)
		}
		n := uint64(size)
		segs = append(segs, layout.Segment{SrcRank: r, DstRank: r, Length: n, Count: 1, SrcStride: n, DstStride: n})
	}
	peer := dialPeer(t, reader, holder)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range reads {
		l, err := peer.Lease(ctx, []uint64{2}, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		for r := range dst {
			clear(dst[r])
		}
		via, err := peer.ReadVia(ctx, l.ID, 7, segs, dst)
		if err != nil || via != TransportRDMA {
			t.Fatalf("read %d over %s: %v", i, via, err)
		}
		for r := range dst {
			if !bytes.Equal(dst[r], src[r]) {
				t.Fatalf("read %d: rank %d differs", i, r)
			}
		}
		if _, err := peer.Release(ctx, l.ID); err != nil {
			t.Fatal(err)
		}
	}
	return holder, reader
}

// Three of the reader's devices reading from one of the holder's keep
// their queue pairs: the holder bounds them per pair of devices, not per
// device of its own (where three pairs of QPsPerPeer 1 would pass its
// bound of 2 and every other read would find its queue pair gone).
func TestRDMAManyReaderNICsOnOneHolderNIC(t *testing.T) {
	lib, _ := softNIC(t)
	t.Setenv("SOFTVERBS_DEVICES", "sva,svb,svc")
	one := func(c *RDMAConfig) { c.QPsPerPeer = 1 }
	holder, reader := rankReads(t, lib, 4, 1<<20, []string{"sva"}, []string{"sva", "svb", "svc"}, []int{0, 0, 0}, []int{0, 1, 2}, one, one)
	m, _ := reader.RDMAMetrics()
	hm, _ := holder.RDMAMetrics()
	if m.Reads != 4 || m.ReadFailures != 0 || m.Connects != 3 || hm.QPsServed != 3 {
		t.Fatalf("reader %+v, holder serves %d queue pairs: want 4 reads on 3 queue pairs, none failed", m, hm.QPsServed)
	}
}

// A read of a pair of devices large enough to give each lane
// minLaneBytes goes on QPsPerPeer queue pairs at once, split by bytes; at
// one lane's worth it stays on one.
func TestRDMALargeReadsGoInLanes(t *testing.T) {
	lib, _ := softNIC(t)
	for _, tc := range []struct {
		size     int // per rank, two ranks
		qps      int
		connects uint64
	}{
		{minLaneBytes, 2, 2},     // two lanes of exactly minLaneBytes
		{minLaneBytes - 1, 2, 1}, // a byte short of two lanes
		{4 * minLaneBytes, 1, 1}, // one queue pair allowed
		{4 * minLaneBytes, 3, 3},
	} {
		t.Run(fmt.Sprintf("2x%d/qps=%d", tc.size, tc.qps), func(t *testing.T) {
			tune := func(c *RDMAConfig) { c.QPsPerPeer = tc.qps }
			_, reader := rankReads(t, lib, 2, tc.size, []string{"softverbs0"}, []string{"softverbs0"}, []int{0, 0}, []int{0, 0}, tune, tune)
			m, _ := reader.RDMAMetrics()
			if m.Reads != 2 || m.Connects != tc.connects || m.ReadFailures != 0 || m.Bytes != uint64(4*tc.size) || m.Devices[0].ReadBytes != m.Bytes {
				t.Fatalf("metrics %+v: want 2 reads of %d bytes on %d queue pairs", m, 2*tc.size, tc.connects)
			}
		})
	}
}

// A holder whose RDMA regions are too short for the plan costs no queue
// pair: the read goes over QUIC, counted as bad-remote-region.
func TestRDMAShortRegionsTakeNoQueuePair(t *testing.T) {
	lib, _ := softNIC(t)
	p := newRDMAPair(t, lib, true, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l, err := p.peer.Lease(ctx, []uint64{2}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	r := p.peer.rdma
	r.mu.Lock()
	regions := r.leases[l.ID][7]
	if len(regions) != 2 {
		r.mu.Unlock()
		t.Fatalf("lease keys for %d ranks, want 2", len(regions))
	}
	regions[1].length = 4096 // the plan reads rank 1 far past this
	r.mu.Unlock()
	via, err := p.peer.ReadVia(ctx, l.ID, 7, p.segs, p.dst)
	if err != nil || via != TransportQUIC {
		t.Fatalf("read with short keys: over %s, %v; want quic", via, err)
	}
	for rank := range p.dst {
		if i := firstDiff(p.dst[rank], p.want[rank]); i >= 0 {
			t.Fatalf("rank %d differs first at byte %d", rank, i)
		}
	}
	if m := p.metrics(t); m.Fallbacks[FallbackBadKeys] != 1 || m.Connects != 0 || m.Reads != 0 {
		t.Fatalf("metrics %+v: want one bad-remote-region fallback and no queue pair", m)
	}
}

// A reader that reads on more queue pairs than the holder would keep for
// itself keeps them all: it says how many it reads on when it connects.
func TestRDMAReaderKeepsMoreQueuePairsThanTheHolder(t *testing.T) {
	lib, _ := softNIC(t)
	holderQPs := func(c *RDMAConfig) { c.QPsPerPeer = 1 }
	readerQPs := func(c *RDMAConfig) { c.QPsPerPeer = 4 }
	holder, reader := rankReads(t, lib, 4, 8*minLaneBytes, []string{"softverbs0"}, []string{"softverbs0"}, []int{0}, []int{0}, holderQPs, readerQPs)
	m, _ := reader.RDMAMetrics()
	hm, _ := holder.RDMAMetrics()
	if m.Reads != 4 || m.ReadFailures != 0 || m.Connects != 4 || hm.QPsServed != 4 {
		t.Fatalf("reader %+v, holder serves %d: want 4 reads on 4 queue pairs kept", m, hm.QPsServed)
	}
}

// QPsPerPeer is bounded: MaxQPsPerPeer is accepted, one more refused.
func TestRDMAQPsPerPeerLimit(t *testing.T) {
	for _, tc := range []struct {
		qps int
		ok  bool
	}{{MaxQPsPerPeer, true}, {MaxQPsPerPeer + 1, false}, {-1, false}} {
		c := &RDMAConfig{Devices: []*rdma.Device{{}}, QPsPerPeer: tc.qps}
		if err := c.populate(); (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrConfig)) {
			t.Fatalf("QPsPerPeer %d: %v", tc.qps, err)
		}
	}
}

// A registration ends with DeregisterMemory of exactly its range, after
// which the range may be registered again; a range that is not exactly a
// registration is refused, as is a node without RDMA.
func TestDeregisterMemory(t *testing.T) {
	lib, _ := softNIC(t)
	p := newRDMAPair(t, lib, true, nil)
	buf := make([]byte, 2<<20)
	if _, err := p.holder.RegisterMemory(buf[:1<<20]); err != nil {
		t.Fatal(err)
	}
	m, _ := p.holder.RDMAMetrics()
	before := m.RegisteredBytes
	for _, bad := range [][]byte{buf[:1<<20-1], buf[4096 : 1<<20], buf[:2<<20]} {
		if err := p.holder.DeregisterMemory(bad); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("deregister %d bytes at +%d: %v, want ErrInvalidRequest", len(bad), len(buf)-cap(bad), err)
		}
	}
	if err := p.holder.DeregisterMemory(buf[:1<<20]); err != nil {
		t.Fatal(err)
	}
	if m, _ := p.holder.RDMAMetrics(); m.RegisteredBytes != before-1<<20 {
		got := m.RegisteredBytes
		t.Errorf("registered %d bytes after the deregistration, want %d", got, before-1<<20)
	}
	if err := p.holder.DeregisterMemory(buf[:1<<20]); !errors.Is(err, ErrInvalidRequest) {
		t.Errorf("second deregistration: %v, want ErrInvalidRequest", err)
	}
	if _, err := p.holder.RegisterMemory(buf[:1<<20]); err != nil {
		t.Errorf("register again after the deregistration: %v", err)
	}
	plain := newTestNode(t, newTestCA(t), "plain", newMembers(), nil)
	if err := plain.DeregisterMemory(make([]byte, 4096)); err == nil {
		t.Error("deregister without RDMA succeeded")
	}
}
