package transfer

import (
	"context"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/transfer/transferpb"
)

// tcpPair is both ends of a loopback TCP connection.
func tcpPair(t *testing.T) (a, b net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	a, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b = <-accepted
	if b == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// readReturns reads from c in the background and says whether the read
// ended (with a deadline error) within d.
func readReturns(t *testing.T, c net.Conn, d time.Duration) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := c.Read(make([]byte, 1))
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("read ended with %v, want the deadline passed", err)
		}
	case <-time.After(d):
		c.Close() // ends the read, so the goroutine does not outlive the test
		t.Fatalf("a read on a connection whose context ended still blocks after %v", d)
	}
}

// Once a lane read's context ends, nothing the read path sets afterwards
// (the progress deadline pushed forward, the deadline cleared after an
// answer, a request's write deadline) moves the connection's deadline out
// of the past: a cancel that lands between the path's look at the context
// and its deadline call still interrupts the read.
func TestLaneWatchCancelStays(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(w *laneWatch)
	}{
		{"progress pushed forward", func(w *laneWatch) { w.setReadDeadline(time.Now().Add(time.Hour)) }},
		{"cleared after an answer", func(w *laneWatch) { w.setReadDeadline(time.Time{}) }},
		{"both set, as a dial does", func(w *laneWatch) { w.setDeadline(time.Now().Add(time.Hour)) }},
		{"a request's write deadline, then progress", func(w *laneWatch) {
			w.setWriteDeadline(time.Now().Add(time.Hour))
			(&laneProgress{w: w, timeout: time.Hour}).refresh()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, _ := tcpPair(t)
			ctx, cancel := context.WithCancel(context.Background())
			w := watchLane(ctx, a)
			cancel()
			waitFor(t, 10*time.Second, "the watch saw the cancel", func() bool {
				w.mu.Lock()
				defer w.mu.Unlock()
				return w.ended
			})
			tc.set(w)
			readReturns(t, a, 10*time.Second)
			if w.done() {
				t.Error("done says the watch ended before its context")
			}
		})
	}
	// Without a cancel, the watch sets what it is asked and done is true.
	a, b := tcpPair(t)
	w := watchLane(context.Background(), a)
	w.setReadDeadline(time.Now().Add(50 * time.Millisecond))
	readReturns(t, a, 10*time.Second)
	w.setReadDeadline(time.Time{})
	if _, err := b.Write([]byte{1}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Read(make([]byte, 1)); err != nil {
		t.Fatalf("read after the deadline was cleared: %v", err)
	}
	if !w.done() {
		t.Error("done says the context ended")
	}
}

// A lane read cancelled while its connection waits on a holder that
// stalls (an answer ahead of it already complete, the next one half sent)
// returns at once, not after ProgressTimeout, and the connection is not
// reused; cancels at several moments, the first before any request (then
// nothing is asked for).
func TestLaneReadCancelledInterrupts(t *testing.T) {
	const progress = time.Minute
	_, _, p, _ := laneSetup(t, 1<<20, true, func(c *Config) { c.ProgressTimeout = progress })
	for _, after := range []time.Duration{0, time.Millisecond, 20 * time.Millisecond, 200 * time.Millisecond} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		stalled := make(chan struct{})
		go func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			for part := 0; ; part++ {
				if _, _, err := readFrame(c, 1<<20); err != nil {
					return
				}
				_ = writeFrame(c, statusOK, &transferpb.ReadResponse{TotalBytes: 1 << 20}, 1<<20)
				if part == 0 {
					_, _ = c.Write(make([]byte, 1<<20))
					continue
				}
				_, _ = c.Write(make([]byte, 512<<10))
				<-stalled
				return
			}
		}()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		lc := &laneConn{c: c, r: c}
		ctx, cancel := context.WithCancel(context.Background())
		if after == 0 {
			cancel()
		} else {
			time.AfterFunc(after, cancel)
		}
		next := make(chan []layout.Segment, 2)
		next <- []layout.Segment{{Length: 1 << 20, Count: 1}}
		next <- []layout.Segment{{SrcOffset: 1 << 20, DstOffset: 1 << 20, Length: 1 << 20, Count: 1}}
		close(next)
		start := time.Now()
		ok, err := p.readLaneParts(ctx, lc, 5, 9, next, [][]byte{make([]byte, 2<<20)}, nil)
		took := time.Since(start)
		close(stalled)
		c.Close()
		ln.Close()
		cancel()
		if after == 0 && err != nil {
			t.Errorf("cancelled before it began: %v; want nothing read and no error", err)
		}
		if after > 0 && ok {
			t.Errorf("cancelled after %v: ok %v, err %v; want a connection not to reuse", after, ok, err)
		}
		if after >= 200*time.Millisecond && err == nil {
			t.Errorf("cancelled after %v, mid-answer: no error", after)
		}
		if took > progress/4 {
			t.Errorf("cancelled after %v: the read returned after %v (ProgressTimeout %v)", after, took, progress)
		}
	}
}
