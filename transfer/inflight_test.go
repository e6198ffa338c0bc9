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
	"google.golang.org/protobuf/encoding/protowire"
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
	alloc := allocated(func() {
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

// The request bytes one peer has in flight stop at MaxPeerRequestBytes:
// frames whose announced lengths fill it exactly are read, the next waits
// (though it sent only part of its payload) until one of them is done,
// then is read and decoded.
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
	// All but the last byte of two frames of the cap's half: their
	// announced lengths take the cap, exactly.
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
// refused as unavailable, naming the peer and the cap; one over the whole
// cap is refused at once as too large.
func TestRequestBudget(t *testing.T) {
	var st counters
	b := newRequestBudget("p1", 100, &st)
	start := time.Now()
	if err := b.acquire(101, time.Now().Add(10*time.Second)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("acquire past the whole cap: %v, want ErrTooLarge", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("acquire past the whole cap refused after %v; want at once", d)
	}
	if err := b.acquire(100, time.Now().Add(time.Second)); err != nil {
		t.Fatalf("acquire at the cap: %v", err)
	}
	start = time.Now()
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
	// Nothing may happen: a window wide enough for a loaded machine to
	// show a wrong grant.
	select {
	case err := <-done:
		t.Fatalf("acquired 60 with 50 free: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	b.release(10)
	if err := <-done; err != nil {
		t.Fatalf("acquire after release: %v", err)
	}
	if got := st.requestBytes.Load(); got != 100 {
		t.Errorf("request bytes %d, want 100", got)
	}
}

// paddedHello returns a HelloRequest from node of exactly size bytes: an
// unknown field, which decoding keeps and ignores, fills it out.
func paddedHello(t *testing.T, node string, size int) []byte {
	t.Helper()
	b, err := proto.Marshal(&transferpb.HelloRequest{Node: node, Versions: []uint32{ProtocolVersion}})
	if err != nil {
		t.Fatal(err)
	}
	const padField = 1000
	for pad := size - len(b); pad >= 0; pad-- {
		if len(b)+protowire.SizeTag(padField)+protowire.SizeBytes(pad) == size {
			out := protowire.AppendBytes(protowire.AppendTag(b, padField, protowire.BytesType), make([]byte, pad))
			if len(out) != size {
				t.Fatalf("padded hello of %d bytes, want %d", len(out), size)
			}
			return out
		}
	}
	t.Fatalf("no padded hello of %d bytes", size)
	return nil
}

// Full-size requests from one peer, twice as many as its cap holds
// together, all in flight at once: each fits the cap alone, so every one
// is let in in turn and served, none refused. Each sends half its payload
// before any is finished; a budget charged piece by piece as buffers grow
// would leave every one of them holding half the cap's share and waiting
// for the others until the deadline.
func TestPeerRequestsThatFitAloneAreAllServed(t *testing.T) {
	const (
		frame    = 1 << 20
		progress = 10 * time.Second
	)
	for _, tc := range []struct {
		name string
		cap  uint64 // MaxPeerRequestBytes; zero for the default
	}{
		{"cap at MaxMessageSize", frame},
		{"default cap", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ca := newTestCA(t)
			members := newMembers("holder", "reader")
			holder := newTestNode(t, ca, "holder", members, newMemHandler(), func(c *Config) {
				c.MaxMessageSize = frame
				c.MaxPeerRequestBytes = tc.cap
				c.ProgressTimeout = progress
			})
			reader := newTestNode(t, ca, "reader", members, nil)
			ratio := int(holder.cfg.MaxPeerRequestBytes / frame)
			if tc.cap == 0 && ratio != 4 {
				t.Fatalf("default MaxPeerRequestBytes is %d frames, the test wants 4", ratio)
			}
			streams := 2 * ratio
			p := dialPeer(t, reader, holder)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			conn, err := p.conn(ctx, 0)
			if err != nil {
				t.Fatal(err)
			}
			req := append(header(methodHello, frame), paddedHello(t, "reader", frame)...)
			half := headerLen + frame/2
			type result struct {
				kind    byte
				payload []byte
				err     error
				after   time.Duration
			}
			var (
				wg      sync.WaitGroup
				rest    = make(chan struct{})
				results = make([]result, streams)
				start   time.Time
			)
			for i := range streams {
				s, err := conn.OpenStreamSync(ctx)
				if err != nil {
					t.Fatal(err)
				}
				_ = s.SetDeadline(time.Now().Add(45 * time.Second))
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := &results[i]
					// Writes block while the holder does not read, so
					// each stream writes on its own.
					if _, r.err = s.Write(req[:half]); r.err != nil {
						return
					}
					<-rest
					if _, r.err = s.Write(req[half:]); r.err != nil {
						return
					}
					s.Close()
					r.kind, r.payload, r.err = readFrame(s, frame)
					r.after = time.Since(start)
				}()
			}
			// Every stream is in: as many as the cap holds have their
			// share, the others wait for it.
			waitStats(t, holder, "streams past the cap wait", func(st Metrics) bool {
				return st.RequestBudgetWaits >= uint64(ratio) && st.RequestBytes == uint64(ratio)*frame
			})
			start = time.Now()
			close(rest)
			wg.Wait()
			var longest time.Duration
			for i, r := range results {
				if r.err != nil {
					t.Errorf("stream %d: no answer: %v", i, r.err)
					continue
				}
				if r.kind != statusOK {
					var e transferpb.Error
					_ = proto.Unmarshal(r.payload, &e)
					t.Errorf("stream %d refused after %v: code %d: %s", i, r.after.Round(time.Millisecond), e.Code, e.Message)
					continue
				}
				var resp transferpb.HelloResponse
				if err := proto.Unmarshal(r.payload, &resp); err != nil || resp.Node != "holder" {
					t.Errorf("stream %d: answer %v from %q, want a hello from holder", i, err, resp.Node)
				}
				longest = max(longest, r.after)
			}
			// Well inside the deadline a stuck request would be refused at.
			if bound := progress / 2; longest > bound {
				t.Errorf("last request served %v after the rest was sent; bound %v", longest, bound)
			}
			if !t.Failed() {
				t.Logf("%d concurrent %d-byte requests, cap %d: all served within %v", streams, frame, holder.cfg.MaxPeerRequestBytes, longest.Round(time.Millisecond))
			}
			waitStats(t, holder, "every byte released", func(st Metrics) bool { return st.RequestBytes == 0 })
		})
	}
}

// The budget is charged the announced length once, before any of the
// payload is read; the buffer still follows what arrives; a refused
// charge reads nothing and leaves nothing charged.
func TestReadFrameChargesAnnouncedLength(t *testing.T) {
	const limit = 4 << 20
	const send = 100 << 10
	head := append(header(methodHello, limit), make([]byte, send)...)
	r := &silentReader{head: head, stop: make(chan struct{})}
	close(r.stop)
	var charges []int
	var charged int
	var err error
	got := allocated(func() {
		_, _, charged, err = readFrameCharged(r, limit, func(n int) error {
			if left := len(r.head); left != send {
				t.Errorf("charged after %d payload bytes were read; want before any", send-left)
			}
			charges = append(charges, n)
			return nil
		})
	})
	if err == nil {
		t.Fatal("readFrameCharged succeeded on a truncated frame")
	}
	if len(charges) != 1 || charges[0] != limit || charged != limit {
		t.Errorf("charges %v, returned %d; want one charge of %d, returned as charged", charges, charged, limit)
	}
	if bound := uint64(2*send + 2*firstChunk + 256<<10); got > bound {
		t.Errorf("allocated %d bytes for %d that arrived (%d charged); bound %d", got, send, limit, bound)
	}

	refused := errors.New("over budget")
	r = &silentReader{head: append(header(methodHello, limit), make([]byte, send)...), stop: make(chan struct{})}
	close(r.stop)
	_, payload, charged, err := readFrameCharged(r, limit, func(int) error { return refused })
	if !errors.Is(err, refused) || payload != nil || charged != 0 {
		t.Errorf("refused charge: err %v, %d payload bytes, %d charged; want the charge's error, nothing", err, len(payload), charged)
	}
	if len(r.head) != send {
		t.Errorf("refused charge read %d payload bytes; want none", send-len(r.head))
	}

	// Past the cap: refused before any charge.
	r = &silentReader{head: header(methodHello, limit+1), stop: make(chan struct{})}
	close(r.stop)
	_, _, charged, err = readFrameCharged(r, limit, func(n int) error {
		t.Errorf("charged %d for a frame past the cap", n)
		return nil
	})
	if !errors.Is(err, ErrTooLarge) || charged != 0 {
		t.Errorf("past the cap: %v, %d charged; want ErrTooLarge, 0", err, charged)
	}
}

// waitWaiters waits until b has n streams waiting.
func waitWaiters(t *testing.T, b *requestBudget, n int) {
	t.Helper()
	wait.For(t, 10*time.Second, fmt.Sprintf("%d waiting", n), func() error {
		b.mu.Lock()
		defer b.mu.Unlock()
		if len(b.waiters) != n {
			return fmt.Errorf("%d waiting", len(b.waiters))
		}
		return nil
	})
}

// Waiters are let in in arrival order: a small request does not pass a
// full-size one that waits, even where it would fit, so the full-size one
// gets in once those ahead of it finish; and a waiter whose deadline
// passes lets in the ones it held back.
func TestRequestBudgetInArrivalOrder(t *testing.T) {
	var st counters
	b := newRequestBudget("p1", 100, &st)
	if err := b.acquire(60, time.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	full := make(chan error, 1)
	go func() { full <- b.acquire(100, time.Now().Add(20*time.Second)) }()
	waitWaiters(t, b, 1)
	// 60 + 10 fits, but the full-size request is ahead.
	if err := b.acquire(10, time.Now().Add(100*time.Millisecond)); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("a small request passed a waiting full-size one: %v", err)
	}
	waitWaiters(t, b, 1) // the small one left the line at its deadline
	b.release(60)
	select {
	case err := <-full:
		if err != nil {
			t.Fatalf("full-size request once the others finished: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("full-size request not let in 10 s after the others finished")
	}

	// The cap is full; a full-size request waits, a small one behind it.
	head := make(chan error, 1)
	go func() { head <- b.acquire(100, time.Now().Add(300*time.Millisecond)) }()
	waitWaiters(t, b, 1)
	small := make(chan error, 1)
	go func() { small <- b.acquire(1, time.Now().Add(20*time.Second)) }()
	waitWaiters(t, b, 2)
	b.release(50) // room for the small one, not for the head
	if err := <-head; !errors.Is(err, ErrUnavailable) {
		t.Fatalf("full-size request with 50 of 100 in flight: %v, want ErrUnavailable at its deadline", err)
	}
	select {
	case err := <-small:
		if err != nil {
			t.Fatalf("small request once the head left: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("small request not let in 10 s after the head ahead of it left")
	}
	waitWaiters(t, b, 0)
	if got := st.requestBytes.Load(); got != 51 {
		t.Errorf("request bytes %d, want 51", got)
	}
	if got := st.budgetWaits.Load(); got != 4 {
		t.Errorf("budget waits %d, want 4", got)
	}
}
