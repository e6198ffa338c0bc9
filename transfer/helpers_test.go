package transfer

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/transfer/certs"
)

// testCA is one cluster CA shared by a test's nodes.
type testCA struct {
	ca *certs.CA
}

func newTestCA(t testing.TB) *testCA {
	t.Helper()
	ca, err := certs.NewCA("test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{ca: ca}
}

func (c *testCA) cert(t testing.TB, name string) tls.Certificate {
	t.Helper()
	p, err := c.ca.IssueNode(name, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	tc, err := p.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	return tc
}

// memberSet is a Members whose answers a test changes.
type memberSet struct {
	mu    sync.Mutex
	names map[string]bool
}

func newMembers(names ...string) *memberSet {
	m := &memberSet{names: map[string]bool{}}
	for _, n := range names {
		m.names[n] = true
	}
	return m
}

func (m *memberSet) IsMember(name string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.names[name]
}

func (m *memberSet) set(name string, ok bool) {
	m.mu.Lock()
	m.names[name] = ok
	m.mu.Unlock()
}

var nextLoopback atomic.Uint32

// loopback returns a fresh 127.0.0.x address with port 0, so that each
// node of a test has its own address.
func loopback() string {
	return fmt.Sprintf("127.0.0.%d:0", 2+nextLoopback.Add(1)%200)
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

type nodeOpt func(*Config)

func newTestNode(t testing.TB, ca *testCA, name string, members Members, h Handler, opts ...nodeOpt) *Node {
	t.Helper()
	cfg := DefaultLocalConfig()
	cfg.ListenAddr = loopback()
	cfg.NodeName = name
	cfg.Certificate = ca.cert(t, name)
	cfg.CAs = ca.ca.Pool()
	cfg.Members = members
	cfg.Handler = h
	cfg.Logger = quietLogger()
	for _, o := range opts {
		o(&cfg)
	}
	n, err := NewNode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

func dialPeer(t testing.TB, from, to *Node) *Peer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := from.Peer(ctx, to.Addr().String(), to.Name())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// span is a leased byte range of one rank's region.
type span struct {
	rank     int
	off, len uint64
}

// memHandler is a Handler over in-memory regions, with leases as lists of
// byte ranges, and hooks to stall or count calls.
type memHandler struct {
	mu      sync.Mutex
	regions map[uint64][][]byte
	leases  map[uint64][]span
	calls   atomic.Int64
	peers   []string
	stall   chan struct{} // when set, CheckRead and Lease block until closed or ctx ends
	// badDigest makes leases name a layout digest of the wrong length.
	badDigest bool
	// grant, when set (setGrant), is the term Lease and Renew grant for
	// the term asked (a holder's cap); unset, they grant what was asked.
	grant func(asked time.Duration) time.Duration
}

func (h *memHandler) setGrant(f func(asked time.Duration) time.Duration) {
	h.mu.Lock()
	h.grant = f
	h.mu.Unlock()
}

// granted is the term granted for asked.
func (h *memHandler) granted(asked time.Duration) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.grant == nil {
		return asked
	}
	return h.grant(asked)
}

func newMemHandler() *memHandler {
	return &memHandler{regions: map[uint64][][]byte{}, leases: map[uint64][]span{}}
}

func (h *memHandler) seen(peer string) {
	h.calls.Add(1)
	h.mu.Lock()
	h.peers = append(h.peers, peer)
	h.mu.Unlock()
}

func (h *memHandler) Hello(ctx context.Context, peer string, req HelloInfo) (HelloInfo, error) {
	h.seen(peer)
	return HelloInfo{Features: append([]string{"echo"}, req.Features...), LayoutSetDigest: []byte("digest-1")}, nil
}

func (h *memHandler) Layouts(ctx context.Context, peer string, digests [][]byte) ([]LayoutEntry, error) {
	h.seen(peer)
	var out []LayoutEntry
	if len(digests) == 0 {
		digests = [][]byte{[]byte("known")}
	}
	for _, d := range digests {
		if string(d) == "known" {
			out = append(out, LayoutEntry{Digest: d, BlockSet: 7, Layout: []byte("layout-bytes")})
		}
	}
	return out, nil
}

func (h *memHandler) Lease(ctx context.Context, peer string, hashes []uint64, d time.Duration) (Lease, error) {
	h.seen(peer)
	if h.stall != nil {
		select {
		case <-h.stall:
		case <-ctx.Done():
			return Lease{}, ctx.Err()
		}
	}
	l := Lease{ID: 42, Duration: h.granted(d), LayoutDigests: map[uint64][]byte{7: testDigest[:]}}
	if h.badDigest {
		l.LayoutDigests[7] = testDigest[:8]
	}
	for i, hh := range hashes {
		l.Blocks = append(l.Blocks, LeasedBlock{Hash: hh, Present: hh%2 == 0, BlockSet: 7, Slot: uint64(i), Generation: hh + 1})
		if hh%2 != 0 {
			l.Blocks[i] = LeasedBlock{Hash: hh}
		}
	}
	return l, nil
}

func (h *memHandler) Renew(ctx context.Context, peer string, id uint64, d time.Duration) (time.Duration, error) {
	h.seen(peer)
	if id != 42 {
		return 0, nil
	}
	return h.granted(d), nil
}

func (h *memHandler) Release(ctx context.Context, peer string, id uint64) (bool, error) {
	h.seen(peer)
	if id == 0 {
		return false, fmt.Errorf("%w: lease 0", ErrNotFound)
	}
	return id == 42, nil
}

func (h *memHandler) EventRange(ctx context.Context, peer string, q EventQuery) (EventRange, error) {
	h.seen(peer)
	origin, from, to := q.Origin, q.From, q.To
	if q.Snapshot {
		return EventRange{SnapshotSeq: 7, Events: []LogEntry{{Seq: 7, Payload: []byte(fmt.Sprintf("%s@%d", origin, q.Incarnation))}}}, nil
	}
	if from < 100 {
		return EventRange{SnapshotNeeded: true}, nil
	}
	if origin == "liar" {
		return EventRange{Events: []LogEntry{{Seq: to}}}, nil
	}
	var er EventRange
	for s := from; s < to; s++ {
		er.Events = append(er.Events, LogEntry{Seq: s, Payload: []byte(fmt.Sprintf("%s/%d", origin, s))})
	}
	return er, nil
}

func (h *memHandler) CheckRead(peer string, leaseID, blockSet uint64, seg layout.Segment) error {
	h.seen(peer)
	if h.stall != nil {
		<-h.stall
	}
	h.mu.Lock()
	spans, ok := h.leases[leaseID]
	h.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: lease %d unknown", ErrLeaseRefused, leaseID)
	}
	return ForEachPiece(seg, func(off, n uint64) error {
		for _, s := range spans {
			if s.rank == seg.SrcRank && off >= s.off && off+n <= s.off+s.len {
				return nil
			}
		}
		return fmt.Errorf("%w: rank %d [%d, %d) not leased", ErrLeaseRefused, seg.SrcRank, off, off+n)
	})
}

func (h *memHandler) Region(blockSet uint64, rank int) ([]byte, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	rs, ok := h.regions[blockSet]
	if !ok || rank >= len(rs) {
		return nil, fmt.Errorf("%w: block set %d rank %d", ErrNotFound, blockSet, rank)
	}
	return rs[rank], nil
}

// fill writes a position-dependent pattern, so that a byte read from the
// wrong offset or rank shows.
func fill(b []byte, seed uint64) {
	x := seed*0x9E3779B97F4A7C15 + 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i] = byte(x)
	}
}

// execLocal applies segs from src to dst in memory: the expected result.
func execLocal(segs []layout.Segment, src, dst [][]byte) {
	for _, s := range segs {
		for i := uint64(0); i < s.Count; i++ {
			so, do := s.Piece(i)
			copy(dst[s.DstRank][do:do+s.Length], src[s.SrcRank][so:so+s.Length])
		}
	}
}
