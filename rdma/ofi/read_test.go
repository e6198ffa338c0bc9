//go:build cgo && linux

package ofi

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/kvfabric/kvfabric/internal/kvtest"
)

// providers are the libfabric providers on every Debian machine that offer
// RMA reads on RDM endpoints without hardware.
var providers = []string{"tcp", "shm"}

func TestReadEveryByte(t *testing.T) {
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			l := loadLibrary(t, prov)
			holder, reader := openEndpoint(t, l), openEndpoint(t, l)
			if got := holder.Info().Base(); got != prov {
				t.Fatalf("provider %q, want %q", got, prov)
			}
			src := mapped(t, 8<<20)
			fill(src, 0x5a)
			srcReg := register(t, holder, src)
			dst := mapped(t, 8<<20)
			dstReg := register(t, reader, dst)
			peer, err := reader.AddPeer(holder.Name())
			if err != nil {
				t.Fatal(err)
			}
			seed := uint64(time.Now().UnixNano())
			rng := rand.New(rand.NewPCG(seed, 1))
			for round := range 5 {
				clear(dst)
				// Random segments, some adjacent in the holder's memory
				// and scattered locally, some large.
				var segs []Segment
				used := map[uint64]bool{}
				for range 1 + rng.IntN(40) {
					n := uint64(1 + rng.IntN(300<<10))
					lo := uint64(rng.IntN(len(dst)-int(n)+1)) &^ 0xfff
					if used[lo] {
						continue
					}
					used[lo] = true
					ro := uint64(rng.IntN(len(src) - int(n) + 1))
					segs = append(segs, Segment{LocalOff: lo, RemoteOff: ro, Len: n, Remote: srcReg.Remote()})
				}
				segs = nonOverlapping(segs)
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				err := reader.Read(ctx, peer, dstReg, segs)
				cancel()
				if err != nil {
					t.Fatalf("seed %d round %d: %v", seed, round, err)
				}
				for i, s := range segs {
					if !bytes.Equal(dst[s.LocalOff:s.LocalOff+s.Len], src[s.RemoteOff:s.RemoteOff+s.Len]) {
						t.Fatalf("seed %d round %d segment %d (%+v): bytes differ", seed, round, i, s)
					}
				}
			}
			if st := reader.Stats(); st.Reads != 5 || st.Failures != 0 {
				t.Fatalf("stats %+v, want 5 reads and no failure", st)
			}
		})
	}
}

// nonOverlapping drops segments whose local range overlaps an earlier one,
// so that each byte of the destination has one expected value.
func nonOverlapping(segs []Segment) []Segment {
	var out []Segment
next:
	for _, s := range segs {
		for _, o := range out {
			if s.LocalOff < o.LocalOff+o.Len && o.LocalOff < s.LocalOff+s.Len {
				continue next
			}
		}
		out = append(out, s)
	}
	return out
}

// TestReadScatter reads one run of the holder's memory into pieces far
// apart locally: the gathered requests carry local scatter lists.
func TestReadScatter(t *testing.T) {
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			l := loadLibrary(t, prov)
			holder, reader := openEndpoint(t, l), openEndpoint(t, l)
			src := mapped(t, 1<<20)
			fill(src, 3)
			srcReg := register(t, holder, src)
			dst := mapped(t, 4<<20)
			dstReg := register(t, reader, dst)
			peer, err := reader.AddPeer(holder.Name())
			if err != nil {
				t.Fatal(err)
			}
			var segs []Segment
			for i := range 64 {
				segs = append(segs, Segment{LocalOff: uint64(i) * 64 << 10, RemoteOff: uint64(i) * 4096, Len: 4096, Remote: srcReg.Remote()})
			}
			if reqs := gather(segs, holder.Info().MaxMsgSize, min(holder.Info().IOVLimit, 8)); holder.Info().IOVLimit > 1 && len(reqs) >= len(segs) {
				t.Fatalf("%d segments contiguous in the holder's memory gathered into %d requests with an iov limit of %d",
					len(segs), len(reqs), holder.Info().IOVLimit)
			}
			if err := reader.Read(context.Background(), peer, dstReg, segs); err != nil {
				t.Fatal(err)
			}
			for i, s := range segs {
				if !bytes.Equal(dst[s.LocalOff:s.LocalOff+s.Len], src[s.RemoteOff:s.RemoteOff+s.Len]) {
					t.Fatalf("segment %d differs", i)
				}
			}
		})
	}
}

// TestReadRefusals: what a NIC refuses, the provider refuses too, and the
// read ends in a clear error within its deadline and the flush grace, never
// a hang. tcp answers with an error completion; shm 1.17 never completes a
// read with a wrong key, so the grace runs out and the endpoint is closed.
// Either way a reader endpoint opened afterwards reads again.
func TestReadRefusals(t *testing.T) {
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			const grace = time.Second
			l, err := Load(Config{Provider: prov, Node: nodeFor(prov), FlushGrace: grace})
			if err != nil {
				t.Fatalf("libfabric is needed for these tests (make test-deps): %v", err)
			}
			t.Cleanup(func() { l.Close() })
			holder := openEndpoint(t, l)
			src := mapped(t, 1<<20)
			fill(src, 9)
			srcReg := register(t, holder, src)
			dst := mapped(t, 1<<20)
			wrongKey := srcReg.Remote()
			wrongKey.Key ^= 0x5a5a
			// The holder registered 64 KiB less than it announces.
			short := mapped(t, 1<<20)
			shortReg := register(t, holder, short[:1<<20-64<<10])
			long := shortReg.Remote()
			long.Len = 1 << 20
			for _, c := range []struct {
				name string
				seg  Segment
			}{
				{"wrong key", Segment{Len: 4096, Remote: wrongKey}},
				{"registration too short", Segment{RemoteOff: 1<<20 - 4096, Len: 4096, Remote: long}},
			} {
				reader := openEndpoint(t, l)
				dstReg := register(t, reader, dst)
				peer, err := reader.AddPeer(holder.Name())
				if err != nil {
					t.Fatal(err)
				}
				const deadline = 5 * time.Second
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				start := time.Now()
				err = reader.Read(ctx, peer, dstReg, []Segment{c.seg})
				took := time.Since(start)
				cancel()
				if !errors.Is(err, ErrCompletion) && !errors.Is(err, ErrClosed) {
					t.Errorf("%s: %v, want ErrCompletion, or ErrClosed after the grace", c.name, err)
				}
				if took > deadline+grace+10*time.Second {
					t.Errorf("%s: failed after %v, past the deadline %v and grace %v", c.name, took, deadline, grace)
				}
				t.Logf("%s: %v (in %v)", c.name, err, took.Round(time.Millisecond))
			}
			// A reader opened afterwards reads the holder whole. Over tcp
			// the holder's side of the refused connection may still be
			// closing: the first attempt may fail with an error completion.
			reader := openEndpoint(t, l)
			dstReg := register(t, reader, dst)
			peer, err := reader.AddPeer(holder.Name())
			if err != nil {
				t.Fatal(err)
			}
			seg := Segment{Len: 1 << 20, Remote: srcReg.Remote()}
			for attempt := 1; ; attempt++ {
				err := reader.Read(context.Background(), peer, dstReg, []Segment{seg})
				if err == nil {
					break
				}
				if attempt == 3 || !errors.Is(err, ErrCompletion) {
					t.Fatalf("a good read after refusals, attempt %d: %v", attempt, err)
				}
			}
			if !bytes.Equal(dst, src) {
				t.Fatal("a good read after refusals: bytes differ")
			}
		})
	}
}

// TestReadChecksBeforePosting: segments outside either region are refused
// before anything reaches the provider, at the limit and one past.
func TestReadChecksBeforePosting(t *testing.T) {
	l := loadLibrary(t, "shm")
	holder, reader := openEndpoint(t, l), openEndpoint(t, l)
	src := mapped(t, 64<<10)
	srcReg := register(t, holder, src)
	dst := mapped(t, 64<<10)
	dstReg := register(t, reader, dst)
	peer, err := reader.AddPeer(holder.Name())
	if err != nil {
		t.Fatal(err)
	}
	rem := srcReg.Remote()
	n := uint64(64 << 10)
	for _, c := range []struct {
		seg Segment
		ok  bool
	}{
		{Segment{LocalOff: 0, Len: n, Remote: rem}, true},
		{Segment{LocalOff: 1, Len: n, Remote: rem}, false},
		{Segment{RemoteOff: 1, Len: n, Remote: rem}, false},
		{Segment{RemoteOff: n - 1, Len: 1, Remote: rem}, true},
		{Segment{RemoteOff: n, Len: 1, Remote: rem}, false},
		{Segment{Len: 0, Remote: rem}, false},
	} {
		err := reader.Read(context.Background(), peer, dstReg, []Segment{c.seg})
		if c.ok && err != nil {
			t.Errorf("%+v: %v", c.seg, err)
		}
		if !c.ok && !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%+v: %v, want ErrInvalidArgument", c.seg, err)
		}
	}
	if _, err := reader.AddPeer(make([]byte, MaxNameLen+1)); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("a name of %d bytes: %v, want ErrInvalidArgument", MaxNameLen+1, err)
	}
	other := openEndpoint(t, l)
	if err := other.Read(context.Background(), peer, dstReg, []Segment{{Len: 1, Remote: rem}}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("a read into another endpoint's region: %v, want ErrInvalidArgument", err)
	}
}

func TestProvidersAndChoice(t *testing.T) {
	l := loadLibrary(t, "")
	offered, err := l.Providers()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range offered {
		names = append(names, p.Provider)
		// The endpoint calls the provider from its progress loop and from
		// every Read with no lock of its own.
		if !p.ThreadSafe {
			t.Errorf("%s on %s is listed without FI_THREAD_SAFE, which fi_getinfo was asked for", p.Provider, p.Domain)
		}
	}
	for _, want := range providers {
		p, err := Choose(offered, want)
		if err != nil {
			t.Fatalf("choose %s among %v: %v", want, names, err)
		}
		if _, err := p.MRMode.Plan(); err != nil {
			t.Fatalf("%s: %v", p.Provider, err)
		}
	}
	// Nothing here is a hardware fabric, and tcp and shm are never chosen
	// unless named.
	if p, err := Choose(offered, ""); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("choose among %v with no name: %s, %v; want ErrUnavailable", names, p.Provider, err)
	}
}

func TestEndpointClose(t *testing.T) {
	l := loadLibrary(t, "shm")
	e := openEndpoint(t, l)
	b := mapped(t, 4096)
	r := register(t, e, b)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := r.Close(); err != nil {
		t.Fatalf("a region closed with its endpoint: %v", err)
	}
	if _, err := e.Register(uintptr(1<<20), 4096); !errors.Is(err, ErrClosed) {
		t.Fatalf("register after Close: %v, want ErrClosed", err)
	}
	if err := e.Read(context.Background(), Peer{}, r, []Segment{{Len: 1, Remote: Remote{Len: 1}}}); !errors.Is(err, ErrClosed) {
		t.Fatalf("read after Close: %v, want ErrClosed", err)
	}
}

// TestReadStaged: over a provider that stages reads (tcp), concurrent reads
// of small pieces scattered locally go through staging, more requests at
// once than it has slots, and every byte lands where it belongs; a staged
// read that fails gives its slots back, and the endpoint's next read, from
// another holder, goes through them in full. Over
// one that does not stage (shm), the same reads are in place.
func TestReadStaged(t *testing.T) {
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			l := loadLibrary(t, prov)
			holder, reader := openEndpoint(t, l), openEndpoint(t, l)
			const readers, each, piece = 4, 4 << 20, 4096
			src := mapped(t, readers*each)
			fill(src, 5)
			srcReg := register(t, holder, src)
			peer, err := reader.AddPeer(holder.Name())
			if err != nil {
				t.Fatal(err)
			}
			// Reader k reads the k-th part of the holder's memory into
			// every other piece of its own region.
			scattered := func(from uint64, n int, rem Remote) []Segment {
				var segs []Segment
				for i := range uint64(n) {
					segs = append(segs, Segment{LocalOff: 2 * i * piece, RemoteOff: from + i*piece, Len: piece, Remote: rem})
				}
				return segs
			}
			dsts := make([][]byte, readers)
			regs := make([]*Region, readers)
			for k := range readers {
				dsts[k] = mapped(t, 2*each)
				regs[k] = register(t, reader, dsts[k])
			}
			var wg sync.WaitGroup
			errs := make([]error, readers)
			for k := range readers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs[k] = reader.Read(context.Background(), peer, regs[k], scattered(uint64(k)*each, each/piece, srcReg.Remote()))
				}()
			}
			wg.Wait()
			for k := range readers {
				if errs[k] != nil {
					t.Fatalf("read %d: %v", k, errs[k])
				}
				for i := range each / piece {
					got := dsts[k][2*i*piece : (2*i+1)*piece]
					if want := src[k*each+i*piece : k*each+(i+1)*piece]; !bytes.Equal(got, want) {
						t.Fatalf("read %d, piece %d differs", k, i)
					}
					if gap := dsts[k][(2*i+1)*piece : (2*i+2)*piece]; !bytes.Equal(gap, make([]byte, piece)) {
						t.Fatalf("read %d: the gap after piece %d was written", k, i)
					}
				}
			}
			staged := reader.Stats().Staged
			if !reader.Info().StagesReads() {
				if staged != 0 {
					t.Fatalf("%d requests staged by %s, which does not stage", staged, reader.Info().Provider)
				}
				return
			}
			if want := uint64(readers * each / stageSlotBytes); staged < want {
				t.Fatalf("%d requests staged, want %d or more (%d bytes in %d-byte pieces, %d-byte slots)", staged, want, readers*each, piece, stageSlotBytes)
			}
			if n := len(reader.stageFree); n != stageSlots {
				t.Fatalf("%d staging slots free after the reads, want all %d", n, stageSlots)
			}

			// A staged read with a wrong key fails, and gives its slots
			// back.
			failing := openEndpoint(t, l)
			dst := mapped(t, 2*each)
			dstReg := register(t, failing, dst)
			fpeer, err := failing.AddPeer(holder.Name())
			if err != nil {
				t.Fatal(err)
			}
			wrong := srcReg.Remote()
			wrong.Key ^= 0x5a5a
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := failing.Read(ctx, fpeer, dstReg, scattered(0, each/piece, wrong)); !errors.Is(err, ErrCompletion) {
				t.Fatalf("a staged read with a wrong key: %v, want ErrCompletion", err)
			}
			if failing.Stats().Staged == 0 {
				t.Fatal("the read with a wrong key was not staged")
			}
			if n := len(failing.stageFree); n != stageSlots {
				t.Fatalf("%d staging slots free after a failed read, want all %d", n, stageSlots)
			}
			// The same endpoint, its slots back, reads a holder it has no
			// broken connection to (tcp closes the one to the first after
			// the refusal, and may be closing it for a while).
			other := openEndpoint(t, l)
			otherReg := register(t, other, src)
			opeer, err := failing.AddPeer(other.Name())
			if err != nil {
				t.Fatal(err)
			}
			for attempt := 1; ; attempt++ {
				err := failing.Read(ctx, opeer, dstReg, scattered(each, each/piece, otherReg.Remote()))
				if err == nil {
					break
				}
				if attempt == 3 || !errors.Is(err, ErrCompletion) {
					t.Fatalf("a good staged read after a failed one, attempt %d: %v", attempt, err)
				}
			}
			for i := range each / piece {
				if !bytes.Equal(dst[2*i*piece:(2*i+1)*piece], src[each+i*piece:each+(i+1)*piece]) {
					t.Fatalf("a good staged read after a failed one: piece %d differs", i)
				}
			}
		})
	}
}

// A staged request that completes after its endpoint closed (another read
// gave up and closed it, or Close) cannot be copied out: its staging is
// unmapped. The copy says so, and the read it belongs to fails, rather
// than return with its destination unwritten.
func TestStagedCopyAfterClose(t *testing.T) {
	l := loadLibrary(t, "tcp")
	e := openIdle(t, l)
	if e.staging() == nil {
		t.Fatalf("no staging: %v", e.stageErr)
	}
	dst := mapped(t, 4096)
	c := &stagedCopy{slot: <-e.stageFree, dst: uintptr(unsafe.Pointer(&dst[0])), pieces: []piece{{off: 0, len: 4096}}}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.copyOut(c); !errors.Is(err, ErrClosed) {
		t.Fatalf("copy out after Close: %v, want ErrClosed", err)
	}
}

// TestReadTakesItsCompletions: a Read takes its completions from the queue
// itself, in the call that posts its requests, wherever the provider
// completes them within that call: over shm by cross-memory attach
// (host-only), every request of concurrent reads of scattered pieces is
// taken inline, none by the progress loop, and every byte lands where it
// belongs. Over tcp, where completions come later, no more are counted
// inline than were posted, and the bytes are as right.
func TestReadTakesItsCompletions(t *testing.T) {
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			l, err := Load(Config{Provider: prov, Node: nodeFor(prov), HostOnly: true})
			if err != nil {
				t.Fatalf("libfabric (make test-deps): %v", err)
			}
			t.Cleanup(func() { l.Close() })
			holder, reader := openEndpoint(t, l), openEndpoint(t, l)
			const readers, each, piece = 2, 1 << 20, 8192
			src := mapped(t, readers*each)
			fill(src, 9)
			srcReg := register(t, holder, src)
			peer, err := reader.AddPeer(holder.Name())
			if err != nil {
				t.Fatal(err)
			}
			dsts := make([][]byte, readers)
			segs := make([][]Segment, readers)
			var requests int
			iovLimit := min(max(reader.Info().IOVLimit, 1), 8)
			for k := range readers {
				dsts[k] = mapped(t, 2*each)
				for i := range uint64(each / piece) {
					segs[k] = append(segs[k], Segment{LocalOff: 2 * i * piece, RemoteOff: uint64(k*each) + i*piece, Len: piece, Remote: srcReg.Remote()})
				}
				requests += len(gather(segs[k], reader.Info().MaxMsgSize, iovLimit))
			}
			var wg sync.WaitGroup
			errs := make([]error, readers)
			for k := range readers {
				reg := register(t, reader, dsts[k])
				wg.Add(1)
				go func() {
					defer wg.Done()
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					defer cancel()
					errs[k] = reader.Read(ctx, peer, reg, segs[k])
				}()
			}
			wg.Wait()
			for k := range readers {
				if errs[k] != nil {
					t.Fatalf("read %d: %v", k, errs[k])
				}
				for i := range each / piece {
					if got, want := dsts[k][2*i*piece:(2*i+1)*piece], src[k*each+i*piece:k*each+(i+1)*piece]; !bytes.Equal(got, want) {
						t.Fatalf("read %d, piece %d differs", k, i)
					}
				}
			}
			st := reader.Stats()
			switch {
			case reader.Info().StagesReads():
				// Staged requests are fewer than gathered ones.
				if st.Inline > uint64(requests) {
					t.Fatalf("%d completions taken inline, more than the %d requests posted", st.Inline, requests)
				}
			case prov == "shm" && st.Inline != uint64(requests):
				if err := kvtest.CrossMemoryAttach(); err != nil {
					t.Skipf("shm without cross-memory attach (process_vm_readv: %v): the holder copies, and its loop may take completions", err)
				}
				t.Fatalf("%d of %d completions taken by the reads themselves over shm host-only, want all", st.Inline, requests)
			}
			t.Logf("%s: %d of at most %d completions taken inline", prov, st.Inline, requests)
		})
	}
}

// TestPostingReadLeavesLoopAsleep: over shm by cross-memory attach, a Read
// takes every completion itself as it posts, so the progress loop of a
// reader that serves nobody keeps its idle naps (idleMaxNap) through the
// read: it naps at most a few times per idleMaxNap of the read's length,
// where napping at hotMaxNap while a read was under way came to tens per
// millisecond. The read's bytes are checked.
func TestPostingReadLeavesLoopAsleep(t *testing.T) {
	if err := kvtest.CrossMemoryAttach(); err != nil {
		t.Skipf("shm without cross-memory attach (process_vm_readv: %v): the holder copies, and the reader waits on its loop", err)
	}
	l, err := Load(Config{Provider: "shm", HostOnly: true})
	if err != nil {
		t.Fatalf("libfabric (make test-deps): %v", err)
	}
	t.Cleanup(func() { l.Close() })
	holder, reader := openEndpoint(t, l), openIdle(t, l)
	const size, piece = 32 << 20, 8192
	src := mapped(t, size)
	fill(src, 5)
	srcReg := register(t, holder, src)
	dst := mapped(t, 2*size)
	dstReg := register(t, reader, dst)
	peer, err := reader.AddPeer(holder.Name())
	if err != nil {
		t.Fatal(err)
	}
	var segs []Segment
	for i := range uint64(size / piece) {
		segs = append(segs, Segment{LocalOff: 2 * i * piece, RemoteOff: i * piece, Len: piece, Remote: srcReg.Remote()})
	}
	// A first read connects to the holder; the loop settles after it.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := reader.Read(ctx, peer, dstReg, segs[:1]); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	inline0, naps0, start := reader.Stats().Inline, reader.naps.Load(), time.Now()
	if err := reader.Read(ctx, peer, dstReg, segs); err != nil {
		t.Fatal(err)
	}
	took, naps, inline := time.Since(start), reader.naps.Load()-naps0, reader.Stats().Inline-inline0
	for i := range size / piece {
		if !bytes.Equal(dst[2*i*piece:(2*i+1)*piece], src[i*piece:(i+1)*piece]) {
			t.Fatalf("piece %d differs", i)
		}
	}
	requests := uint64(len(gather(segs, reader.Info().MaxMsgSize, min(max(reader.Info().IOVLimit, 1), 8))))
	t.Logf("a read of %d requests in %v: %d taken inline, %d naps of the reader's loop", requests, took.Round(time.Microsecond), inline, naps)
	if inline != requests {
		t.Fatalf("%d of %d completions taken by the read itself, want all", inline, requests)
	}
	if bound := 4 + 4*uint64(took/idleMaxNap); naps > bound {
		t.Fatalf("the reader's loop napped %d times during a read of %v that waited on it for nothing, want at most %d", naps, took.Round(time.Microsecond), bound)
	}
}
