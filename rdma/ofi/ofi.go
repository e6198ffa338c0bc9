package ofi

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"slices"
	"strings"
	"time"
)

// Sentinels; match with errors.Is.
var (
	// ErrNotSupported: this build (no cgo, not Linux), this libfabric (too
	// old, a required symbol missing) or this provider (raw keys) cannot do
	// what was asked.
	ErrNotSupported = errors.New("ofi: not supported")
	// ErrUnavailable: libfabric is missing, or offers no provider with RMA
	// reads on reliable datagram endpoints, or not the one asked for.
	ErrUnavailable = errors.New("ofi: unavailable")
	// ErrInvalidArgument: a caller's or peer's value is out of range.
	ErrInvalidArgument = errors.New("ofi: invalid argument")
	// ErrCompletion: a read completed with an error (a wrong key, memory
	// outside the peer's region, the peer gone).
	ErrCompletion = errors.New("ofi: completion error")
	// ErrClosed: the endpoint was closed, by Close or after a read that
	// could not be flushed in time.
	ErrClosed = errors.New("ofi: closed")
	// ErrUnreachable: the provider took none of a read's requests for
	// Config.ConnectTimeout (tcp;ofi_rxm takes none while it connects to
	// the peer, and keeps trying one that is gone).
	ErrUnreachable = errors.New("ofi: peer unreachable")
)

// EnvLibrary names the environment variable that overrides the library path
// when Config.Library is empty.
const EnvLibrary = "KVFABRIC_LIBFABRIC_LIB"

// DefaultLibrary is the soname opened when neither Config.Library nor
// EnvLibrary names one.
const DefaultLibrary = "libfabric.so.1"

// APIVersion is the libfabric API version the binding asks for (1.17: the
// oldest whose structures kvf_fabric.h declares).
const APIVersion = 1<<16 | 17

// Limits of the binding. Each is enforced where the value arrives.
const (
	// MaxNameLen bounds an endpoint name a peer hands over.
	MaxNameLen = 256
	// MaxSegments bounds the segments of one Read.
	MaxSegments = 1 << 20
	// MaxInFlight bounds the requests one endpoint keeps posted at once,
	// whatever the provider's transmit queue allows.
	MaxInFlight = 256
	// DefaultFlushGrace is how long a read whose context ended waits for
	// its requests before the endpoint is closed to flush them.
	DefaultFlushGrace = 5 * time.Second
	// DefaultConnectTimeout is how long a read waits for the provider to
	// take one of its requests.
	DefaultConnectTimeout = 2 * time.Second
)

// Config says which libfabric to open and which provider to use.
type Config struct {
	// Library is the path or soname of libfabric. If empty, the value of
	// KVFABRIC_LIBFABRIC_LIB, and if that is empty too, "libfabric.so.1".
	Library string
	// Provider names the provider ("cxi", "efa", "verbs", "tcp", "shm").
	// If empty, Choose picks among cxi, efa and verbs; tcp and shm are used
	// only when named.
	Provider string
	// Node is the address the endpoint binds to, for providers that take
	// one (tcp: "127.0.0.1"). If empty, the provider's default.
	Node string
	// FlushGrace is how long a read whose context ended waits for its
	// requests before the endpoint is closed. If zero, DefaultFlushGrace.
	FlushGrace time.Duration
	// ConnectTimeout is how long a read waits with none of its requests
	// taken by the provider (each refused as its queue is full, while
	// nothing of the read is in flight) before it fails with
	// ErrUnreachable. If zero, DefaultConnectTimeout.
	ConnectTimeout time.Duration
	// Logger receives the chosen provider and failures. If nil,
	// slog.Default().
	Logger *slog.Logger

	// HostOnly opens the provider without FI_HMEM: the endpoint registers
	// host memory only (RegisterCUDA refuses, DevicePlan says staged). shm
	// then reads by cross-memory attach (process_vm_readv, where the
	// kernel lets the reader into the holder's process: same user, holder
	// dumpable), which it turns off with FI_HMEM, rather than through
	// buffers the holder's progress fills, one read at a time per peer. If
	// false, a provider that offers FI_HMEM is opened with it.
	HostOnly bool
}

// populate fills the defaults (the one place that does).
func (c Config) populate() Config {
	if c.Library == "" {
		c.Library = os.Getenv(EnvLibrary)
	}
	if c.Library == "" {
		c.Library = DefaultLibrary
	}
	if c.FlushGrace <= 0 {
		c.FlushGrace = DefaultFlushGrace
	}
	if c.ConnectTimeout <= 0 {
		c.ConnectTimeout = DefaultConnectTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// MRMode is a provider's memory registration mode (fi_domain_attr.mr_mode).
type MRMode uint32

// The mode bits the binding knows (fabric.h's FI_MR_*).
const (
	MRLocal     MRMode = 1 << 2
	MRRaw       MRMode = 1 << 3
	MRVirtAddr  MRMode = 1 << 4
	MRAllocated MRMode = 1 << 5
	MRProvKey   MRMode = 1 << 6
	MRMMUNotify MRMode = 1 << 7
	MRRMAEvent  MRMode = 1 << 8
	MREndpoint  MRMode = 1 << 9
	MRHMEM      MRMode = 1 << 10
	// The two modes of libfabric 1.0, still returned by old providers.
	mrBasic    MRMode = 1
	mrScalable MRMode = 2
)

// SupportedMRModes are the bits the binding can honour; it asks for them in
// its hints, and a provider answers with the subset it requires.
const SupportedMRModes = MRLocal | MRVirtAddr | MRAllocated | MRProvKey | MREndpoint | MRHMEM

var mrModeNames = []struct {
	bit  MRMode
	name string
}{
	{mrBasic, "basic"}, {mrScalable, "scalable"}, {MRLocal, "local"}, {MRRaw, "raw"}, {MRVirtAddr, "virt_addr"},
	{MRAllocated, "allocated"}, {MRProvKey, "prov_key"}, {MRMMUNotify, "mmu_notify"}, {MRRMAEvent, "rma_event"},
	{MREndpoint, "endpoint"}, {MRHMEM, "hmem"},
}

func (m MRMode) String() string {
	var names []string
	rest := m
	for _, n := range mrModeNames {
		if m&n.bit != 0 {
			names = append(names, n.name)
			rest &^= n.bit
		}
	}
	if rest != 0 {
		names = append(names, fmt.Sprintf("%#x", uint32(rest)))
	}
	if len(names) == 0 {
		return "unspec"
	}
	return strings.Join(names, "|")
}

// RegPlan is how memory is registered and addressed under one MRMode.
type RegPlan struct {
	// LocalDesc: reads pass the local buffer's registration descriptor, so
	// read destinations must be registered too.
	LocalDesc bool
	// VirtAddr: a peer addresses a region by its virtual address; else by
	// the offset from the region's start.
	VirtAddr bool
	// ProvKey: the provider chooses keys; else the binding requests unique
	// ones.
	ProvKey bool
	// BindEndpoint: a region is bound to the endpoint and enabled before
	// use.
	BindEndpoint bool
	// HMEM: device memory is registered with its interface.
	HMEM bool
}

// PassDesc says whether a read into a region passes its registration
// descriptor (host: the region is host memory): always under FI_MR_LOCAL,
// and for device memory under FI_MR_HMEM, where a provider told nothing
// takes the buffer for host memory (shm copies into it with memcpy).
func (p RegPlan) PassDesc(host bool) bool {
	return p.LocalDesc || p.HMEM && !host
}

// Plan says how to register memory under m, or why the binding cannot.
func (m MRMode) Plan() (RegPlan, error) {
	switch {
	case m&MRRaw != 0:
		return RegPlan{}, fmt.Errorf("ofi: mr_mode %v: raw keys wider than 64 bits: %w", m, ErrNotSupported)
	case m&mrBasic != 0:
		// FI_MR_BASIC is the old name of local|virt_addr|allocated|prov_key.
		m |= MRLocal | MRVirtAddr | MRAllocated | MRProvKey
	}
	return RegPlan{
		LocalDesc:    m&MRLocal != 0,
		VirtAddr:     m&MRVirtAddr != 0,
		ProvKey:      m&MRProvKey != 0,
		BindEndpoint: m&MREndpoint != 0,
		HMEM:         m&MRHMEM != 0,
	}, nil
}

// ProviderInfo describes one provider libfabric offers for RMA on RDM
// endpoints.
type ProviderInfo struct {
	Provider string // e.g. "tcp;ofi_rxm", "shm", "efa", "cxi"
	Fabric   string
	Domain   string
	MRMode   MRMode
	// MRKeySize is the size of a key in bytes; above 8 the binding cannot
	// carry it.
	MRKeySize int
	// HMEM: the provider registers device memory (FI_HMEM).
	HMEM bool
	// MaxMsgSize is the largest single transfer.
	MaxMsgSize uint64
	// IOVLimit and RMAIOVLimit bound a read's local and remote scatter
	// lists.
	IOVLimit, RMAIOVLimit int
	// TxSize is the transmit queue depth.
	TxSize int
	// ThreadSafe: the provider serialises calls itself (FI_THREAD_SAFE).
	// The binding asks fi_getinfo for nothing else, and Choose skips a
	// provider without it.
	ThreadSafe bool
}

// Base is the provider's name without its utility layers ("tcp" for
// "tcp;ofi_rxm").
func (p ProviderInfo) Base() string {
	base, _, _ := strings.Cut(p.Provider, ";")
	return base
}

// autoOrder is the order Choose prefers when no provider is named: fabrics
// with hardware RMA first. tcp and shm are never chosen unless named.
var autoOrder = []string{"cxi", "efa", "verbs"}

// Choose picks the provider to use from those offered: the one named by want
// (its base name or its full name), or else the first of cxi, efa and verbs.
// A provider that is not FI_THREAD_SAFE, whose keys are wider than 8 bytes
// or whose mr_mode the binding cannot honour is skipped, and named in the
// error if nothing is left.
func Choose(offered []ProviderInfo, want string) (ProviderInfo, error) {
	var skipped []string
	usable := func(p ProviderInfo) bool {
		if !p.ThreadSafe {
			// Reads, registrations and the progress loop call the
			// provider from several goroutines with no lock of ours.
			skipped = append(skipped, fmt.Sprintf("%s (not FI_THREAD_SAFE)", p.Provider))
			return false
		}
		if p.MRKeySize > 8 {
			skipped = append(skipped, fmt.Sprintf("%s (keys of %d bytes)", p.Provider, p.MRKeySize))
			return false
		}
		if _, err := p.MRMode.Plan(); err != nil {
			skipped = append(skipped, fmt.Sprintf("%s (mr_mode %v)", p.Provider, p.MRMode))
			return false
		}
		return true
	}
	order := autoOrder
	if want != "" {
		order = []string{want}
	}
	for _, name := range order {
		for _, p := range offered {
			if (p.Base() == name || p.Provider == name) && usable(p) {
				return p, nil
			}
		}
	}
	names := make([]string, 0, len(offered))
	for _, p := range offered {
		if !slices.Contains(names, p.Provider) {
			names = append(names, p.Provider)
		}
	}
	what := "cxi, efa or verbs"
	if want != "" {
		what = want
	}
	msg := fmt.Sprintf("ofi: no usable provider %s with RMA on reliable datagram endpoints (offered: %s)",
		what, strings.Join(names, ", "))
	if len(skipped) > 0 {
		msg += "; skipped: " + strings.Join(skipped, ", ")
	}
	return ProviderInfo{}, fmt.Errorf("%s: %w", msg, ErrUnavailable)
}

// Remote is a region of a peer's memory as the peer describes it: where it
// starts in the peer's address space for RMA (its virtual address, or 0
// without FI_MR_VIRT_ADDR), how long it is, and its key.
type Remote struct {
	Addr, Len, Key uint64
}

// Segment is one copy of a read: Len bytes at offset RemoteOff of Remote
// into offset LocalOff of the local region.
type Segment struct {
	LocalOff  uint64
	RemoteOff uint64
	Len       uint64
	Remote    Remote
}

// checkSegments validates a read's segments against the local region's
// length and each remote region's length, before anything is posted.
func checkSegments(segs []Segment, localLen uint64) error {
	if len(segs) > MaxSegments {
		return fmt.Errorf("ofi: read of %d segments: at most %d: %w", len(segs), MaxSegments, ErrInvalidArgument)
	}
	for i, s := range segs {
		if s.Len == 0 {
			return fmt.Errorf("ofi: segment %d is empty: %w", i, ErrInvalidArgument)
		}
		if s.LocalOff > localLen || s.Len > localLen-s.LocalOff {
			return fmt.Errorf("ofi: segment %d writes [%d, +%d) past the local region's %d bytes: %w",
				i, s.LocalOff, s.Len, localLen, ErrInvalidArgument)
		}
		if s.RemoteOff > s.Remote.Len || s.Len > s.Remote.Len-s.RemoteOff {
			return fmt.Errorf("ofi: segment %d reads [%d, +%d) past the peer's region of %d bytes: %w",
				i, s.RemoteOff, s.Len, s.Remote.Len, ErrInvalidArgument)
		}
		if s.Remote.Addr+s.RemoteOff < s.Remote.Addr {
			return fmt.Errorf("ofi: segment %d: the peer's address %#x + %d wraps: %w",
				i, s.Remote.Addr, s.RemoteOff, ErrInvalidArgument)
		}
	}
	return nil
}

// request is one posted read: a remote-contiguous run of at most maxMsg
// bytes, gathered from up to iovLimit local pieces, or, staged, read whole
// into a staging slot and copied to its local pieces from there.
type request struct {
	remoteAddr, key uint64
	local           []piece
	staged          bool
}

type piece struct{ off, len uint64 }

func (r *request) bytes() uint64 {
	var n uint64
	for _, p := range r.local {
		n += p.len
	}
	return n
}

// gather turns validated segments into requests: each is split at maxMsg
// bytes, and consecutive segments that continue each other in the peer's
// memory (same key, adjacent addresses) are gathered into one request with a
// local scatter list of up to iovLimit pieces.
func gather(segs []Segment, maxMsg uint64, iovLimit int) []request {
	if maxMsg == 0 {
		maxMsg = 1 << 30
	}
	if iovLimit < 1 {
		iovLimit = 1
	}
	var out []request
	var size uint64 // the last request's bytes
	for _, s := range segs {
		addr := s.Remote.Addr + s.RemoteOff
		off, n := s.LocalOff, s.Len
		for n > 0 {
			k := n
			if last := len(out) - 1; last >= 0 {
				r := &out[last]
				p := &r.local[len(r.local)-1]
				adjacent := p.off+p.len == off
				if r.key == s.Remote.Key && r.remoteAddr+size == addr && size < maxMsg &&
					(adjacent || len(r.local) < iovLimit) {
					k = min(k, maxMsg-size)
					if adjacent {
						p.len += k
					} else {
						r.local = append(r.local, piece{off, k})
					}
					addr, off, n, size = addr+k, off+k, n-k, size+k
					continue
				}
			}
			k = min(k, maxMsg)
			out = append(out, request{remoteAddr: addr, key: s.Remote.Key, local: []piece{{off, k}}})
			addr, off, n, size = addr+k, off+k, n-k, k
		}
	}
	return out
}

// gatherStaged is gather for an endpoint that stages reads: a
// remote-contiguous run whose local pieces are more than iovLimit and
// small (iovLimit of them, on average, less than a slot) is read in chunks
// of up to slot bytes, each one request into a staging slot (staged, its
// pieces copied out on completion), instead of one request per iovLimit
// pieces. Other runs, and a chunk of iovLimit pieces or fewer, are read in
// place as gather reads them. The bytes and where each lands are gather's.
func gatherStaged(segs []Segment, maxMsg uint64, iovLimit int, slot uint64) []request {
	if iovLimit < 1 {
		iovLimit = 1
	}
	slot = min(slot, max(maxMsg, 1))
	var out []request
	for _, run := range gather(segs, maxMsg, math.MaxInt) {
		if len(run.local) <= iovLimit {
			out = append(out, run)
			continue
		}
		if run.bytes()/uint64(len(run.local)) >= slot/uint64(iovLimit) {
			// Pieces large enough that iovLimit of them fill a slot.
			remote := Remote{Addr: run.remoteAddr, Len: run.bytes(), Key: run.key}
			parts := make([]Segment, 0, len(run.local))
			var off uint64
			for _, p := range run.local {
				parts = append(parts, Segment{LocalOff: p.off, RemoteOff: off, Len: p.len, Remote: remote})
				off += p.len
			}
			out = append(out, gather(parts, maxMsg, iovLimit)...)
			continue
		}
		cur := request{remoteAddr: run.remoteAddr, key: run.key}
		var n uint64
		emit := func() {
			cur.staged = len(cur.local) > iovLimit
			out = append(out, cur)
			cur = request{remoteAddr: cur.remoteAddr + n, key: run.key}
			n = 0
		}
		for _, p := range run.local {
			for p.len > 0 {
				k := min(p.len, slot-n)
				cur.local = append(cur.local, piece{p.off, k})
				p.off, p.len, n = p.off+k, p.len-k, n+k
				if n == slot {
					emit()
				}
			}
		}
		if n > 0 {
			emit()
		}
	}
	return out
}

// StagesReads says whether the endpoint reads remote runs that land in
// many small local pieces whole into a staging buffer, copying the pieces
// out, instead of posting a request per IOVLimit pieces: for tcp, whose
// every request costs system calls on both ends while its bytes pass
// through the CPU anyway. Hardware providers (efa, cxi, verbs) read
// scatter lists on the NIC; shm's copies are one system call a request.
func (p ProviderInfo) StagesReads() bool { return p.Base() == "tcp" }

// DeviceReg is how a provider takes GPU memory.
type DeviceReg int

const (
	// DeviceStaged: the provider does not register GPU memory; its bytes
	// pass through host memory.
	DeviceStaged DeviceReg = iota
	// DeviceHMEM: GPU memory is registered by device pointer with
	// fi_mr_regattr, interface FI_HMEM_CUDA (Endpoint.RegisterCUDA), and
	// read into and served from directly.
	DeviceHMEM
)

func (d DeviceReg) String() string {
	if d == DeviceHMEM {
		return "hmem"
	}
	return "staged"
}

// DevicePlan says how the provider takes CUDA memory, and why: by device
// pointer where it offers FI_HMEM (whatever its mr_mode: FI_MR_HMEM only
// asks that device buffers be registered, which they are), else staged
// through host memory.
func (p ProviderInfo) DevicePlan() (DeviceReg, string) {
	if p.HMEM {
		return DeviceHMEM, fmt.Sprintf("%s registers device memory (FI_HMEM)", p.Provider)
	}
	return DeviceStaged, fmt.Sprintf("%s does not register device memory (no FI_HMEM)", p.Provider)
}

// ReadResult says how a read's requests completed.
type ReadResult struct {
	// Requests is how many requests the read posted.
	Requests int
	// Pending: some request was still in flight after the call that
	// posted it, so the read waited for the provider's progress (and over
	// shm without cross-memory attach, or tcp, for the peer's).
	Pending bool
	// Inline: the read posted two requests or more, and none was still in
	// flight once the call that posted it had polled the completion queue
	// (nearly always that call's own poll, under the lock that posted the
	// batch; rarely another poll of the endpoint's, taken in the moment
	// after): the provider moved the bytes within the call (shm by
	// cross-memory attach), and the read waited for no progress of the
	// peer's. A read of one request is never counted: a peer that polls
	// hot might serve it between the post and the poll.
	Inline bool
}
