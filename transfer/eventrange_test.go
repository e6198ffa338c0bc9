package transfer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kvfabric/kvfabric/transfer/transferpb"
)

func encodeRange(t *testing.T, req *transferpb.EventRangeRequest) []byte {
	t.Helper()
	b, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A request may ask for MaxEventRange events and no more: one past is
// refused as too large, which the repairer answers with a snapshot.
func TestEventRangeCap(t *testing.T) {
	for _, tc := range []struct {
		desc     string
		req      *transferpb.EventRangeRequest
		wantErr  error
		wantSpan uint64
	}{
		{"at the cap", &transferpb.EventRangeRequest{Origin: "o", From: 1, To: 1 + MaxEventRange}, nil, MaxEventRange},
		{"one past the cap", &transferpb.EventRangeRequest{Origin: "o", From: 1, To: 2 + MaxEventRange}, ErrTooLarge, 0},
		{"at the cap, near the top", &transferpb.EventRangeRequest{Origin: "o", From: math.MaxUint64 - MaxEventRange, To: math.MaxUint64}, nil, MaxEventRange},
		{"snapshot page", &transferpb.EventRangeRequest{Origin: "o", Snapshot: true, SnapshotSeq: 9, Offset: 4096}, nil, 0},
		{"snapshot page without its snapshot", &transferpb.EventRangeRequest{Origin: "o", Snapshot: true, Offset: 4096}, ErrInvalidRequest, 0},
		{"range with a snapshot cursor", &transferpb.EventRangeRequest{Origin: "o", From: 1, To: 5, Offset: 3}, ErrInvalidRequest, 0},
	} {
		r, err := decodeRequest(methodEventRange, encodeRange(t, tc.req), 1)
		if tc.wantErr != nil {
			if !errors.Is(err, tc.wantErr) {
				t.Errorf("%s: err = %v, want %v", tc.desc, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.desc, err)
			continue
		}
		if got := r.events.To - r.events.From; got != tc.wantSpan {
			t.Errorf("%s: span %d, want %d", tc.desc, got, tc.wantSpan)
		}
	}

	// The same over the wire: the holder serves the whole range at the
	// cap, and refuses one past it with the code of ErrTooLarge.
	ca := newTestCA(t)
	members := newMembers("a", "b")
	a := newTestNode(t, ca, "a", members, newMemHandler())
	b := newTestNode(t, ca, "b", members, nil)
	p := dialPeer(t, b, a)
	ctx := context.Background()
	er, err := p.EventRange(ctx, EventQuery{Origin: "c", From: 100, To: 100 + MaxEventRange})
	if err != nil {
		t.Fatal(err)
	}
	if len(er.Events) != MaxEventRange || er.Events[MaxEventRange-1].Seq != 100+MaxEventRange-1 {
		t.Fatalf("range at the cap: %d events", len(er.Events))
	}
	_, err = p.EventRange(ctx, EventQuery{Origin: "c", From: 100, To: 101 + MaxEventRange})
	var re *RemoteError
	if !errors.Is(err, ErrTooLarge) || !errors.As(err, &re) || re.Code != CodeTooLarge {
		t.Fatalf("range one past the cap: %v, want a remote ErrTooLarge", err)
	}
}

// fillHandler answers a range with events that take exactly q.MaxBytes as
// the Handler contract counts them, with the widest sequence numbers.
type fillHandler struct {
	*memHandler
	budget atomic.Int64
}

func (h *fillHandler) EventRange(ctx context.Context, peer string, q EventQuery) (EventRange, error) {
	h.budget.Store(int64(q.MaxBytes))
	var er EventRange
	left := q.MaxBytes
	for s := q.From; s < q.To && left > EventOverhead; s++ {
		n := min(left-EventOverhead, 300)
		if rest := left - EventOverhead - n; rest > 0 && rest <= EventOverhead {
			n = left - EventOverhead // no room for another: take it all
		}
		er.Events = append(er.Events, LogEntry{Seq: s, Payload: make([]byte, n)})
		left -= n + EventOverhead
	}
	if left != 0 {
		return EventRange{}, fmt.Errorf("test handler left %d bytes of the budget", left)
	}
	er.More = true
	return er, nil
}

// An answer that takes all of EventQuery.MaxBytes fits one frame, and the
// budget leaves little of the frame unused.
func TestEventRangeBudgetFitsFrame(t *testing.T) {
	for _, limit := range []uint32{1 << 10, 64 << 10} {
		ca := newTestCA(t)
		members := newMembers("a", "b")
		h := &fillHandler{memHandler: newMemHandler()}
		small := func(c *Config) { c.MaxMessageSize = limit }
		a := newTestNode(t, ca, "a", members, h, small)
		b := newTestNode(t, ca, "b", members, nil, small)
		p := dialPeer(t, b, a)
		from := uint64(math.MaxUint64 - MaxEventRange)
		er, err := p.EventRange(context.Background(), EventQuery{Origin: "c", From: from, To: from + MaxEventRange})
		if err != nil {
			t.Fatalf("frames of %d: %v", limit, err)
		}
		if !er.More || len(er.Events) == 0 {
			t.Fatalf("frames of %d: %d events, more %v", limit, len(er.Events), er.More)
		}
		if got := h.budget.Load(); got <= int64(limit)-64 || got > int64(limit) {
			t.Errorf("frames of %d: a budget of %d bytes", limit, got)
		}
	}
}
