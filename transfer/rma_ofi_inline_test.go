//go:build cgo && linux

package transfer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/kvfabric/kvfabric/internal/kvtest"
	"github.com/kvfabric/kvfabric/rdma/ofi"
	"github.com/kvfabric/kvfabric/transfer/transferpb"
)

// A reader over shm host-only says in its lease requests that its reads
// complete inline once a read from the holder has shown it, and the holder
// serves such a lease with ServeInline (naps of a millisecond), through a
// renewal that says so again; a lease of a reader that does not say so
// (one asked for before any read, or by a reader that predates the field),
// a renewal that no longer says so, and a claim naming an endpoint the
// holder no longer has (a restart) are served with Serve, whose short naps
// hold while it is live, whatever else is served. Every read's bytes are
// checked.
func TestOFILeaseSaysReadsInline(t *testing.T) {
	if err := kvtest.CrossMemoryAttach(); err != nil {
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

	if reader.readsInline() != nil {
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
	if at := reader.readsInline(); !bytes.Equal(at, ep.Name()) {
		t.Fatalf("a read by cross-memory attach left the reader saying it reads inline against %q, want the holder's endpoint", at)
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

	// Another reader's lease that predates reads_inline_at, beside it (the
	// test's handler gives every lease one ID: the holder is told of it
	// directly), and one whose claim names an endpoint the holder had
	// before a restart.
	for _, c := range []struct {
		peer string
		at   []byte
	}{{"older", nil}, {"restarted", []byte("an endpoint of the holder's before it restarted")}} {
		tp.answer(c.peer, c.at, &transferpb.LeaseResponse{LeaseId: 1, DurationMs: 60_000})
		wantNap(c.peer+" reader's lease beside one read inline", 50*time.Microsecond)
		read(second.ID)
		tp.leaseEnded(c.peer, 1)
		wantNap(c.peer+" reader's lease ended", time.Millisecond)
	}
	// A renewal that no longer says so: served with Serve from then on.
	tp.leaseRenewed(p.reader.cfg.NodeName, second.ID, time.Minute, nil)
	if served(second.ID).inline {
		t.Fatal("a lease renewed without the claim is still served inline")
	}
	wantNap("a lease renewed without the claim", 50*time.Microsecond)
	read(second.ID)
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
	if err := p.peer.keepRegions(old.LeaseId, &Lease{ID: old.LeaseId, LayoutDigests: old.LayoutDigests}, old.RdmaRegions, old.OfiName); err != nil {
		t.Fatal(err)
	}
	read(old.LeaseId)
	if _, err := p.peer.Release(ctx, old.LeaseId); err != nil {
		t.Fatal(err)
	}
	wantNap("no lease", 10*time.Millisecond)
}

// A reader's claim follows its reads from the holder: a read that
// completed inline makes it, naming the holder's endpoint the read was
// from; one that waited for progress or failed ends it; one of a single
// request leaves it as it was. It holds only on the endpoint the read was
// on; an answer with the same endpoint name keeps it, one with a new name
// ends it before any read from that endpoint.
func TestOFIReadsInlineFollowsReads(t *testing.T) {
	ep := openOFI(t, "shm")
	other := openOFI(t, "shm")
	n := &Node{}
	tp := newOFITransport(n, ep)
	v := &ofiPeer{t: tp, p: &Peer{n: n, name: "holder"}}
	if err := v.answered(&transferpb.LeaseResponse{OfiName: []byte("the holder's name")}); err != nil {
		t.Fatal(err)
	}
	holder, before := []byte("the holder's name"), []byte("the holder's name before")
	inline := ofi.ReadResult{Requests: 64, Inline: true}
	steps := []struct {
		name string
		ep   *ofi.Endpoint
		from []byte
		res  ofi.ReadResult
		err  error
		want []byte
	}{
		{"inline", ep, holder, inline, nil, holder},
		{"one request", ep, holder, ofi.ReadResult{Requests: 1}, nil, holder},
		{"waited for progress", ep, holder, ofi.ReadResult{Requests: 64, Pending: true}, nil, nil},
		{"inline again", ep, holder, inline, nil, holder},
		{"failed", ep, holder, ofi.ReadResult{Requests: 3}, errors.New("completion error"), nil},
		{"inline on another endpoint", other, holder, inline, nil, nil},
		{"inline on this one", ep, holder, inline, nil, holder},
		{"inline from the holder's endpoint before", ep, before, inline, nil, before},
		{"inline from the holder's endpoint now", ep, holder, inline, nil, holder},
	}
	for _, s := range steps {
		v.readWas(s.ep, s.from, s.res, s.err)
		if got := v.readsInline(); !bytes.Equal(got, s.want) {
			t.Fatalf("after a read %s: reads inline against %q, want %q", s.name, got, s.want)
		}
	}
	if err := v.answered(&transferpb.LeaseResponse{OfiName: holder}); err != nil {
		t.Fatal(err)
	}
	if got := v.readsInline(); !bytes.Equal(got, holder) {
		t.Fatalf("an answer with the same endpoint name: reads inline against %q, want %q", got, holder)
	}
	if err := v.answered(&transferpb.LeaseResponse{OfiName: []byte("a new name")}); err != nil {
		t.Fatal(err)
	}
	if got := v.readsInline(); got != nil {
		t.Fatalf("reads inline against %q from a holder whose endpoint name changed, before any read from it", got)
	}
}

// A holder honours a claim of inline reads only where it can be true:
// naming its endpoint of now, over shm; not a claim naming another
// endpoint, an empty one, or any claim over tcp, whose reads always need
// the holder's progress.
func TestInlineClaimHonouredOnlyWhereTrue(t *testing.T) {
	shm, tcp := openOFI(t, "shm"), openOFI(t, "tcp")
	for _, c := range []struct {
		name string
		ep   *ofi.Endpoint
		at   []byte
		want bool
	}{
		{"shm, its own name", shm, shm.Name(), true},
		{"shm, no claim", shm, nil, false},
		{"shm, another endpoint's name", shm, tcp.Name(), false},
		{"shm, its name cut short", shm, shm.Name()[:len(shm.Name())-1], false},
		{"tcp, its own name", tcp, tcp.Name(), false},
	} {
		if got := inlineClaim(c.ep, c.at); got != c.want {
			t.Errorf("%s: honoured %v, want %v", c.name, got, c.want)
		}
	}
}

// A lease or renewal request's reads_inline_at reaches the holder as sent,
// up to maxInlineAt bytes; one that leaves it out (an older reader's)
// decodes as empty; one past the limit is refused.
func TestReadsInlineAtDecodes(t *testing.T) {
	name := bytes.Repeat([]byte{7}, maxInlineAt)
	for _, c := range []struct {
		name string
		at   []byte
		ok   bool
	}{
		{"set", []byte("the holder's endpoint"), true},
		{"unset", nil, true},
		{"at the limit", name, true},
		{"past the limit", append(name, 7), false},
	} {
		for _, m := range []method{methodLease, methodRenew} {
			t.Run(fmt.Sprintf("%s/%s", c.name, m), func(t *testing.T) {
				var msg proto.Message = &transferpb.LeaseRequest{Hashes: []uint64{1}, DurationMs: 1000, Rdma: true, Rma: "ofi:shm", ReadsInlineAt: c.at}
				if m == methodRenew {
					msg = &transferpb.RenewRequest{LeaseId: 3, DurationMs: 1000, ReadsInlineAt: c.at}
				}
				payload, err := proto.Marshal(msg)
				if err != nil {
					t.Fatal(err)
				}
				r, err := decodeRequest(m, payload, 0)
				if !c.ok {
					if err == nil || !errors.Is(err, ErrInvalidRequest) {
						t.Fatalf("a claim of %d bytes: %v, want ErrInvalid", len(c.at), err)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(r.inlineAt, c.at) {
					t.Fatalf("decoded reads_inline_at %q, want %q", r.inlineAt, c.at)
				}
			})
		}
	}
	// A reader of the build before reads_inline_at sent a bool claim in
	// field 5 (now reserved): decoded, it claims nothing.
	payload, err := proto.Marshal(&transferpb.LeaseRequest{Hashes: []uint64{1}, DurationMs: 1000, Rdma: true, Rma: "ofi:shm"})
	if err != nil {
		t.Fatal(err)
	}
	payload = protowire.AppendVarint(protowire.AppendTag(payload, 5, protowire.VarintType), 1)
	r, err := decodeRequest(methodLease, payload, 0)
	if err != nil {
		t.Fatalf("a lease request with the old field 5: %v", err)
	}
	if r.inlineAt != nil || r.rma != "ofi:shm" {
		t.Fatalf("a lease request with the old field 5: claim %q, rma %q; want none, ofi:shm", r.inlineAt, r.rma)
	}
}
