package transfer

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kvfabric/kvfabric/transfer/transferpb"
)

// FuzzDecodeRequest feeds arbitrary frames to the holder's decoder: it
// must never panic, and whatever it accepts must satisfy the invariants
// that the handler and serveRead rely on.
func FuzzDecodeRequest(f *testing.F) {
	seeds := []proto.Message{
		&transferpb.HelloRequest{Node: "a", Versions: []uint32{1}, Features: []string{"rdma"}},
		&transferpb.LayoutsRequest{Digests: [][]byte{[]byte("d1")}},
		&transferpb.LeaseRequest{Hashes: []uint64{1, 2}, DurationMs: 1000},
		&transferpb.RenewRequest{LeaseId: 4, DurationMs: 10},
		&transferpb.ReleaseRequest{LeaseId: 4},
		&transferpb.EventRangeRequest{Origin: "o", From: 1, To: 9},
		&transferpb.ReadRequest{LeaseId: 1, BlockSet: 2, Segments: []*transferpb.ReadSegment{
			{SrcRank: 1, SrcOffset: 10, Length: 128, Count: 64, SrcStride: 512},
		}},
	}
	for i, m := range seeds {
		f.Add(frameBytes(byte(i+1), m))
	}
	f.Add(frameBytes(byte(methodRelease), &transferpb.ReleaseRequest{LeaseId: 5, Mismatched: []uint64{7, 9}}))
	f.Add([]byte{7, 0, 0, 0, 3, 0x1a, 0x01, 0x00})
	f.Fuzz(func(t *testing.T, frame []byte) {
		kind, payload, err := readFrame(bytes.NewReader(frame), 1<<16)
		if err != nil {
			return
		}
		r, err := decodeRequest(method(kind), payload, 1024)
		if err != nil {
			if r != nil {
				t.Fatal("error with a request")
			}
			return
		}
		if r.method < 1 || r.method > methodMax {
			t.Fatalf("accepted method %d", r.method)
		}
		switch r.method {
		case methodLease, methodRenew:
			if r.duration <= 0 || r.duration > maxLeaseDuration {
				t.Fatalf("accepted duration %v", r.duration)
			}
		case methodRelease:
			if len(r.mismatched) > MaxLeaseBlocks {
				t.Fatalf("accepted %d mismatched hashes", len(r.mismatched))
			}
		case methodEventRange:
			q := r.events
			if q.Origin == "" || (!q.Snapshot && q.From >= q.To) || (q.Snapshot && q.To != 0) {
				t.Fatalf("accepted event query %+v", q)
			}
		case methodRead:
			if len(r.segments) == 0 || len(r.segments) > 1024 {
				t.Fatalf("accepted %d segments", len(r.segments))
			}
			var total uint64
			for _, s := range r.segments {
				end, err := segmentEnd(s)
				if err != nil || end < s.SrcOffset || s.SrcRank < 0 || s.SrcRank >= maxRank {
					t.Fatalf("accepted bad segment %+v: %v", s, err)
				}
				total += s.Bytes()
			}
			if total != r.totalBytes {
				t.Fatalf("total %d, segments add to %d", r.totalBytes, total)
			}
		}
	})
}

// FuzzReadFrame checks the framing alone: a frame is either refused or
// re-encodes to the bytes it came from.
func FuzzReadFrame(f *testing.F) {
	f.Add([]byte{1, 0, 0, 0, 0})
	f.Add([]byte{2, 0, 0, 0, 2, 0x0a, 0x00})
	f.Add([]byte{2, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, frame []byte) {
		kind, payload, err := readFrame(bytes.NewReader(frame), 1024)
		if err != nil {
			return
		}
		if len(payload) > 1024 {
			t.Fatalf("payload of %d bytes past the cap", len(payload))
		}
		if frame[0] != kind || !bytes.Equal(frame[headerLen:headerLen+len(payload)], payload) {
			t.Fatal("frame does not round-trip")
		}
	})
}
