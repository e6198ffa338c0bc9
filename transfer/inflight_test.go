package transfer

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"google.golang.org/protobuf/proto"

	"github.com/kvfabric/kvfabric/internal/wait"
	"github.com/kvfabric/kvfabric/transfer/transferpb"
)

// header returns a request frame header announcing n payload bytes.
func header(m method, n uint32) []byte {
	h := make([]byte, headerLen)
	h[0] = byte(m)
	binary.BigEndian.PutUint32(h[1:], n)
	return h
}

// silentReader returns a header and then blocks until closed, like a peer
// that announced a frame and went quiet.
type silentReader struct {
	head []byte
	stop chan struct{}
}

func (r *silentReader) Read(p []byte) (int, error) {
	if len(r.head) > 0 {
		n := copy(p, r.head)
		r.head = r.head[n:]
		return n, nil
	}
	<-r.stop
	return 0, errors.New("deadline")
}

// allocated returns the bytes f allocates (the whole process's, so callers
// leave wide margins).
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// A frame header announcing the largest allowed frame, then nothing: the
// reader must not allocate the announced size before the bytes arrive.
func TestReadFrameAllocatesOnlyWhatArrives(t *testing.T) {
	const limit = 4 << 20
	for _, tc := range []struct {
		name     string
		announce uint32
		send     int
		want     error
	}{
		{"at the cap, silent", limit, 0, ErrFrame},
		{"at the cap, 100 KiB then silent", limit, 100 << 10, ErrFrame},
		{"past the cap", limit + 1, 0, ErrTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &silentReader{head: append(header(methodHello, tc.announce), make([]byte, tc.send)...), stop: make(chan struct{})}
			close(r.stop) // after the bytes, the read fails
			var err error
			got := allocated(func() { _, _, err = readFrame(r, limit) })
			if err == nil {
				t.Fatal("readFrame succeeded on a truncated frame")
			}
			if tc.want == ErrTooLarge && !errors.Is(err, ErrTooLarge) {
				t.Fatalf("err = %v, want ErrTooLarge", err)
			}
			// Twice what arrived, plus the first chunk, plus slack for
			// the runtime.
			bound := uint64(2*tc.send + 2*firstChunk + 256<<10)
			if got > bound {
				t.Errorf("allocated %d bytes for %d that arrived (announced %d); bound %d", got, tc.send, tc.announce, bound)
			}
			t.Logf("allocated %d bytes for %d that arrived, %d announced: %v", got, tc.send, tc.announce, err)
		})
	}
	// A whole frame at the cap still reads.
	payload := make([]byte, limit)
	for i := range payload {
		payload[i] = byte(i)
	}
	r := io.MultiReader(bytesReader(header(methodHello, limit)), bytesReader(payload))
	kind, got, err := readFrame(r, limit)
	if err != nil || kind != byte(methodHello) || len(got) != limit || got[limit-1] != payload[limit-1] {
		t.Fatalf("whole frame at the cap: kind %d, %d bytes, %v", kind, len(got), err)
	}
}

type sliceReader struct{ b []byte }

func bytesReader(b []byte) io.Reader { return &sliceReader{b} }

// Read returns at most 1000 bytes at a time, as a network does.
func (r *sliceReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), 1000)], r.b)
	r.b = r.b[n:]
	return n, nil
}

// Many streams from one member each announce a 4 MiB frame and go silent:
// the holder allocates nothing like 4 MiB per stream, drops each stream
// within ProgressTimeout, and keeps answering others meanwhile.
func TestSilentFrameHeadersCostNothing(t *testing.T) {
	ca := newTestCA(t)
	members := newMembers("holder", "reader", "attacker")
	const progress = 800 * time.Millisecond
	holder := newTestNode(t, ca, "holder", members, newMemHandler(), func(c *Config) { c.ProgressTimeout = progress })
	reader := newTestNode(t, ca, "reader", members, nil)
	attacker := newTestNode(t, ca, "attacker", members, nil)
	good := dialPeer(t, reader, holder)
	bad := dialPeer(t, attacker, holder)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := bad.conn(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if holder.cfg.MaxMessageSize != 4<<20 {
		t.Fatalf("MaxMessageSize %d, the test wants the 4 MiB default", holder.cfg.MaxMessageSize)
	}
	const streams = 64 // 256 MiB if each header were believed
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		longest time.Duration
		errs    []error
	)
	var alloc uint64
	alloc = allocated(func() {
		start := time.Now()
		for range streams {
			s, err := conn.OpenStreamSync(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Write(header(methodLease, 4<<20)); err != nil {
				t.Fatal(err)
			}
			wg.Add(1)
			go func(s *quic.Stream) {
				defer wg.Done()
				_ = s.SetReadDeadline(time.Now().Add(15 * time.Second))
				// The holder answers with an error or resets the
				// stream; either ends this read.
				_, rerr := io.ReadAll(s)
				d := time.Since(start)
				mu.Lock()
				longest = max(longest, d)
				var se *quic.StreamError
				if rerr != nil && !errors.As(rerr, &se) {
					errs = append(errs, rerr)
				}
				mu.Unlock()
			}(s)
		}
		// Others are served while the silent streams are open.
		if _, err := good.Hello(ctx, nil); err != nil {
			t.Errorf("hello while %d silent streams are open: %v", streams, err)
		}
		wg.Wait()
	})
	for _, err := range errs {
		t.Errorf("a silent stream was not ended by the holder: %v", err)
	}
	// ProgressTimeout, plus wide slack for a loaded machine.
	if longest > progress+5*time.Second {
		t.Errorf("the holder dropped the last silent stream after %v; bound %v", longest, progress+5*time.Second)
	}
	if alloc > 64<<20 {
		t.Errorf("%d silent 4 MiB headers cost %d MiB of allocation; bound 64 MiB", streams, alloc>>20)
	}
	t.Logf("%d silent streams: %d MiB allocated in the process, last dropped after %v", streams, alloc>>20, longest.Round(time.Millisecond))
	if st := holder.Metrics(); st.RequestBytes != 0 {
		t.Errorf("request bytes still held after every stream ended: %d", st.RequestBytes)
	}
	if _, err := good.Hello(ctx, nil); err != nil {
		t.Fatalf("hello after the silent streams: %v", err)
	}
}

// The request bytes buffered for one peer stop at MaxPeerRequestBytes:
// frames that fill it exactly are read, the next waits until one of them
// is done, then is served.
func TestPeerRequestBytesCapped(t *testing.T) {
	ca := newTestCA(t)
	members := newMembers("holder", "attacker")
	const frame = 1 << 20
	holder := newTestNode(t, ca, "holder", members, newMemHandler(), func(c *Config) {
		c.MaxMessageSize = frame
		c.MaxPeerRequestBytes = 2 * frame
		c.ProgressTimeout = 20 * time.Second // no stream times out here
	})
	attacker := newTestNode(t, ca, "attacker", members, nil)
	bad := dialPeer(t, attacker, holder)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := bad.conn(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	open := func(first []byte) *quic.Stream {
		s, err := conn.OpenStreamSync(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_ = s.SetDeadline(time.Now().Add(25 * time.Second))
		if _, err := s.Write(first); err != nil {
			t.Fatal(err)
		}
		return s
	}
	// All but the last byte of two frames of the cap's half: the cap,
	// exactly, is buffered.
	body := make([]byte, frame-1)
	a := open(append(header(methodLease, frame), body...))
	b := open(append(header(methodLease, frame), body...))
	waitStats(t, holder, "two frames fill the cap", func(st Metrics) bool { return st.RequestBytes == 2*frame })
	// Past the cap: a third frame waits.
	c := open(append(header(methodLease, frame), make([]byte, 64<<10)...))
	waitStats(t, holder, "the third frame waits", func(st Metrics) bool { return st.RequestBudgetWaits == 1 })
	if st := holder.Metrics(); st.RequestBytes != 2*frame {
		t.Fatalf("%d request bytes buffered with the cap at %d", st.RequestBytes, 2*frame)
	}
	// Finishing the first frame lets the third in.
	answer := func(s *quic.Stream, what string) Code {
		t.Helper()
		s.Close()
		kind, payload, err := readFrame(s, 1<<16)
		if err != nil {
			t.Fatalf("%s: no answer: %v", what, err)
		}
		var e transferpb.Error
		if kind != statusError || proto.Unmarshal(payload, &e) != nil {
			t.Fatalf("%s: status %d; want an Error frame", what, kind)
		}
		return Code(e.Code)
	}
	if _, err := a.Write([]byte{0xff}); err != nil {
		t.Fatal(err)
	}
	if code := answer(a, "first frame"); code != CodeInvalidRequest {
		t.Errorf("first frame (not protobuf): code %d, want %d", code, CodeInvalidRequest)
	}
	if _, err := c.Write(make([]byte, frame-64<<10)); err != nil {
		t.Fatal(err)
	}
	if code := answer(c, "third frame"); code != CodeInvalidRequest {
		t.Errorf("third frame, once let in: code %d, want %d (decoded, not refused)", code, CodeInvalidRequest)
	}
	if _, err := b.Write([]byte{0xff}); err != nil {
		t.Fatal(err)
	}
	answer(b, "second frame")
	waitStats(t, holder, "every byte released", func(st Metrics) bool { return st.RequestBytes == 0 })
}

func waitStats(t *testing.T, n *Node, what string, cond func(Metrics) bool) {
	t.Helper()
	wait.For(t, 10*time.Second, what, func() error {
		if m := n.Metrics(); !cond(m) {
			return fmt.Errorf("metrics %+v", m)
		}
		return nil
	})
}

// A frame that cannot get its bytes under the cap before its deadline is
// refused as unavailable, naming the peer and the cap.
func TestRequestBudget(t *testing.T) {
	var st counters
	b := newRequestBudget("p1", 100, &st)
	if err := b.acquire(100, time.Now().Add(time.Second)); err != nil {
		t.Fatalf("acquire at the cap: %v", err)
	}
	start := time.Now()
	err := b.acquire(1, time.Now().Add(100*time.Millisecond))
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("acquire past the cap: %v, want ErrUnavailable", err)
	}
	if d := time.Since(start); d < 90*time.Millisecond || d > 5*time.Second {
		t.Errorf("gave up after %v, deadline was 100 ms", d)
	}
	t.Log(err)
	done := make(chan error)
	go func() { done <- b.acquire(60, time.Now().Add(10*time.Second)) }()
	b.release(50)
	select {
	case err := <-done:
		t.Fatalf("acquired 60 with 50 free: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	b.release(10)
	if err := <-done; err != nil {
		t.Fatalf("acquire after release: %v", err)
	}
	if got := st.requestBytes.Load(); got != 100 {
		t.Errorf("request bytes %d, want 100", got)
	}
}
