package transfer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/rdma"
	"github.com/kvfabric/kvfabric/rdma/ofi"
	"github.com/kvfabric/kvfabric/transfer/transferpb"
)

// method numbers the calls on the wire (see the package documentation).
type method uint8

const (
	methodHello method = iota + 1
	methodLayouts
	methodLease
	methodRenew
	methodRelease
	methodEventRange
	methodRead
	methodRdmaConnect
	methodLaneToken
	methodIndex
	methodMax = methodIndex
)

var methodNames = [...]string{"", "hello", "layouts", "lease", "renew", "release", "event-range", "read", "rdma-connect", "lane-token", "index"}

func (m method) String() string {
	if m >= 1 && m <= methodMax {
		return methodNames[m]
	}
	return fmt.Sprintf("method(%d)", uint8(m))
}

const (
	statusOK    = 0
	statusError = 1
	headerLen   = 5
)

// Caps on what one request may ask for, beyond the byte cap of a frame.
const (
	maxDigests       = 4096
	maxDigestLen     = 64
	maxLeaseDuration = 10 * time.Minute
	maxOriginLen     = 253
	maxRank          = 1 << 12
)

// MaxReadBytes is the most data bytes one read request, on a QUIC stream
// or a lane connection, may ask for; a holder refuses more (ErrTooLarge)
// before it checks a segment, and a reader splits larger reads into
// requests under it. It bounds the holder's work for one request: a
// read's check against the lease walks every contiguous piece of it.
const MaxReadBytes = 64 << 20

// MaxEventRange is the most events one event-range request may ask for;
// a longer gap is asked for in several requests. A request past it is
// refused with ErrTooLarge.
const MaxEventRange = 1 << 16

// EventOverhead is what one Event of an answer costs on the wire beyond
// its payload: the repeated field's tag and length, the seq's tag and
// varint, the payload's tag and length.
const EventOverhead = 1 + binary.MaxVarintLen32 + 1 + binary.MaxVarintLen64 + 1 + binary.MaxVarintLen32

// eventRangeFields bounds an EventRangeResponse's fields other than its
// events: two bools and two varints with their tags.
const eventRangeFields = 2*2 + 2*(1+binary.MaxVarintLen64)

// eventRangeBudget is EventQuery.MaxBytes for frames capped at limit.
func eventRangeBudget(limit uint32) int {
	return int(limit) - eventRangeFields
}

// ErrFrame is matched by errors about a frame that cannot be read; it
// also matches ErrInvalidRequest.
var ErrFrame = fmt.Errorf("%w: malformed frame", ErrInvalidRequest)

// writeFrame writes one frame in a single Write, so that a small call
// fits one packet.
func writeFrame(w io.Writer, kind byte, m proto.Message, limit uint32) error {
	payload, err := proto.MarshalOptions{}.MarshalAppend(make([]byte, headerLen, headerLen+proto.Size(m)), m)
	if err != nil {
		return fmt.Errorf("transfer: marshal %T: %w", m, err)
	}
	n := len(payload) - headerLen
	if uint64(n) > uint64(limit) {
		return fmt.Errorf("%w: %T is %d bytes, over the %d-byte cap", ErrTooLarge, m, n, limit)
	}
	payload[0] = kind
	binary.BigEndian.PutUint32(payload[1:headerLen], uint32(n))
	_, err = w.Write(payload)
	return err
}

// firstChunk is the payload buffer a frame starts with, whatever length
// its header announces. The buffer doubles as bytes arrive, so what a peer
// makes us allocate follows what it sent (at most twice that, plus this),
// never what it announced: a 5-byte header announcing 4 MiB costs 64 KiB.
const firstChunk = 64 << 10

// readFrame reads one frame, refusing a payload over limit before reading
// it. The payload buffer grows with the bytes that arrive (see firstChunk).
func readFrame(r io.Reader, limit uint32) (kind byte, payload []byte, err error) {
	kind, payload, _, err = readFrameCharged(r, limit, nil)
	return kind, payload, err
}

// readFrameCharged is readFrame that, once the header has announced a
// length within limit and before any of the payload is read, calls charge
// once with that length, and returns the bytes charged: the announced
// length if charge succeeded, else 0. The caller gives them back when it
// is done with the payload, also on error. A charge error ends the read.
// The charge is bookkeeping only: the buffer still grows with the bytes
// that arrive (see firstChunk).
func readFrameCharged(r io.Reader, limit uint32, charge func(n int) error) (kind byte, payload []byte, charged int, err error) {
	var h [headerLen]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			return 0, nil, 0, fmt.Errorf("%w: missing or truncated header", ErrFrame)
		}
		return 0, nil, 0, err
	}
	n := int(binary.BigEndian.Uint32(h[1:]))
	if uint64(n) > uint64(limit) {
		return 0, nil, 0, fmt.Errorf("%w: frame of %d bytes, over the %d-byte cap", ErrTooLarge, n, limit)
	}
	if charge != nil {
		if err := charge(n); err != nil {
			return 0, nil, 0, err
		}
		charged = n
	}
	var buf []byte
	for len(buf) < n {
		if len(buf) == cap(buf) {
			grown := min(n, max(firstChunk, 2*cap(buf)))
			nb := make([]byte, len(buf), grown)
			copy(nb, buf)
			buf = nb
		}
		k, err := io.ReadFull(r, buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+k]
		if err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
				return 0, nil, charged, fmt.Errorf("%w: truncated payload (%d of %d bytes announced)", ErrFrame, len(buf), n)
			}
			return 0, nil, charged, err
		}
	}
	if buf == nil {
		buf = []byte{}
	}
	return h[0], buf, charged, nil
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidRequest, fmt.Sprintf(format, args...))
}

func unmarshal(payload []byte, m proto.Message) error {
	if err := proto.Unmarshal(payload, m); err != nil {
		return invalid("decode %T: %v", m, err)
	}
	return nil
}

// request is a decoded and validated request: exactly one field is set.
type request struct {
	method     method
	hello      HelloInfo
	digests    [][]byte
	hashes     []uint64
	duration   time.Duration
	leaseID    uint64
	events     EventQuery
	blockSet   uint64
	segments   []layout.Segment
	totalBytes uint64
	rdma       bool          // a lease's reader wants RDMA keys
	rma        string        // and the binding it reads with
	endpoint   rdma.Endpoint // an RDMA connect's queue pair
	nic        int           // and the device to make ours on
	readerNIC  int           // and the device the reader's is on
	queuePairs int           // and how many it reads on per pair
	mismatched []uint64      // a release's blocks that failed their checksums
	laneTokens int           // lane tokens asked for
	index      []byte        // an index call's payload

	// inlineAt: a lease's or renewal's reader says its reads over
	// libfabric from the holder's endpoint of this name complete without
	// the holder's progress (LeaseRequest.reads_inline_at).
	inlineAt []byte
}

// maxInlineAt is the longest endpoint name a claim of inline reads names:
// the longest a libfabric endpoint name may be.
const maxInlineAt = ofi.MaxNameLen

// inlineAt validates the endpoint name a claim of inline reads carries.
func inlineAt(method string, name []byte) ([]byte, error) {
	if len(name) > maxInlineAt {
		return nil, invalid("%s: reads_inline_at of %d bytes, at most %d", method, len(name), maxInlineAt)
	}
	return name, nil
}

func durationMS(ms uint64) (time.Duration, error) {
	if ms == 0 || ms > uint64(maxLeaseDuration/time.Millisecond) {
		return 0, invalid("duration %d ms not in [1, %d]", ms, maxLeaseDuration/time.Millisecond)
	}
	return time.Duration(ms) * time.Millisecond, nil
}

func validStrings(field string, ss []string, maxN, maxLen int) error {
	if len(ss) > maxN {
		return invalid("%s: %d entries, over %d", field, len(ss), maxN)
	}
	for i, s := range ss {
		if len(s) > maxLen {
			return invalid("%s[%d]: %d bytes, over %d", field, i, len(s), maxLen)
		}
	}
	return nil
}

// decodeRequest decodes and validates one request payload. Nothing in it
// is trusted: every count, length and offset is bounded here, so that the
// handler sees only sane values. maxSegments caps a read's segments.
func decodeRequest(m method, payload []byte, maxSegments int) (*request, error) {
	r := &request{method: m}
	switch m {
	case methodHello:
		var pb transferpb.HelloRequest
		if err := unmarshal(payload, &pb); err != nil {
			return nil, err
		}
		if err := validStrings("features", pb.Features, 64, 64); err != nil {
			return nil, err
		}
		if len(pb.Versions) > 64 || len(pb.Node) > 253 {
			return nil, invalid("hello: %d versions, node name of %d bytes", len(pb.Versions), len(pb.Node))
		}
		r.hello = HelloInfo{Node: pb.Node, Versions: pb.Versions, Features: pb.Features}
	case methodLayouts:
		var pb transferpb.LayoutsRequest
		if err := unmarshal(payload, &pb); err != nil {
			return nil, err
		}
		// No digest asks for every layout: an importer that sees a
		// holder's layout-set digest change refetches them all.
		if len(pb.Digests) > maxDigests {
			return nil, invalid("layouts: %d digests (at most %d)", len(pb.Digests), maxDigests)
		}
		for i, d := range pb.Digests {
			if len(d) == 0 || len(d) > maxDigestLen {
				return nil, invalid("layouts: digest %d is %d bytes, not in [1, %d]", i, len(d), maxDigestLen)
			}
		}
		r.digests = pb.Digests
	case methodLease:
		var pb transferpb.LeaseRequest
		if err := unmarshal(payload, &pb); err != nil {
			return nil, err
		}
		if len(pb.Hashes) == 0 || len(pb.Hashes) > MaxLeaseBlocks {
			return nil, invalid("lease: %d hashes not in [1, %d]", len(pb.Hashes), MaxLeaseBlocks)
		}
		d, err := durationMS(pb.DurationMs)
		if err != nil {
			return nil, err
		}
		r.hashes, r.duration, r.rdma = pb.Hashes, d, pb.Rdma
		if len(pb.Rma) > maxRMAKind {
			return nil, invalid("lease: rma binding name of %d bytes, at most %d", len(pb.Rma), maxRMAKind)
		}
		r.rma = pb.Rma
		if r.inlineAt, err = inlineAt("lease", pb.ReadsInlineAt); err != nil {
			return nil, err
		}
	case methodRdmaConnect:
		var pb transferpb.RdmaConnectRequest
		if err := unmarshal(payload, &pb); err != nil {
			return nil, err
		}
		e, err := endpointFrom(pb.Endpoint)
		if err != nil {
			return nil, err
		}
		if pb.Nic >= MaxNICs || pb.ReaderNic >= MaxNICs {
			return nil, invalid("rdma connect: nic %d or reader nic %d, not below %d", pb.Nic, pb.ReaderNic, MaxNICs)
		}
		if pb.QueuePairs > MaxQPsPerPeer {
			return nil, invalid("rdma connect: %d queue pairs, at most %d", pb.QueuePairs, MaxQPsPerPeer)
		}
		r.endpoint, r.nic, r.readerNIC, r.queuePairs = e, int(pb.Nic), int(pb.ReaderNic), int(pb.QueuePairs)
	case methodLaneToken:
		var pb transferpb.LaneTokenRequest
		if err := unmarshal(payload, &pb); err != nil {
			return nil, err
		}
		if pb.Count == 0 || pb.Count > MaxLaneConns {
			return nil, invalid("lane token: %d tokens not in [1, %d]", pb.Count, MaxLaneConns)
		}
		r.laneTokens = int(pb.Count)
	case methodIndex:
		var pb transferpb.IndexRequest
		if err := unmarshal(payload, &pb); err != nil {
			return nil, err
		}
		if len(pb.Payload) == 0 {
			return nil, invalid("index: empty payload")
		}
		r.index = pb.Payload
	case methodRenew:
		var pb transferpb.RenewRequest
		if err := unmarshal(payload, &pb); err != nil {
			return nil, err
		}
		d, err := durationMS(pb.DurationMs)
		if err != nil {
			return nil, err
		}
		r.leaseID, r.duration = pb.LeaseId, d
		if r.inlineAt, err = inlineAt("renew", pb.ReadsInlineAt); err != nil {
			return nil, err
		}
	case methodRelease:
		var pb transferpb.ReleaseRequest
		if err := unmarshal(payload, &pb); err != nil {
			return nil, err
		}
		if len(pb.Mismatched) > MaxLeaseBlocks {
			return nil, invalid("mismatched: %d hashes, over %d", len(pb.Mismatched), MaxLeaseBlocks)
		}
		r.leaseID, r.mismatched = pb.LeaseId, pb.Mismatched
	case methodEventRange:
		var pb transferpb.EventRangeRequest
		if err := unmarshal(payload, &pb); err != nil {
			return nil, err
		}
		if pb.Origin == "" || len(pb.Origin) > maxOriginLen {
			return nil, invalid("event range: origin of %d bytes not in [1, %d]", len(pb.Origin), maxOriginLen)
		}
		switch {
		case pb.Snapshot && (pb.From != 0 || pb.To != 0):
			return nil, invalid("event range: a snapshot request with a range [%d, %d)", pb.From, pb.To)
		case pb.Snapshot && pb.SnapshotSeq == 0 && pb.Offset != 0:
			return nil, invalid("event range: snapshot page at offset %d names no snapshot", pb.Offset)
		case !pb.Snapshot && (pb.SnapshotSeq != 0 || pb.Offset != 0):
			return nil, invalid("event range: a range request with a snapshot cursor (%d, %d)", pb.SnapshotSeq, pb.Offset)
		case !pb.Snapshot && pb.From >= pb.To:
			return nil, invalid("event range: [%d, %d) is empty", pb.From, pb.To)
		case !pb.Snapshot && pb.To-pb.From > MaxEventRange:
			return nil, fmt.Errorf("%w: event range [%d, %d) is %d events, over the %d a request may ask for",
				ErrTooLarge, pb.From, pb.To, pb.To-pb.From, MaxEventRange)
		}
		r.events = EventQuery{Origin: pb.Origin, Incarnation: pb.Incarnation, From: pb.From, To: pb.To,
			Snapshot: pb.Snapshot, SnapshotSeq: pb.SnapshotSeq, Offset: pb.Offset}
	case methodRead:
		var pb transferpb.ReadRequest
		if err := unmarshal(payload, &pb); err != nil {
			return nil, err
		}
		if len(pb.Segments) == 0 || len(pb.Segments) > maxSegments {
			return nil, invalid("read: %d segments not in [1, %d]", len(pb.Segments), maxSegments)
		}
		r.leaseID, r.blockSet = pb.LeaseId, pb.BlockSet
		r.segments = make([]layout.Segment, len(pb.Segments))
		for i, s := range pb.Segments {
			seg := layout.Segment{
				SrcRank: int(s.SrcRank), SrcOffset: s.SrcOffset, Length: s.Length,
				Count: s.Count, SrcStride: s.SrcStride,
			}
			if s.SrcRank >= maxRank {
				return nil, invalid("read: segment %d: rank %d over %d", i, s.SrcRank, maxRank)
			}
			end, err := segmentEnd(seg)
			if err != nil {
				return nil, invalid("read: segment %d: %v", i, err)
			}
			_ = end
			n := seg.Bytes()
			if r.totalBytes+n < r.totalBytes || r.totalBytes+n > MaxReadBytes {
				return nil, fmt.Errorf("%w: read of more than %d bytes (at segment %d of %d), over the %d a request may ask for",
					ErrTooLarge, r.totalBytes, i, len(pb.Segments), MaxReadBytes)
			}
			r.totalBytes += n
			r.segments[i] = seg
		}
	default:
		return nil, invalid("unknown method %d", uint8(m))
	}
	return r, nil
}

// segmentEnd validates the source side of a segment and returns one past
// its last byte: Count and Length at least 1, pieces that do not overlap
// each other when strided, and no arithmetic overflow.
func segmentEnd(s layout.Segment) (uint64, error) {
	if s.Length == 0 || s.Count == 0 {
		return 0, fmt.Errorf("empty segment (length %d, count %d)", s.Length, s.Count)
	}
	if s.Count > 1 && s.SrcStride < s.Length {
		return 0, fmt.Errorf("source stride %d under length %d", s.SrcStride, s.Length)
	}
	if s.Length > math.MaxUint64/s.Count {
		return 0, fmt.Errorf("length %d × count %d overflows", s.Length, s.Count)
	}
	span := uint64(0)
	if s.Count > 1 {
		if s.SrcStride > (math.MaxUint64-s.Length)/(s.Count-1) {
			return 0, fmt.Errorf("stride %d × count %d overflows", s.SrcStride, s.Count)
		}
		span = (s.Count - 1) * s.SrcStride
	}
	span += s.Length
	if s.SrcOffset > math.MaxUint64-span {
		return 0, fmt.Errorf("offset %d + span %d overflows", s.SrcOffset, span)
	}
	return s.SrcOffset + span, nil
}

// dstEnd is segmentEnd for the destination side.
func dstEnd(s layout.Segment) (uint64, error) {
	return segmentEnd(layout.Segment{SrcOffset: s.DstOffset, SrcStride: s.DstStride, Length: s.Length, Count: s.Count})
}
