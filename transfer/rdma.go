package transfer

import (
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/kvfabric/kvfabric/rdma"
	"github.com/kvfabric/kvfabric/rdma/ofi"
	"github.com/kvfabric/kvfabric/transfer/transferpb"
)

// RDMAConfig turns on reads over RDMA. With it, a reader asks each lease
// for the holder's remote keys, connects RC queue pairs to the holder over
// the control channel, and moves a read's pieces as RDMA READs straight
// from the holder's registered memory into its own; the holder's CPU does
// nothing. A peer without RDMA, or whose RDMA failed, is read over QUIC.
type RDMAConfig struct {
	// Devices are the opened RDMA devices (NICs) of the node, at most
	// MaxNICs: memory registered with device i (RegisterMemory uses device
	// 0; RegisterDmabuf and RegisterAddr name theirs, the NIC nearest a
	// GPU for its memory) is read into and served through it, on queue
	// pairs between it and the peer's device that holds the other side.
	// The node does not close them. At least one is required.
	Devices []*rdma.Device
	// QP shapes each queue pair; zero fields take the rdma package's
	// defaults (timeout 14 and retry 7: a dead peer errors in about 0.5 s).
	QP rdma.QPOptions
	// QPsPerPeer is how many queue pairs this node reads from one peer on
	// per pair of devices (its own and the peer's), one read on each at a
	// time, at most MaxQPsPerPeer. If zero, 2.
	QPsPerPeer int
	// Backoff is how long a peer whose RDMA failed is read over QUIC
	// before RDMA is tried again; it doubles with each failure in a row up
	// to MaxBackoff. If zero, 1 s.
	Backoff time.Duration
	// MaxBackoff bounds Backoff's doubling. If zero, 1 min.
	MaxBackoff time.Duration
	// MaxConnectsPerMinute bounds the queue pairs this node connects to one
	// peer in any minute, per device of its own, so that a peer whose
	// queue pairs keep failing (or that names many devices) costs a
	// bounded amount of setup. If zero, 8.
	MaxConnectsPerMinute int

	// OFI, if set, is the libfabric endpoint the node reads and serves
	// over instead of libibverbs: Devices must then be empty, memory is
	// registered with it as device 0, and QP, QPsPerPeer and
	// MaxConnectsPerMinute do not apply (its endpoints are
	// connectionless). The node does not close it. If nil, libibverbs.
	OFI *ofi.Endpoint
	// OFIReadTimeout bounds one read over OFI: a provider may never
	// complete a read the holder's side refuses (shm with a wrong key).
	// Past it the read fails and goes over QUIC; the endpoint, which the
	// binding then closes to flush the read, is replaced by a new one on
	// the same provider (opened again after Backoff, doubling up to
	// MaxBackoff, while it fails), and reads go over QUIC until it is.
	// If zero, 10 s.
	OFIReadTimeout time.Duration
}

func (c *RDMAConfig) populate() error {
	if c.OFI != nil && len(c.Devices) > 0 {
		return configErr("RDMA: %d devices and a libfabric endpoint, want one or the other", len(c.Devices))
	}
	if c.OFI == nil && (len(c.Devices) == 0 || len(c.Devices) > MaxNICs) {
		return configErr("RDMA: %d devices, want 1..%d", len(c.Devices), MaxNICs)
	}
	for i, d := range c.Devices {
		if d == nil {
			return configErr("RDMA.Devices[%d] is nil", i)
		}
	}
	if c.QPsPerPeer < 0 || c.Backoff < 0 || c.MaxBackoff < 0 || c.MaxConnectsPerMinute < 0 {
		return configErr("RDMA: negative QPsPerPeer %d, Backoff %v, MaxBackoff %v or MaxConnectsPerMinute %d",
			c.QPsPerPeer, c.Backoff, c.MaxBackoff, c.MaxConnectsPerMinute)
	}
	if c.OFIReadTimeout < 0 {
		return configErr("RDMA: negative OFIReadTimeout %v", c.OFIReadTimeout)
	}
	if c.OFIReadTimeout == 0 {
		c.OFIReadTimeout = 10 * time.Second
	}
	if c.QPsPerPeer == 0 {
		c.QPsPerPeer = 2
	}
	if c.QPsPerPeer > MaxQPsPerPeer {
		return configErr("RDMA: QPsPerPeer %d, at most %d", c.QPsPerPeer, MaxQPsPerPeer)
	}
	if c.Backoff == 0 {
		c.Backoff = time.Second
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = time.Minute
	}
	c.MaxBackoff = max(c.MaxBackoff, c.Backoff)
	if c.MaxConnectsPerMinute == 0 {
		c.MaxConnectsPerMinute = 8
	}
	c.MaxConnectsPerMinute = max(c.MaxConnectsPerMinute, c.QPsPerPeer)
	return nil
}

// Transport names how a read's bytes moved.
type Transport string

// Transports.
const (
	TransportQUIC Transport = "quic"
	TransportRDMA Transport = "rdma"
)

// Reasons a read that could have gone over RDMA went over QUIC, as the
// fallback counters name them.
const (
	FallbackPeerHasNoRDMA  = "peer-has-no-rdma"  // the holder answered without keys or refused to connect
	FallbackNotRegistered  = "not-registered"    // our destination memory is not registered
	FallbackConnectFailed  = "connect-failed"    // a queue pair could not be made or connected
	FallbackReadFailed     = "read-failed"       // an RDMA READ completed with an error
	FallbackBackoff        = "backoff"           // RDMA to the peer failed recently
	FallbackConnectLimited = "connect-limited"   // MaxConnectsPerMinute reached
	FallbackBadKeys        = "bad-remote-region" // the holder's region keys do not fit the plan
)

// FallbackReasons lists every reason, for metrics that show them all.
var FallbackReasons = []string{FallbackPeerHasNoRDMA, FallbackNotRegistered, FallbackConnectFailed, FallbackReadFailed,
	FallbackBackoff, FallbackConnectLimited, FallbackBadKeys}

// minLaneBytes is the least a lane of a read carries: a group of a read
// is cut into lanes (up to QPsPerPeer, each on a queue pair of its own)
// only where each gets at least this much.
const minLaneBytes = 4 << 20

// MaxQPsPerPeer bounds RDMAConfig.QPsPerPeer, and what a reader may say
// it keeps when it connects.
const MaxQPsPerPeer = 16

// MaxNICs bounds the RDMA devices a node reads and serves through, and the
// device index a peer may name.
const MaxNICs = 64

// localMemory is the memory this node registered for RDMA: reads land
// only in it, and leases hand out keys only to it.
type localMemory struct {
	mu  sync.RWMutex
	mrs []registration // sorted by Addr, not overlapping
}

// registration is memory registered with device nic.
type registration struct {
	memRegion
	nic int
}

// findRange returns the registration that holds [start, start+n); ok is
// false when none does.
func (m *localMemory) findRange(start, n uint64) (reg registration, ok bool) {
	end := start + n
	if n == 0 || end < start {
		return registration{}, false
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	i := sort.Search(len(m.mrs), func(i int) bool { return m.mrs[i].Addr()+m.mrs[i].Len() > start })
	if i < len(m.mrs) && m.mrs[i].Addr() <= start && end <= m.mrs[i].Addr()+m.mrs[i].Len() {
		return m.mrs[i], true
	}
	return registration{}, false
}

// rdmaNode is a node's RDMA side: its registered memory, the binding
// that reads and serves (and what it keeps), and the counters.
type rdmaNode struct {
	cfg RDMAConfig
	mem localMemory
	tp  rmaTransport

	mu       sync.Mutex
	fallback map[string]uint64 // reads over QUIC by reason

	// The counters are atomics, off the lock: every read adds to them.
	reads, bytes, ops, sges, connects, connectFails, readFails atomic.Uint64
	readCPU                                                    atomic.Int64    // nanoseconds
	nicBytes                                                   []atomic.Uint64 // bytes read through each device
}

// RegisterMemory registers buf with the node's first RDMA device for remote read,
// so that peers may read leased blocks in it and this node's reads may
// land in it. The agent registers each pool once, at start: registration
// pins and maps every page, which takes seconds for hundreds of GiB on a
// real NIC. buf must stay valid until the node is closed. Without RDMA it
// returns an error wrapping rdma.ErrUnavailable.
func (n *Node) RegisterMemory(buf []byte) (rdma.RegistrationStats, error) {
	return n.registerMemory(0, buf)
}

func (n *Node) registerMemory(nic int, buf []byte) (rdma.RegistrationStats, error) {
	return n.register(nic, uint64(uintptr(unsafe.Pointer(unsafe.SliceData(buf)))), uint64(len(buf)), "host memory",
		func(d *rdma.Device) (*rdma.MemoryRegion, error) { return d.RegisterMemory(buf) })
}

// DeregisterMemory ends the registration RegisterMemory made of exactly
// buf: peers can no longer read it, nor this node's reads land in it. The
// caller makes sure that nothing reads it any more (no lease on it, no
// import into it): a read in flight fails. Without such a registration it
// returns an error wrapping ErrInvalidRequest.
func (n *Node) DeregisterMemory(buf []byte) error {
	if n.rdma == nil {
		return fmt.Errorf("transfer: deregister memory: %w: RDMA is not configured", rdma.ErrUnavailable)
	}
	return n.rdma.mem.remove(uint64(uintptr(unsafe.Pointer(unsafe.SliceData(buf)))), uint64(len(buf)))
}

// remove closes and forgets the registration of exactly [start, start+n).
func (m *localMemory) remove(start, n uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	i := sort.Search(len(m.mrs), func(i int) bool { return m.mrs[i].Addr() >= start })
	if i == len(m.mrs) || m.mrs[i].Addr() != start || m.mrs[i].Len() != n {
		return fmt.Errorf("transfer: deregister memory: %w: no registration of %d bytes at %#x", ErrInvalidRequest, n, start)
	}
	mr := m.mrs[i]
	m.mrs = append(m.mrs[:i], m.mrs[i+1:]...)
	return mr.Close()
}

// overlaps reports whether [start, start+n) shares a byte with a
// registration: findRange's search needs them not to overlap.
func (m *localMemory) overlaps(start, n uint64) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.overlapsLocked(start, n)
}

func (m *localMemory) overlapsLocked(start, n uint64) bool {
	i := sort.Search(len(m.mrs), func(i int) bool { return m.mrs[i].Addr()+m.mrs[i].Len() > start })
	return i < len(m.mrs) && m.mrs[i].Addr() < start+n
}

// add keeps a registration, in address order; one that overlaps another
// is refused (and closed).
func (m *localMemory) add(mr memRegion, nic int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.overlapsLocked(mr.Addr(), mr.Len()) {
		mr.Close()
		return fmt.Errorf("transfer: register memory: %w: %d bytes at %#x overlap a registration", ErrInvalidRequest, mr.Len(), mr.Addr())
	}
	m.mrs = append(m.mrs, registration{mr, nic})
	sort.Slice(m.mrs, func(i, j int) bool { return m.mrs[i].Addr() < m.mrs[j].Addr() })
	return nil
}

// RDMAEnabled says whether the node reads and serves over RDMA.
func (n *Node) RDMAEnabled() bool { return n.rdma != nil }

// closeRDMA releases what the binding serves and deregisters the memory.
func (n *Node) closeRDMA() {
	r := n.rdma
	if r == nil {
		return
	}
	r.tp.close()
	r.mem.mu.Lock()
	for _, mr := range r.mem.mrs {
		mr.Close()
	}
	r.mem.mrs = nil
	r.mem.mu.Unlock()
}

// dropServed releases what the binding serves peer (its connections
// closed or it left).
func (n *Node) dropServed(peer string) {
	if r := n.rdma; r != nil {
		r.tp.dropServed(peer)
	}
}

func (n *Node) countFallback(reason string) {
	r := n.rdma
	r.mu.Lock()
	r.fallback[reason]++
	r.mu.Unlock()
}

// RDMAMetrics counts what moved over RDMA and why reads did not.
type RDMAMetrics struct {
	// Reads and Bytes count reads completed over RDMA; Ops and SGEs the
	// work requests posted for them and their scatter entries.
	Reads, Bytes, Ops, SGEs uint64
	// ReadCPU is the CPU time this node's threads spent posting the READs
	// of Reads and polling for their completions (rdma.QueuePair.ReadCPU;
	// with softverbs, its copies made while polling are in it).
	ReadCPU time.Duration
	// ReadFailures counts RDMA reads that failed (and went over QUIC, but
	// for those whose caller had given up, or whose peer handle was closed
	// meanwhile). A read that fails while its handle is closed counts only
	// where the peer failed (ClosePeerFailed), and not where the read was
	// stopped by the closing (ErrClosed); of a read on several lanes, the
	// lane that failed first decides.
	ReadFailures uint64
	// Connects counts queue pairs connected to peers to read from;
	// ConnectFailures the attempts that failed.
	Connects, ConnectFailures uint64
	// Fallbacks counts reads that went over QUIC although RDMA is on, by
	// reason (the Fallback* constants).
	Fallbacks map[string]uint64
	// QPsServed is the queue pairs peers read from now.
	QPsServed int
	// RegisteredBytes is the memory registered.
	RegisteredBytes uint64
	// Devices is, per RDMA device in RDMAConfig.Devices order, its name,
	// the bytes reads moved into memory registered with it and the memory
	// registered with it.
	Devices []DeviceMetrics

	// Binding is what reads move over: "verbs", or "ofi:" and the
	// libfabric provider (e.g. "ofi:tcp;ofi_rxm"); Devices then holds one
	// entry, the endpoint, named as Binding.
	Binding string

	// EndpointReopens counts libfabric endpoints opened in place of one
	// that closed itself; EndpointReopenFailures the attempts that failed.
	EndpointReopens, EndpointReopenFailures uint64
}

// nics is how many devices memory is registered with: one endpoint for
// libfabric.
func (r *rdmaNode) nics() int { return max(len(r.cfg.Devices), 1) }

func (r *rdmaNode) nicName(i int) string {
	if i < len(r.cfg.Devices) {
		return r.cfg.Devices[i].Info().Name
	}
	return r.binding()
}

// binding names what reads move over.
func (r *rdmaNode) binding() string {
	if k := r.tp.kind(); k != "" {
		return k
	}
	return "verbs"
}

// DeviceMetrics is one RDMA device's share of RDMAMetrics.
type DeviceMetrics struct {
	Name                  string
	ReadBytes, Registered uint64
}

// RDMAMetrics returns a snapshot of the RDMA counters; ok is false when
// RDMA is off.
func (n *Node) RDMAMetrics() (m RDMAMetrics, ok bool) {
	r := n.rdma
	if r == nil {
		return m, false
	}
	m = RDMAMetrics{Reads: r.reads.Load(), Bytes: r.bytes.Load(), Ops: r.ops.Load(), SGEs: r.sges.Load(),
		ReadCPU: time.Duration(r.readCPU.Load()), ReadFailures: r.readFails.Load(),
		Connects: r.connects.Load(), ConnectFailures: r.connectFails.Load()}
	r.mu.Lock()
	m.Fallbacks = make(map[string]uint64, len(r.fallback))
	for k, v := range r.fallback {
		m.Fallbacks[k] = v
	}
	m.Devices = make([]DeviceMetrics, len(r.nicBytes))
	for i := range m.Devices {
		m.Devices[i] = DeviceMetrics{Name: r.nicName(i), ReadBytes: r.nicBytes[i].Load()}
	}
	m.Binding = r.binding()
	r.mu.Unlock()
	m.QPsServed = r.tp.servedConns()
	if t, ok := r.tp.(*ofiTransport); ok {
		m.EndpointReopens, m.EndpointReopenFailures = t.reopens.Load(), t.reopenFails.Load()
	}
	r.mem.mu.RLock()
	for _, mr := range r.mem.mrs {
		m.RegisteredBytes += mr.Len()
		m.Devices[mr.nic].Registered += mr.Len()
	}
	r.mem.mu.RUnlock()
	return m, true
}

// rdmaRegions returns the remote keys of every rank's region of the block
// sets a lease names, for a reader that asked for them. A region outside
// the registered memory is left out: that block set is read over QUIC.
func (n *Node) rdmaRegions(sets map[uint64][]byte) []*transferpb.RdmaRegion {
	var out []*transferpb.RdmaRegion
	for set := range sets {
		for rank := 0; rank < maxRank; rank++ {
			addr, length, err := n.regionSpan(set, rank)
			if err != nil {
				break // past the last rank
			}
			mr, ok := n.rdma.mem.findRange(addr, length)
			if !ok {
				continue
			}
			g := &transferpb.RdmaRegion{BlockSet: set, Rank: uint32(rank), Length: length, Nic: uint32(mr.nic)}
			n.rdma.tp.region(mr, addr, g)
			out = append(out, g)
		}
	}
	return out
}
