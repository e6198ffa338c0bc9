//go:build cgo && linux

package ofi

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/internal/kvtest"
)

// readShape reads n pieces of 8 KiB from holder's src, landing 16 KiB
// apart in dst (an HND import's shape), and checks every byte.
func readShape(t *testing.T, holder, reader *Endpoint, n int, seed byte) (ReadResult, error) {
	t.Helper()
	const piece = 8192
	src, dst := mapped(t, n*piece), mapped(t, 2*n*piece)
	fill(src, seed)
	srcReg, dstReg := register(t, holder, src), register(t, reader, dst)
	peer, err := reader.AddPeer(holder.Name())
	if err != nil {
		t.Fatal(err)
	}
	var segs []Segment
	for i := range uint64(n) {
		segs = append(segs, Segment{LocalOff: 2 * i * piece, RemoteOff: i * piece, Len: piece, Remote: srcReg.Remote()})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := reader.ReadDetailed(ctx, peer, dstReg, segs)
	if err != nil {
		return res, err
	}
	for i := range n {
		if !bytes.Equal(dst[2*i*piece:(2*i+1)*piece], src[i*piece:(i+1)*piece]) {
			t.Fatalf("piece %d differs", i)
		}
	}
	return res, nil
}

// ReadDetailed says a read completed inline only where the provider
// completed every request within the call that posted it: shm host-only
// by cross-memory attach (this process reading itself); not shm with
// FI_HMEM, where the holder's progress copies each read, nor tcp, whose
// holder sends the bytes; and never a read of one request.
func TestReadDetailedInline(t *testing.T) {
	cases := []struct {
		name     string
		prov     string
		hostOnly bool
		inline   bool // by cross-memory attach
	}{
		{"shm host-only", "shm", true, true},
		{"shm with FI_HMEM", "shm", false, false},
		{"tcp", "tcp", true, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.inline {
				if err := kvtest.CrossMemoryAttach(); err != nil {
					t.Skipf("shm without cross-memory attach (process_vm_readv: %v): its reads need the holder", err)
				}
			}
			l, err := Load(Config{Provider: c.prov, Node: nodeFor(c.prov), HostOnly: c.hostOnly})
			if err != nil {
				t.Fatalf("libfabric (make test-deps): %v", err)
			}
			t.Cleanup(func() { l.Close() })
			if !c.hostOnly {
				// Without FI_HMEM the endpoint opens host-only, and
				// its reads complete inline: not the case under test.
				offered, err := l.Providers()
				if err != nil {
					t.Fatal(err)
				}
				if p, err := Choose(offered, c.prov); err != nil || !p.HMEM {
					t.Skipf("%s without FI_HMEM here (%+v, %v)", c.prov, p, err)
				}
			}
			holder, reader := openEndpoint(t, l), openIdle(t, l)
			res, err := readShape(t, holder, reader, 256, 3)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %+v", c.name, res)
			if res.Requests < 2 || res.Inline != c.inline || res.Pending == c.inline {
				t.Fatalf("read of 256 pieces: %+v, want inline %v, pending %v, two requests or more", res, c.inline, !c.inline)
			}
			one, err := readShape(t, holder, reader, 1, 4)
			if err != nil {
				t.Fatal(err)
			}
			if one.Requests != 1 || one.Inline {
				t.Fatalf("read of one piece: %+v, want one request, not inline", one)
			}
		})
	}
}

// The progress loop's cap follows what the endpoint serves: ServeInline
// alone naps up to inlineServeMaxNap, a Serve beside it brings the cap
// back to servingMaxNap at once (a reader that needs the holder's progress
// gets it whatever else is served), and the end of each gives back the
// cap of what is left.
func TestServeInlineNaps(t *testing.T) {
	l := loadLibrary(t, "shm")
	e := openIdle(t, l)
	if got := e.MaxNap(); got != idleMaxNap {
		t.Fatalf("idle: naps up to %v, want %v", got, idleMaxNap)
	}
	endInline := e.ServeInline(time.Now().Add(time.Hour))
	if got := e.MaxNap(); got != inlineServeMaxNap || !e.Serving() {
		t.Fatalf("ServeInline: naps up to %v (serving %v), want %v", got, e.Serving(), inlineServeMaxNap)
	}
	endServe := e.Serve(time.Now().Add(time.Hour))
	if got := e.MaxNap(); got != servingMaxNap {
		t.Fatalf("Serve beside ServeInline: naps up to %v, want %v", got, servingMaxNap)
	}
	endServe()
	if got := e.MaxNap(); got != inlineServeMaxNap {
		t.Fatalf("Serve ended, ServeInline live: naps up to %v, want %v", got, inlineServeMaxNap)
	}
	endServe2 := e.Serve(time.Now().Add(time.Hour))
	endInline()
	if got := e.MaxNap(); got != servingMaxNap {
		t.Fatalf("ServeInline ended, Serve live: naps up to %v, want %v", got, servingMaxNap)
	}
	endServe2()
	if got := e.MaxNap(); got != idleMaxNap || e.Serving() {
		t.Fatalf("all ended: naps up to %v (serving %v), want %v", got, e.Serving(), idleMaxNap)
	}
	// A ServeInline whose term has passed serves no more.
	defer e.ServeInline(time.Now().Add(-time.Second))()
	if got := e.MaxNap(); got != idleMaxNap {
		t.Fatalf("a ServeInline past its term: naps up to %v, want %v", got, idleMaxNap)
	}
}

// A holder that serves only with ServeInline still serves, at its longer
// naps, a reader that needs its progress (shm with FI_HMEM: the holder
// copies every read), and serves it with a Serve that begins during the
// reads: every byte arrives, with a deadline far past what either takes.
func TestServeInlineStillServesProgressReaders(t *testing.T) {
	l, err := Load(Config{Provider: "shm"})
	if err != nil {
		t.Fatalf("libfabric (make test-deps): %v", err)
	}
	t.Cleanup(func() { l.Close() })
	offered, err := l.Providers()
	if err != nil {
		t.Fatal(err)
	}
	if p, err := Choose(offered, "shm"); err != nil || !p.HMEM {
		t.Skipf("shm without FI_HMEM here (%+v, %v): its reads by cross-memory attach need no holder", p, err)
	}
	holder, reader := openIdle(t, l), openIdle(t, l)
	t.Cleanup(holder.ServeInline(time.Now().Add(time.Hour)))
	start := time.Now()
	res, err := readShape(t, holder, reader, 64, 5)
	if err != nil {
		t.Fatalf("read under ServeInline alone: %v", err)
	}
	t.Logf("under ServeInline alone: %+v in %v", res, time.Since(start).Round(time.Microsecond))
	if !res.Pending || res.Inline {
		t.Fatalf("a read through the holder's copies: %+v, want pending, not inline", res)
	}
	t.Cleanup(holder.Serve(time.Now().Add(time.Hour)))
	start = time.Now()
	if _, err := readShape(t, holder, reader, 64, 6); err != nil {
		t.Fatalf("read with a Serve beside: %v", err)
	}
	t.Logf("with a Serve beside: %v", time.Since(start).Round(time.Microsecond))
}
