// Package rdma is kvfabric's binding to libibverbs: devices and ports, memory
// registration for remote read, and reliable-connected (RC) queue pairs that
// move bytes by RDMA READ from a peer's registered memory into ours.
//
// libibverbs is opened with dlopen at run time (Config.Library, else the
// KVFABRIC_IBVERBS_LIB environment variable, else "libibverbs.so.1"), so
// building needs only Go and gcc, and a machine without the library runs the
// same binary with RDMA off: Open then returns an error wrapping
// ErrUnavailable or ErrNotSupported that says why. A build without cgo has the
// same API; every entry point returns an error wrapping ErrNotSupported.
//
// The structures the binding passes to libibverbs are declared in
// kvf_verbs.h, never taken from <infiniband/verbs.h>; abi_test.go holds every
// size, offset and constant against the real header. The data path
// (post_send, poll_cq) goes through the context's ops table exactly as
// verbs.h's static inline functions do.
//
// A connection is made by exchanging Endpoints over an authenticated channel
// (the transport's QUIC control stream):
//
//	field      bits  meaning
//	QPN        24    the queue pair number
//	PSN        24    the first packet sequence number the peer will send
//	GID        128   RoCE: the chosen GID (RoCE v2 IPv4-mapped preferred)
//	LID        16    InfiniBand: the port's LID
//	MTU        -     active path MTU in bytes (256..4096); the smaller side wins
//	ReadDepth  8     RDMA READs the side serves at once (responder resources)
//
// Only RDMA READ is ever posted and memory is registered for local write and
// remote read only, never remote write.
package rdma

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"
)

// Sentinels; match with errors.Is.
var (
	// ErrNotSupported: this build (no cgo, not Linux) or this libibverbs
	// (a required symbol is missing) cannot do what was asked.
	ErrNotSupported = errors.New("rdma: not supported")
	// ErrUnavailable: RDMA is off on this machine: no library, no device,
	// no active port, no usable GID.
	ErrUnavailable = errors.New("rdma: unavailable")
	// ErrInvalidArgument: a caller's or peer's value is out of range.
	ErrInvalidArgument = errors.New("rdma: invalid argument")
	// ErrCompletion: a work request completed with an error status. The
	// queue pair is then in the error state: Reset and Connect it again.
	ErrCompletion = errors.New("rdma: work completion error")
	// ErrNotConnected: the queue pair is not ready to send (never
	// connected, or in error after a failed read and not yet reset).
	ErrNotConnected = errors.New("rdma: queue pair not connected")
	// ErrClosed: the object was closed.
	ErrClosed = errors.New("rdma: closed")
)

// EnvLibrary names the environment variable that overrides the library path
// when Config.Library is empty.
const EnvLibrary = "KVFABRIC_IBVERBS_LIB"

// DefaultLibrary is the soname opened when neither Config.Library nor
// EnvLibrary names one.
const DefaultLibrary = "libibverbs.so.1"

// Config says which libibverbs to open and where to read sysfs.
type Config struct {
	// Library is the path or soname of libibverbs. If empty, the value of
	// KVFABRIC_IBVERBS_LIB, and if that is empty too, "libibverbs.so.1".
	Library string
	// SysfsRoot is where sysfs is mounted, for PCI addresses, NUMA nodes
	// and GID types. If empty, "/sys".
	SysfsRoot string
	// Logger receives registration timings and state changes. If nil,
	// slog.Default().
	Logger *slog.Logger
}

// populate fills the defaults (the one place that does).
func (c Config) populate() Config {
	if c.Library == "" {
		c.Library = os.Getenv(EnvLibrary)
	}
	if c.Library == "" {
		c.Library = DefaultLibrary
	}
	if c.SysfsRoot == "" {
		c.SysfsRoot = "/sys"
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// LinkLayer is a port's link layer.
type LinkLayer int

// Link layers, as verbs.h numbers them.
const (
	LinkLayerUnspecified LinkLayer = 0
	LinkLayerInfiniBand  LinkLayer = 1
	LinkLayerEthernet    LinkLayer = 2
)

func (l LinkLayer) String() string {
	switch l {
	case LinkLayerInfiniBand:
		return "infiniband"
	case LinkLayerEthernet:
		return "ethernet"
	}
	return "unspecified"
}

// GIDType is how a GID table entry is used on the wire.
type GIDType int

// GID types, as verbs.h numbers them.
const (
	GIDTypeIB      GIDType = 0
	GIDTypeRoCEv1  GIDType = 1
	GIDTypeRoCEv2  GIDType = 2
	GIDTypeUnknown GIDType = -1
)

func (g GIDType) String() string {
	switch g {
	case GIDTypeIB:
		return "IB"
	case GIDTypeRoCEv1:
		return "RoCE v1"
	case GIDTypeRoCEv2:
		return "RoCE v2"
	}
	return "unknown"
}

// GID is one non-zero entry of a port's GID table.
type GID struct {
	Index int
	Raw   [16]byte
	Type  GIDType
}

// IPv4Mapped reports whether the GID is an IPv4-mapped IPv6 address
// (::ffff:a.b.c.d), the form RoCE v2 takes over IPv4.
func (g GID) IPv4Mapped() bool {
	for _, b := range g.Raw[:10] {
		if b != 0 {
			return false
		}
	}
	return g.Raw[10] == 0xff && g.Raw[11] == 0xff
}

// LinkLocal reports whether the GID is an fe80::/10 address.
func (g GID) LinkLocal() bool { return g.Raw[0] == 0xfe && g.Raw[1]&0xc0 == 0x80 }

// String formats the GID as verbs tools do (eight groups of four hex digits).
func (g GID) String() string { return formatGID(g.Raw) }

func formatGID(r [16]byte) string {
	return fmt.Sprintf("%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x",
		r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10], r[11], r[12], r[13], r[14], r[15])
}

// PortInfo describes one port of a device.
type PortInfo struct {
	Number    int
	State     string // "active", "down", "init", "armed", ...
	Active    bool
	LinkLayer LinkLayer
	// MTU is the active MTU in bytes (256..4096), 0 if unknown.
	MTU int
	// Width and Speed are the raw active_width and active_speed codes;
	// Gbps is their product as a link rate, 0 when a code is unknown.
	Width, Speed uint8
	Gbps         float64
	LID          uint16
	GIDs         []GID
}

// DeviceInfo describes one RDMA device.
type DeviceInfo struct {
	Name string
	// GUID is the node GUID as verbs tools print it (xxxx:xxxx:xxxx:xxxx).
	GUID     string
	Firmware string
	Ports    []PortInfo
	// PCIAddress is the device's PCI function (0000:3b:00.0), empty when
	// sysfs does not say.
	PCIAddress string
	// NUMANode is the device's NUMA node, -1 when unknown.
	NUMANode int
	// Limits the queue pairs of this device are clamped to.
	MaxQPWR, MaxSGE, MaxCQE, MaxQPRdAtom, MaxQPInitRdAtom int
	// MaxMRSize is the largest region one registration may cover.
	MaxMRSize uint64
}

// QPOptions shapes a queue pair. Depths above the device's limits are
// clamped to them (DeviceInfo.MaxQPWR, MaxSGE, MaxCQE).
type QPOptions struct {
	// SendDepth is the send queue depth (work requests in flight). If
	// zero, 256.
	SendDepth int
	// MaxSGE is the longest scatter list of one READ. If zero, 16.
	MaxSGE int
	// SignalEvery asks for a completion every this many work requests
	// (and always for the last one posted at a time). If zero, 16.
	SignalEvery int
	// Timeout is the local ACK timeout exponent: 4.096 us * 2^Timeout per
	// try. If zero, 14 (67 ms: with RetryCount 7, a dead peer errors in
	// about 0.5 s).
	Timeout uint8
	// RetryCount is how many times a request is retried after a timeout
	// (at most 7). If zero, 7.
	RetryCount uint8
	// RNRRetry is the receiver-not-ready retry count (7 means infinite in
	// verbs). If zero, 7.
	RNRRetry uint8
	// MinRNRTimer is the RNR NAK timer code the responder advertises. If
	// zero, 12 (0.64 ms).
	MinRNRTimer uint8
	// ReadDepth bounds the RDMA READs in flight per direction (initiator
	// depth and responder resources). If zero, 16; clamped to the
	// device's max_qp_rd_atom and max_qp_init_rd_atom.
	ReadDepth int
}

func (o QPOptions) populate(d DeviceInfo) (QPOptions, error) {
	if o.SendDepth < 0 || o.MaxSGE < 0 || o.SignalEvery < 0 || o.ReadDepth < 0 {
		return o, fmt.Errorf("rdma: queue pair options: negative depth (send %d, sge %d, signal every %d, read depth %d): %w",
			o.SendDepth, o.MaxSGE, o.SignalEvery, o.ReadDepth, ErrInvalidArgument)
	}
	if o.RetryCount > 7 || o.RNRRetry > 7 || o.Timeout > 31 || o.MinRNRTimer > 31 {
		return o, fmt.Errorf("rdma: queue pair options: retry %d (max 7), rnr retry %d (max 7), timeout %d (max 31), min rnr timer %d (max 31): %w",
			o.RetryCount, o.RNRRetry, o.Timeout, o.MinRNRTimer, ErrInvalidArgument)
	}
	if o.SendDepth == 0 {
		o.SendDepth = 256
	}
	if o.MaxSGE == 0 {
		o.MaxSGE = 16
	}
	if o.SignalEvery == 0 {
		o.SignalEvery = 16
	}
	if o.Timeout == 0 {
		o.Timeout = 14
	}
	if o.RetryCount == 0 {
		o.RetryCount = 7
	}
	if o.RNRRetry == 0 {
		o.RNRRetry = 7
	}
	if o.MinRNRTimer == 0 {
		o.MinRNRTimer = 12
	}
	if o.ReadDepth == 0 {
		o.ReadDepth = 16
	}
	o.SendDepth = clamp(o.SendDepth, d.MaxQPWR)
	// The CQ holds at most one entry per send work request.
	o.SendDepth = clamp(o.SendDepth, d.MaxCQE)
	o.MaxSGE = clamp(o.MaxSGE, d.MaxSGE)
	o.ReadDepth = clamp(clamp(o.ReadDepth, d.MaxQPRdAtom), d.MaxQPInitRdAtom)
	o.ReadDepth = clamp(o.ReadDepth, 255)
	if o.SignalEvery > o.SendDepth {
		o.SignalEvery = o.SendDepth
	}
	if o.SendDepth < 1 || o.MaxSGE < 1 || o.ReadDepth < 1 {
		return o, fmt.Errorf("rdma: device %s allows no queue pair (max_qp_wr %d, max_sge %d, max_cqe %d, max_qp_rd_atom %d): %w",
			d.Name, d.MaxQPWR, d.MaxSGE, d.MaxCQE, d.MaxQPRdAtom, ErrUnavailable)
	}
	return o, nil
}

// clamp returns v, or limit when the limit is known (> 0) and v exceeds it.
func clamp(v, limit int) int {
	if limit > 0 && v > limit {
		return limit
	}
	return v
}

// Endpoint is what one side of a queue pair tells the other to connect.
// It travels over the authenticated control channel; Validate it on arrival.
type Endpoint struct {
	QPN uint32
	PSN uint32
	GID [16]byte
	// GIDIndex is local only (which GID of ours the QP sends from); a peer's
	// value is ignored.
	GIDIndex int
	LID      uint16
	// MTU in bytes: 256, 512, 1024, 2048 or 4096.
	MTU       int
	LinkLayer LinkLayer
	// ReadDepth is how many RDMA READs this side serves at once.
	ReadDepth int
}

// Validate checks a peer's endpoint before it reaches the driver.
func (e Endpoint) Validate() error {
	if e.QPN == 0 || e.QPN >= 1<<24 {
		return fmt.Errorf("rdma: endpoint: qpn %d outside 1..2^24-1: %w", e.QPN, ErrInvalidArgument)
	}
	if e.PSN >= 1<<24 {
		return fmt.Errorf("rdma: endpoint: psn %d outside 0..2^24-1: %w", e.PSN, ErrInvalidArgument)
	}
	if mtuEnum(e.MTU) == 0 {
		return fmt.Errorf("rdma: endpoint: mtu %d is not 256, 512, 1024, 2048 or 4096: %w", e.MTU, ErrInvalidArgument)
	}
	if e.ReadDepth < 1 || e.ReadDepth > 255 {
		return fmt.Errorf("rdma: endpoint: read depth %d outside 1..255: %w", e.ReadDepth, ErrInvalidArgument)
	}
	switch e.LinkLayer {
	case LinkLayerEthernet:
		if e.GID == ([16]byte{}) {
			return fmt.Errorf("rdma: endpoint: ethernet peer without a GID: %w", ErrInvalidArgument)
		}
	case LinkLayerInfiniBand:
		if e.LID == 0 || e.LID >= 0xc000 {
			return fmt.Errorf("rdma: endpoint: infiniband peer with lid %#x, not a unicast lid: %w", e.LID, ErrInvalidArgument)
		}
	default:
		return fmt.Errorf("rdma: endpoint: link layer %d: %w", e.LinkLayer, ErrInvalidArgument)
	}
	return nil
}

// mtuEnum turns an MTU in bytes into verbs' enum ibv_mtu, 0 if invalid.
func mtuEnum(b int) int {
	switch b {
	case 256:
		return 1
	case 512:
		return 2
	case 1024:
		return 3
	case 2048:
		return 4
	case 4096:
		return 5
	}
	return 0
}

// mtuBytes is mtuEnum's inverse, 0 if unknown.
func mtuBytes(e int) int {
	if e < 1 || e > 5 {
		return 0
	}
	return 128 << e
}

// SGE is one piece of a scatter list: local registered memory.
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// ReadOp is one RDMA READ: the remote range [RemoteAddr, RemoteAddr+sum of
// Local lengths) under RKey lands in Local, in order.
type ReadOp struct {
	Local      []SGE
	RemoteAddr uint64
	RKey       uint32
}

// CompletionError is a work completion with an error status.
type CompletionError struct {
	// Op is the index, in the Read call's ops, of the failed request (the
	// first failed one; later ones are flushed).
	Op int
	// Status is the ibv_wc_status value, StatusText its ibv_wc_status_str.
	Status     int
	StatusText string
	VendorErr  uint32
}

func (e *CompletionError) Error() string {
	return fmt.Sprintf("rdma: read op %d completed with %s (status %d, vendor error %#x)", e.Op, e.StatusText, e.Status, e.VendorErr)
}

// Is makes errors.Is(err, ErrCompletion) true.
func (e *CompletionError) Is(target error) bool { return target == ErrCompletion }

// RegistrationStats is what a registration cost.
type RegistrationStats struct {
	Bytes    uint64
	Duration time.Duration
}

// portStateName names enum ibv_port_state.
func portStateName(s int) string {
	switch s {
	case 0:
		return "nop"
	case 1:
		return "down"
	case 2:
		return "init"
	case 3:
		return "armed"
	case 4:
		return "active"
	case 5:
		return "active-defer"
	}
	return fmt.Sprintf("state-%d", s)
}

// linkGbps turns active_width and active_speed codes into a link rate.
func linkGbps(width, speed uint8) float64 {
	lanes := map[uint8]float64{1: 1, 2: 4, 4: 8, 8: 12, 16: 2}[width]
	// Data rates per lane: SDR, DDR, QDR, FDR10, FDR, EDR, HDR, NDR.
	perLane := map[uint8]float64{1: 2.5, 2: 5, 4: 10, 8: 10, 16: 14, 32: 25, 64: 50, 128: 100}[speed]
	return lanes * perLane
}
