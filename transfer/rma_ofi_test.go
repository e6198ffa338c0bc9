//go:build cgo && linux

package transfer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/kvfabric/kvfabric/internal/wait"
	"github.com/kvfabric/kvfabric/rdma"
	"github.com/kvfabric/kvfabric/rdma/ofi"
	"github.com/kvfabric/kvfabric/transfer/transferpb"
)

// ofiProviders are libfabric's providers on every Debian machine that offer
// RMA reads on RDM endpoints without hardware.
var ofiProviders = []string{"tcp", "shm"}

// withOFI gives a node an endpoint of libfabric's provider prov (make
// test-deps installs libfabric; its absence fails the test).
func withOFI(t testing.TB, prov string, tune func(*RDMAConfig)) nodeOpt {
	t.Helper()
	ep := openOFI(t, prov)
	return func(c *Config) {
		c.RDMA = &RDMAConfig{OFI: ep, Backoff: 200 * time.Millisecond, OFIReadTimeout: 3 * time.Second}
		if tune != nil {
			tune(c.RDMA)
		}
	}
}

func openOFI(t testing.TB, prov string) *ofi.Endpoint {
	t.Helper()
	return openOFIGrace(t, prov, time.Second)
}

// openOFIGrace is openOFI with the endpoint's flush grace. The endpoint is
// host-only, as an agent's without device pools is (shm reads by
// cross-memory attach; rdma/ofi's tests cover shm with FI_HMEM too).
func openOFIGrace(t testing.TB, prov string, grace time.Duration) *ofi.Endpoint {
	t.Helper()
	return openOFIWith(t, ofi.Config{Provider: prov, FlushGrace: grace, HostOnly: true})
}

// openOFIWith opens an endpoint configured as cfg says.
func openOFIWith(t testing.TB, cfg ofi.Config) *ofi.Endpoint {
	t.Helper()
	prov := cfg.Provider
	cfg.Logger = quietLogger()
	if prov == "tcp" {
		cfg.Node = "127.0.0.1"
	}
	l, err := ofi.Load(cfg)
	if err != nil {
		t.Fatalf("libfabric is needed for these tests (make test-deps): %v", err)
	}
	t.Cleanup(func() { l.Close() })
	ep, err := l.Open()
	if err != nil {
		t.Fatalf("open a libfabric %s endpoint: %v", prov, err)
	}
	t.Cleanup(func() { ep.Close() })
	return ep
}

func newOFIPair(t *testing.T, prov string, tune func(*RDMAConfig)) *rdmaPair {
	t.Helper()
	return newPairWith(t, []nodeOpt{withOFI(t, prov, tune)}, []nodeOpt{withOFI(t, prov, tune)}, nil, nil)
}

// A strided plan moves over libfabric byte for byte (rdmaPair.read checks
// every byte, and that nothing past the plan was written), read after
// read, and the metrics name the provider.
func TestReadOverOFI(t *testing.T) {
	for _, prov := range ofiProviders {
		t.Run(prov, func(t *testing.T) {
			p := newOFIPair(t, prov, nil)
			for round := range 3 {
				if via := p.read(t); via != TransportRDMA {
					t.Fatalf("round %d went over %s, want rdma", round, via)
				}
			}
			m := p.metrics(t)
			if !strings.HasPrefix(m.Binding, "ofi:"+prov) || len(m.Devices) != 1 || m.Devices[0].Name != m.Binding {
				t.Errorf("binding %q, devices %+v: want ofi:%s and one endpoint", m.Binding, m.Devices, prov)
			}
			var want uint64
			for _, d := range p.want {
				want += uint64(len(d))
			}
			if m.Reads != 3 || m.Bytes == 0 || m.ReadFailures != 0 || len(nonZero(m.Fallbacks)) != 0 {
				t.Errorf("metrics %+v: want 3 reads over libfabric, no failure or fallback", m)
			}
			if hm, _ := p.holder.RDMAMetrics(); hm.RegisteredBytes != 16<<20 || hm.QPsServed != 0 {
				t.Errorf("holder metrics %+v: want 16 MiB registered and nothing served per peer", hm)
			}
		})
	}
}

func nonZero(m map[string]uint64) map[string]uint64 {
	out := map[string]uint64{}
	for k, v := range m {
		if v != 0 {
			out[k] = v
		}
	}
	return out
}

// A region key that is not the holder's fails the libfabric read, and the
// read goes over QUIC, every byte checked; the peer backs off. tcp answers
// with an error completion; shm opened with FI_HMEM drops the read, which
// ends at the read timeout (host-only, shm reads by cross-memory attach
// and looks at no key: rdma/ofi's doc).
func TestOFIWrongKeyFallsBackToQUIC(t *testing.T) {
	for _, prov := range ofiProviders {
		t.Run(prov, func(t *testing.T) {
			opt := func() nodeOpt {
				ep := openOFIWith(t, ofi.Config{Provider: prov, FlushGrace: time.Second, HostOnly: prov != "shm"})
				return func(c *Config) {
					c.RDMA = &RDMAConfig{OFI: ep, Backoff: 200 * time.Millisecond, OFIReadTimeout: 3 * time.Second}
				}
			}
			p := newPairWith(t, []nodeOpt{opt()}, []nodeOpt{opt()}, nil, nil)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			l, err := p.peer.Lease(ctx, []uint64{2}, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			p.peer.rdma.mu.Lock()
			for _, rs := range p.peer.rdma.leases[l.ID] {
				for i := range rs {
					rs[i].key ^= 0x5a5a
				}
			}
			p.peer.rdma.mu.Unlock()
			via, err := p.peer.ReadVia(ctx, l.ID, 7, p.segs, p.dst)
			if err != nil || via != TransportQUIC {
				t.Fatalf("read with a wrong key: over %s, %v; want quic", via, err)
			}
			p.checkBytes(t)
			if m := p.metrics(t); m.ReadFailures != 1 || m.Fallbacks[FallbackReadFailed] != 1 || m.Reads != 0 {
				t.Errorf("metrics %+v: want one failed libfabric read counted as read-failed", m)
			}
		})
	}
}

// A lease's keys are read only on the holder's endpoint that issued them:
// once a later lease answer names another endpoint of the holder's (one
// that replaced it, where the same key may name other memory), a read
// under the earlier lease goes over QUIC, every byte checked; a lease
// answered by the holder's endpoint of now reads over libfabric again.
func TestOFIKeysOfAReplacedEndpointAreNotRead(t *testing.T) {
	for _, prov := range ofiProviders {
		t.Run(prov, func(t *testing.T) {
			p := newOFIPair(t, prov, nil)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			old, err := p.peer.Lease(ctx, []uint64{2}, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if err := p.peer.rdma.tp.answered(&transferpb.LeaseResponse{OfiName: []byte("the holder's next endpoint")}); err != nil {
				t.Fatal(err)
			}
			via, err := p.peer.ReadVia(ctx, old.ID, 7, p.segs, p.dst)
			if err != nil || via != TransportQUIC {
				t.Fatalf("a read under a lease of the holder's earlier endpoint: over %s, %v; want quic", via, err)
			}
			p.checkBytes(t)
			if m := p.metrics(t); m.Fallbacks[FallbackBadKeys] != 1 || m.Reads != 0 || m.ReadFailures != 0 {
				t.Fatalf("metrics %+v: want the read fallen back for its keys, not tried", m)
			}
			if via := p.read(t); via != TransportRDMA {
				t.Fatalf("a read under a lease of the holder's endpoint of now went over %s, want rdma", via)
			}
		})
	}
}

// A lease answer's keys and endpoint name are of one endpoint: a
// replacement of the holder's endpoint (keys start again at 1 there, and
// may name other memory) waits for an answer under way, which names the
// endpoint its keys were read on.
func TestOFILeaseAnswerIsOfOneEndpoint(t *testing.T) {
	p := newOFIPair(t, "tcp", nil)
	tp := p.holder.rdma.tp.(*ofiTransport)
	old, _ := tp.endpoint()
	done := tp.answering()
	regions := p.holder.rdmaRegions(map[uint64][]byte{7: nil})
	if len(regions) == 0 {
		t.Fatal("no regions: nothing is tested")
	}
	replaced := make(chan error, 1)
	go func() { replaced <- tp.replace(old) }()
	time.Sleep(200 * time.Millisecond)
	select {
	case err := <-replaced:
		t.Fatalf("the holder's endpoint was replaced (%v) while a lease answer was being made", err)
	default:
	}
	resp := &transferpb.LeaseResponse{LeaseId: 1, DurationMs: 1000, RdmaRegions: regions}
	tp.answer("reader", nil, resp)
	done()
	if err := <-replaced; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(resp.OfiName, old.Name()) {
		t.Fatal("a lease answer named another endpoint than the one its keys were read on")
	}
	if now, _ := tp.endpoint(); now == old {
		t.Fatal("the endpoint was not replaced: nothing is tested")
	}
}

// checkBytes checks every byte of the destinations against the plan.
func (p *rdmaPair) checkBytes(t *testing.T) {
	t.Helper()
	for r := range p.dst {
		if i := firstDiff(p.dst[r], p.want[r]); i >= 0 {
			t.Fatalf("rank %d differs first at byte %d of %d", r, i, len(p.dst[r]))
		}
	}
}

// A holder whose libfabric endpoint closes in the middle of reads (the
// holder's NIC gone) ends each read over QUIC with every byte, or in a
// clear error, within the read's deadline; never a hang. Over tcp only:
// both nodes here are one process, and shm's reader maps the holder's
// shared memory, which closing the holder's endpoint unmaps under it (a
// holder process killed mid-read over shm is rdma/ofi's
// TestHolderKilledMidRead).
func TestOFIHolderClosedMidRead(t *testing.T) {
	for _, prov := range []string{"tcp"} {
		t.Run(prov, func(t *testing.T) {
			hep := openOFI(t, prov)
			hopt := func(c *Config) { c.RDMA = &RDMAConfig{OFI: hep, Backoff: time.Hour} }
			p := newPairWith(t, []nodeOpt{hopt}, []nodeOpt{withOFI(t, prov, nil)}, nil, nil)
			if via := p.read(t); via != TransportRDMA {
				t.Fatalf("first read went over %s, want rdma", via)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			l, err := p.peer.Lease(ctx, []uint64{2}, 20*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range p.dst {
				clear(d)
			}
			type result struct {
				via Transport
				err error
			}
			done := make(chan result, 1)
			go func() {
				via, err := p.peer.ReadVia(ctx, l.ID, 7, p.segs, p.dst)
				done <- result{via, err}
			}()
			hep.Close()
			select {
			case r := <-done:
				switch {
				case r.err == nil:
					// Over QUIC, or over libfabric before the endpoint
					// closed.
					p.checkBytes(t)
				case errors.Is(r.err, context.DeadlineExceeded):
					t.Fatalf("read ended at its deadline: %v", r.err)
				default:
					t.Logf("read over %s ended in an error: %v", r.via, r.err)
				}
			case <-time.After(time.Minute):
				t.Fatal("read still running a minute after the holder's endpoint closed")
			}
			// The next read cannot use the closed endpoint: it goes over
			// QUIC, every byte checked.
			if via := p.read(t); via != TransportQUIC {
				t.Fatalf("read after the holder's endpoint closed went over %s, want quic", via)
			}
		})
	}
}

// A node with both RDMA devices and a libfabric endpoint is refused.
func TestRDMAConfigOFIAndDevices(t *testing.T) {
	c := &RDMAConfig{Devices: nil, OFI: &ofi.Endpoint{}}
	if err := c.populate(); err != nil {
		t.Fatalf("libfabric alone: %v", err)
	}
	c = &RDMAConfig{}
	if err := c.populate(); !errors.Is(err, ErrConfig) {
		t.Fatalf("neither devices nor an endpoint: %v, want ErrConfig", err)
	}
}

// A reader on libibverbs and a holder on libfabric cannot read each other's
// memory: the holder hands no regions to a reader of another binding, and
// the read goes over QUIC, counted as a holder without RDMA.
func TestRDMABindingsDifferGoOverQUIC(t *testing.T) {
	lib, _ := softNIC(t)
	p := newPairWith(t, []nodeOpt{withOFI(t, "tcp", nil)}, []nodeOpt{withRDMADevices(t, lib, []string{"softverbs0"}, nil)}, nil, nil)
	if via := p.read(t); via != TransportQUIC {
		t.Fatalf("verbs reader from a libfabric holder went over %s, want quic", via)
	}
	if m := p.metrics(t); m.Fallbacks[FallbackPeerHasNoRDMA] != 1 || m.Binding != "verbs" {
		t.Errorf("metrics %+v: want binding verbs and one peer-has-no-rdma fallback", m)
	}
}

// The holder's endpoint name in a lease answer: at ofi.MaxNameLen it is
// taken, past it (or none) the answer is malformed.
func TestOFIEndpointNameLimit(t *testing.T) {
	p := newOFIPair(t, "tcp", nil)
	v := p.peer.rdma.tp
	for _, tc := range []struct {
		n  int
		ok bool
	}{{ofi.MaxNameLen, true}, {ofi.MaxNameLen + 1, false}, {0, false}} {
		err := v.answered(&transferpb.LeaseResponse{OfiName: make([]byte, tc.n)})
		if tc.ok != (err == nil) {
			t.Errorf("endpoint name of %d bytes: %v", tc.n, err)
		}
	}
}

// kindAs is a holder's binding that answers readers of another kind, as a
// holder from before LeaseRequest.rma answers every reader with its own.
type kindAs struct {
	rmaTransport
	as string
}

func (k kindAs) kind() string { return k.as }

// A libfabric reader given a holder's verbs regions (no endpoint name)
// reads over QUIC, counted as a holder without RDMA, and the lease holds.
func TestOFIReaderGivenVerbsRegionsGoesOverQUIC(t *testing.T) {
	lib, _ := softNIC(t)
	ep := openOFI(t, "tcp")
	p := newPairWith(t, []nodeOpt{withRDMADevices(t, lib, []string{"softverbs0"}, nil)},
		[]nodeOpt{func(c *Config) { c.RDMA = &RDMAConfig{OFI: ep, Backoff: time.Hour} }}, nil, nil)
	p.holder.rdma.tp = kindAs{p.holder.rdma.tp, p.reader.rdma.tp.kind()}
	if via := p.read(t); via != TransportQUIC {
		t.Fatalf("libfabric reader of verbs regions went over %s, want quic", via)
	}
	if m := p.metrics(t); m.Fallbacks[FallbackPeerHasNoRDMA] != 1 || m.ReadFailures != 0 {
		t.Errorf("metrics %+v: want one peer-has-no-rdma fallback and no failed read", m)
	}
}

// A reader's endpoint that closes itself (a read over shm with a wrong key
// never completes: past the read timeout and the flush grace the endpoint
// is closed to flush it) is reopened: after two failed attempts, each
// Backoff later than the one before at least, a new endpoint opens, the
// reader's memory is registered on it, and reads go over libfabric again,
// every byte checked.
func TestOFIEndpointReopenedAfterFlushClose(t *testing.T) {
	const backoff = 50 * time.Millisecond
	// shm with FI_HMEM, whose holder drops a read with a wrong key (no
	// completion ever comes): host-only, it does not look at keys.
	rep := openOFIWith(t, ofi.Config{Provider: "shm", FlushGrace: 200 * time.Millisecond})
	hep := openOFIWith(t, ofi.Config{Provider: "shm"})
	hopt := func(c *Config) {
		c.RDMA = &RDMAConfig{OFI: hep, Backoff: 200 * time.Millisecond, OFIReadTimeout: 3 * time.Second}
	}
	// The first read is 8,293 requests, which shm with FI_HMEM serves one
	// at a time, each a wake-up of the holder's progress loop: about a
	// second here, more under load.
	const readTimeout = 10 * time.Second
	ropt := func(c *Config) {
		c.RDMA = &RDMAConfig{OFI: rep, Backoff: backoff, MaxBackoff: 4 * backoff, OFIReadTimeout: readTimeout}
	}
	p := newPairWith(t, []nodeOpt{hopt}, []nodeOpt{ropt}, nil, nil)
	// Under a lease that outlasts the read (rdmaPair.read's second does
	// not here): the holder serves while it lasts.
	first := func() Transport {
		ctx, cancel := context.WithTimeout(context.Background(), 2*readTimeout)
		defer cancel()
		l, err := p.peer.Lease(ctx, []uint64{2}, 2*readTimeout)
		if err != nil {
			t.Fatal(err)
		}
		via, err := p.peer.ReadVia(ctx, l.ID, 7, p.segs, p.dst)
		if err != nil {
			t.Fatal(err)
		}
		p.checkBytes(t)
		if _, err := p.peer.Release(ctx, l.ID); err != nil {
			t.Fatal(err)
		}
		return via
	}
	if via := first(); via != TransportRDMA {
		t.Fatalf("first read went over %s, want rdma", via)
	}
	tp := p.reader.rdma.tp.(*ofiTransport)
	var attempts []time.Time
	var mu sync.Mutex
	reopen := tp.open
	tp.open = func(b *ofi.Endpoint) (*ofi.Endpoint, error) {
		mu.Lock()
		attempts = append(attempts, time.Now())
		n := len(attempts)
		mu.Unlock()
		if n <= 2 {
			return nil, errors.New("no endpoint this time")
		}
		return reopen(b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := p.peer.Lease(ctx, []uint64{2}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	p.peer.rdma.mu.Lock()
	for _, rs := range p.peer.rdma.leases[l.ID] {
		for i := range rs {
			rs[i].key ^= 0x5a5a
		}
	}
	p.peer.rdma.mu.Unlock()
	for _, d := range p.dst {
		clear(d)
	}
	if via, err := p.peer.ReadVia(ctx, l.ID, 7, p.segs, p.dst); err != nil || via != TransportQUIC {
		t.Fatalf("read with a wrong key: over %s, %v; want quic", via, err)
	}
	p.checkBytes(t)
	if rep.Broken() == nil {
		t.Fatal("the read with a wrong key did not close the reader's endpoint: nothing is tested")
	}
	wait.For(t, 10*time.Second, "the endpoint is reopened", func() error {
		if m := p.metrics(t); m.EndpointReopens != 1 {
			return fmt.Errorf("%d reopens, %d failed", m.EndpointReopens, m.EndpointReopenFailures)
		}
		return nil
	})
	if m := p.metrics(t); m.EndpointReopenFailures != 2 {
		t.Errorf("%d failed reopens, want 2", m.EndpointReopenFailures)
	}
	mu.Lock()
	for i := 1; i < len(attempts); i++ {
		if gap := attempts[i].Sub(attempts[i-1]); gap < backoff<<(i-1) {
			t.Errorf("attempt %d came %v after the one before, want at least %v", i+1, gap, backoff<<(i-1))
		}
	}
	mu.Unlock()
	if ep, _ := tp.endpoint(); ep == rep || ep.Broken() != nil {
		t.Fatal("the node reads on the endpoint that closed")
	}
	// The peer's backoff after the failed read ends; then libfabric again.
	wait.For(t, 3*readTimeout, "a read goes over libfabric again", func() error {
		if via := first(); via != TransportRDMA {
			return fmt.Errorf("read over %s", via)
		}
		return nil
	})
	if m := p.metrics(t); m.RegisteredBytes == 0 {
		t.Errorf("metrics %+v: the reader's memory is not registered on the new endpoint", m)
	}
}

// RegisterCUDA registers device memory only over libfabric, on a provider
// with FI_HMEM: tcp has none, libibverbs takes device memory by dma-buf or
// device pointer instead, and a negative device is refused; none of them
// leaves a registration.
func TestOFIRegisterCUDARefusals(t *testing.T) {
	lib, _ := softNIC(t)
	p := newPairWith(t, []nodeOpt{withOFI(t, "tcp", nil)}, []nodeOpt{withRDMADevices(t, lib, []string{"softverbs0"}, nil)}, nil, nil)
	buf := make([]byte, 1<<20)
	addr := uint64(uintptr(unsafe.Pointer(&buf[0])))
	for _, tc := range []struct {
		name string
		n    *Node
		dev  int
		want error
	}{
		{"tcp without FI_HMEM", p.holder, 0, ofi.ErrNotSupported},
		{"libibverbs", p.reader, 0, rdma.ErrNotSupported},
		{"a negative device", p.holder, -1, ErrInvalidRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, _ := tc.n.RDMAMetrics()
			if _, err := tc.n.RegisterCUDA(0, tc.dev, addr, uint64(len(buf))); !errors.Is(err, tc.want) {
				t.Errorf("RegisterCUDA: %v, want %v", err, tc.want)
			}
			if after, _ := tc.n.RDMAMetrics(); after.RegisteredBytes != before.RegisteredBytes {
				t.Errorf("registered bytes %d -> %d after a refused registration", before.RegisteredBytes, after.RegisteredBytes)
			}
		})
	}
}

// A holder's endpoint serves (its progress loop polls often, as shm and tcp
// need of the side read from) from the lease answer that names it until
// the lease is released, through a renewal; a lease whose term passes
// unreleased stops being served by itself; a peer that goes ends the
// serving of its leases.
func TestOFIHolderServesWhileLeased(t *testing.T) {
	p := newOFIPair(t, "shm", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tp := p.holder.rdma.tp.(*ofiTransport)
	ep, _ := tp.endpoint()
	if ep.Serving() {
		t.Fatal("the holder serves before any lease")
	}
	l, err := p.peer.Lease(ctx, []uint64{2}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !ep.Serving() {
		t.Fatal("the holder does not serve under a lease answered with its endpoint")
	}
	// A renewal past the holder's cap (1 s here) is served for the cap,
	// not for what the reader asked.
	p.holder.cfg.Handler.(*memHandler).setGrant(func(asked time.Duration) time.Duration { return min(asked, time.Second) })
	renewed := time.Now()
	if d, err := p.peer.Renew(ctx, l.ID, time.Minute); d != time.Second || err != nil {
		t.Fatalf("renew: %v, %v; want the holder's 1s", d, err)
	}
	answered := time.Now()
	tp.mu.Lock()
	until := tp.served[leaseKey{p.reader.cfg.NodeName, l.ID}].until
	tp.mu.Unlock()
	if until.Before(renewed.Add(time.Second)) || until.After(answered.Add(time.Second)) {
		t.Fatalf("the renewed lease is served until %v after the renewal was asked for, want the 1s granted", until.Sub(renewed))
	}
	p.holder.cfg.Handler.(*memHandler).setGrant(nil)
	if via, err := p.peer.ReadVia(ctx, l.ID, 7, p.segs, p.dst); err != nil || via != TransportRDMA {
		t.Fatalf("read: over %s, %v; want rdma", via, err)
	}
	p.checkBytes(t)
	if _, err := p.peer.Release(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	if ep.Serving() {
		t.Fatal("the holder serves with its lease released")
	}
	// A lease of a second that is never released.
	if _, err := p.peer.Lease(ctx, []uint64{2}, time.Second); err != nil {
		t.Fatal(err)
	}
	if !ep.Serving() {
		t.Fatal("the holder does not serve under a short lease")
	}
	wait.For(t, 10*time.Second, "the unreleased lease's term passes", func() error {
		if ep.Serving() {
			return errors.New("still serving")
		}
		return nil
	})
	if _, err := p.peer.Lease(ctx, []uint64{2}, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	tp.dropServed(p.reader.cfg.NodeName)
	if ep.Serving() {
		t.Fatal("the holder serves a lease of a peer that went")
	}
}
