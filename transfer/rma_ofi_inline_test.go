//go:build cgo && linux

package transfer

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/kvfabric/kvfabric/rdma/ofi"
	"github.com/kvfabric/kvfabric/transfer/transferpb"
)

// crossMemoryAttach says whether this process may read memory of a
// process by process_vm_readv, as shm needs for a reader to copy a
// holder's bytes itself.
func crossMemoryAttach() error {
	src, dst := []byte{1}, []byte{0}
	_, err := unix.ProcessVMReadv(os.Getpid(),
		[]unix.Iovec{{Base: &dst[0], Len: 1}},
		[]unix.RemoteIovec{{Base: uintptr(unsafe.Pointer(&src[0])), Len: 1}}, 0)
	return err
}

// A reader over shm host-only says in its lease requests that its reads
// complete inline once a read from the holder has shown it, and the holder
// serves such a lease with ServeInline (naps of a millisecond), through a
// renewal; a lease of a reader that does not say so (one asked for before
// any read, or by a reader that predates the field) is served with
// Serve, whose short naps hold while it is live, whatever else is served.
// Every read's bytes are checked.
func TestOFILeaseSaysReadsInline(t *testing.T) {
	if err := crossMemoryAttach(); err != nil {
		t.Skipf("shm without cross-memory attach (process_vm_readv: %v): reads need the holder", err)
	}
	p := newOFIPair(t, "shm", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tp := p.holder.rdma.tp.(*ofiTransport)
	ep, _ := tp.endpoint()
	reader := p.peer.rdma.tp.(*ofiPeer)
	served := func(id uint64) servedLease {
		t.Helper()
		tp.mu.Lock()
		defer tp.mu.Unlock()
		l, ok := tp.served[leaseKey{p.reader.cfg.NodeName, id}]
		if !ok {
			t.Fatalf("lease %d not served", id)
		}
		return l
	}
	wantNap := func(when string, want time.Duration) {
		t.Helper()
		if got := ep.MaxNap(); got != want {
			t.Fatalf("%s: the holder naps up to %v, want %v", when, got, want)
		}
	}
	read := func(id uint64) {
		t.Helper()
		for _, d := range p.dst {
			clear(d)
		}
		if via, err := p.peer.ReadVia(ctx, id, 7, p.segs, p.dst); err != nil || via != TransportRDMA {
			t.Fatalf("read: over %s, %v; want rdma", via, err)
		}
		p.checkBytes(t)
	}

	if reader.readsInline() {
		t.Fatal("reads inline before any read")
	}
	first, err := p.peer.Lease(ctx, []uint64{2}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if served(first.ID).inline {
		t.Fatal("a lease asked for before any read is served inline")
	}
	wantNap("a lease asked for before any read", 50*time.Microsecond)
	read(first.ID)
	if !reader.readsInline() {
		t.Fatal("a read by cross-memory attach left the reader not saying it reads inline")
	}
	if _, err := p.peer.Release(ctx, first.ID); err != nil {
		t.Fatal(err)
	}

	second, err := p.peer.Lease(ctx, []uint64{2}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if !served(second.ID).inline {
		t.Fatal("a lease of a reader that reads inline is not served inline")
	}
	wantNap("only a lease read inline", time.Millisecond)
	if _, err := p.peer.Renew(ctx, second.ID, time.Minute); err != nil {
		t.Fatal(err)
	}
	if !served(second.ID).inline {
		t.Fatal("a renewed lease read inline is no longer served inline")
	}
	read(second.ID)

	// Another reader's lease that predates reads_inline, beside it (the
	// test's handler gives every lease one ID: the holder is told of it
	// directly).
	tp.answer("older", false, &transferpb.LeaseResponse{LeaseId: 1, DurationMs: 60_000})
	wantNap("an older reader's lease beside one read inline", 50*time.Microsecond)
	read(second.ID)
	tp.leaseEnded("older", 1)
	wantNap("the older reader's lease ended", time.Millisecond)
	if _, err := p.peer.Release(ctx, second.ID); err != nil {
		t.Fatal(err)
	}
	wantNap("no lease", 10*time.Millisecond)

	// The reader, predating reads_inline, asks with no such field.
	var old transferpb.LeaseResponse
	req := &transferpb.LeaseRequest{Hashes: []uint64{2}, DurationMs: 60_000, Rdma: true, Rma: p.reader.rdma.tp.kind()}
	if err := p.peer.call(ctx, methodLease, req, &old); err != nil {
		t.Fatal(err)
	}
	if len(old.OfiName) == 0 || served(old.LeaseId).inline {
		t.Fatalf("an older reader's lease: endpoint name of %d bytes, served inline %v; want a name, not inline", len(old.OfiName), served(old.LeaseId).inline)
	}
	wantNap("an older reader's lease", 50*time.Microsecond)
	if err := p.peer.keepRegions(old.LeaseId, &Lease{ID: old.LeaseId, LayoutDigests: old.LayoutDigests}, old.RdmaRegions); err != nil {
		t.Fatal(err)
	}
	read(old.LeaseId)
	if _, err := p.peer.Release(ctx, old.LeaseId); err != nil {
		t.Fatal(err)
	}
	wantNap("no lease", 10*time.Millisecond)
}

// A reader's claim follows its reads from the holder: a read that
// completed inline makes it, one that waited for progress or failed ends
// it, one of a single request leaves it as it was; it holds only on the
// endpoint the read was on, and not past a new endpoint name of the
// holder's.
func TestOFIReadsInlineFollowsReads(t *testing.T) {
	ep := openOFI(t, "shm")
	other := openOFI(t, "shm")
	n := &Node{}
	tp := newOFITransport(n, ep)
	v := &ofiPeer{t: tp, p: &Peer{n: n, name: "holder"}}
	inline := ofi.ReadResult{Requests: 64, Inline: true}
	steps := []struct {
		name string
		ep   *ofi.Endpoint
		res  ofi.ReadResult
		err  error
		want bool
	}{
		{"inline", ep, inline, nil, true},
		{"one request", ep, ofi.ReadResult{Requests: 1}, nil, true},
		{"waited for progress", ep, ofi.ReadResult{Requests: 64, Pending: true}, nil, false},
		{"inline again", ep, inline, nil, true},
		{"failed", ep, ofi.ReadResult{Requests: 3}, errors.New("completion error"), false},
		{"inline on another endpoint", other, inline, nil, false},
		{"inline on this one", ep, inline, nil, true},
	}
	for _, s := range steps {
		v.readWas(s.ep, s.res, s.err)
		if got := v.readsInline(); got != s.want {
			t.Fatalf("after a read %s: reads inline %v, want %v", s.name, got, s.want)
		}
	}
	if err := v.answered(&transferpb.LeaseResponse{OfiName: []byte("a new name")}); err != nil {
		t.Fatal(err)
	}
	if v.readsInline() {
		t.Fatal("reads inline from a holder whose endpoint name changed, before any read from it")
	}
}

// A lease request's reads_inline reaches the holder as sent, and one that
// leaves it out (an older reader's) decodes as false.
func TestLeaseRequestReadsInlineDecodes(t *testing.T) {
	for _, c := range []struct {
		name string
		req  *transferpb.LeaseRequest
		want bool
	}{
		{"set", &transferpb.LeaseRequest{Hashes: []uint64{1}, DurationMs: 1000, Rdma: true, Rma: "ofi:shm", ReadsInline: true}, true},
		{"unset", &transferpb.LeaseRequest{Hashes: []uint64{1}, DurationMs: 1000, Rdma: true, Rma: "ofi:shm"}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			payload, err := proto.Marshal(c.req)
			if err != nil {
				t.Fatal(err)
			}
			r, err := decodeRequest(methodLease, payload, 0)
			if err != nil {
				t.Fatal(err)
			}
			if r.readsInline != c.want || r.rma != "ofi:shm" || !r.rdma {
				t.Fatalf("decoded reads_inline %v, rma %q, rdma %v; want %v, ofi:shm, true", r.readsInline, r.rma, r.rdma, c.want)
			}
		})
	}
}
