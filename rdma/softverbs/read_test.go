package softverbs_test

import (
	"testing"
	"time"
)

// A READ with a scatter list moves the holder's bytes into three separate
// pieces of the reader's buffer, byte-exact, in one request.
func TestReadScatterListByteExact(t *testing.T) {
	w := newWorld(t)
	holder, reader := w.pair(pairOpts{})
	src := holder.ok("buf src %d 7", 1<<20)
	reader.ok("buf dst %d 0", 1<<20)
	const roff = 12345
	pieces := [][2]int{{0, 1000}, {5000, 300000}, {400000, 100}}
	sge, total := "", 0
	for i, p := range pieces {
		if i > 0 {
			sge += ","
		}
		sge += "dst:" + itoa(p[0]) + ":" + itoa(p[1])
		total += p[1]
	}
	reader.ok("post wrid=42 sig=1 rkey=%s raddr=%d sge=%s", src["rkey"], atoi(t, src["addr"])+roff, sge)
	got := reader.expect(5*time.Second, completion{wrID: 42, status: wcSuccess})
	if got[0].byteLen != uint32(total) {
		t.Fatalf("byte_len %d, want %d", got[0].byteLen, total)
	}
	soff := roff
	for _, p := range pieces {
		reader.ok("check dst %d %d 7 %d", p[0], p[1], soff)
		soff += p[1]
	}
	// Bytes between the pieces are untouched.
	reader.ok("check dst 1000 4000 0 0")
	reader.ok("check dst 305000 95000 0 0")
}

// Each check a NIC makes before and while executing a READ produces the
// status a NIC gives, and the QP then moves to ERR.
func TestReadChecksGiveStatuses(t *testing.T) {
	const size = 1 << 16
	cases := []struct {
		name string
		opts pairOpts
		// holderAccess: access flags of the holder's region
		holderAccess int
		// readerAccess: access flags of the reader's local region
		readerAccess int
		// post builds the request from the holder's region (rkey, addr)
		// and the reader's (lkey, rkey).
		post func(rkey, addr, lkey, ownRkey int) string
		want int
		// checkOff: where in the reader's region the first 16 bytes landed
		checkOff int
	}{
		{
			name: "whole region, at its end",
			post: func(rkey, addr, _, _ int) string { return postf(rkey, addr, "dst:0:%d", size) },
			want: wcSuccess,
		},
		{
			name: "range one byte past the region's end",
			post: func(rkey, addr, _, _ int) string { return postf(rkey, addr+1, "dst:0:%d", size) },
			want: wcRemAccess,
		},
		{
			name: "range starting before the region",
			post: func(rkey, addr, _, _ int) string { return postf(rkey, addr-1, "dst:0:16") },
			want: wcRemAccess,
		},
		{
			name: "unknown rkey",
			post: func(rkey, addr, _, _ int) string { return postf(rkey+1000000, addr, "dst:0:16") },
			want: wcRemAccess,
		},
		{
			name: "rkey registered by the reader, not the connected peer",
			post: func(_, addr, _, own int) string { return postf(own, addr, "dst:0:16") },
			want: wcRemAccess,
		},
		{
			name: "the holder's lkey used as rkey",
			post: func(rkey, addr, _, _ int) string { return postf(rkey-1, addr, "dst:0:16") },
			want: wcRemAccess,
		},
		{
			name:         "holder region without remote read",
			holderAccess: accessLocalWrite,
			post:         func(rkey, addr, _, _ int) string { return postf(rkey, addr, "dst:0:16") },
			want:         wcRemAccess,
		},
		{
			name: "unknown local lkey",
			post: func(rkey, addr, lkey, _ int) string { return postf(rkey, addr, "dst:0:16:%d", lkey+1000000) },
			want: wcLocProtErr,
		},
		{
			name:         "local region without local write",
			readerAccess: accessRemoteRead,
			post:         func(rkey, addr, _, _ int) string { return postf(rkey, addr, "dst:0:16") },
			want:         wcLocProtErr,
		},
		{
			name: "local SGE one byte past its region",
			post: func(rkey, addr, _, _ int) string { return postf(rkey, addr, "dst:%d:16", size-15) },
			want: wcLocProtErr,
		},
		{
			name:     "local SGE ending at its region's end",
			post:     func(rkey, addr, _, _ int) string { return postf(rkey, addr, "dst:%d:16", size-16) },
			want:     wcSuccess,
			checkOff: size - 16,
		},
		{
			name: "opcode other than READ",
			post: func(rkey, addr, _, _ int) string { return "op=write " + postf(rkey, addr, "dst:0:16") },
			want: wcLocQPOpErr,
		},
		{
			name: "holder QP without remote read",
			opts: pairOpts{holderConn: "access=0"},
			post: func(rkey, addr, _, _ int) string { return postf(rkey, addr, "dst:0:16") },
			want: wcRemInvReq,
		},
		{
			name: "holder QP with max_dest_rd_atomic 0",
			opts: pairOpts{holderConn: "mdra=0"},
			post: func(rkey, addr, _, _ int) string { return postf(rkey, addr, "dst:0:16") },
			want: wcRemInvReq,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := newWorld(t)
			holder, reader := w.pair(c.opts)
			ha, ra := c.holderAccess, c.readerAccess
			if ha == 0 {
				ha = accessLocalWrite | accessRemoteRead
			}
			if ra == 0 {
				ra = accessLocalWrite | accessRemoteRead
			}
			src := holder.ok("buf src %d 3 access=%d", size, ha)
			dst := reader.ok("buf dst %d 0 access=%d", size, ra)
			reader.ok("post wrid=1 sig=1 %s", c.post(atoi(t, src["rkey"]), atoi(t, src["addr"]), atoi(t, dst["lkey"]), atoi(t, dst["rkey"])))
			reader.expect(5*time.Second, completion{wrID: 1, status: c.want})
			wantState := qpsRTS
			if c.want != wcSuccess {
				wantState = qpsErr
			}
			if st := reader.ok("state")["state"]; st != itoa(wantState) {
				t.Fatalf("QP state %s, want %d", st, wantState)
			}
			if c.want == wcSuccess {
				reader.ok("check dst %d 16 3 0", c.checkOff)
			}
		})
	}
}

func postf(rkey, addr int, sgeFormat string, args ...any) string {
	return "rkey=" + itoa(rkey) + " raddr=" + itoa(addr) + " sge=" + sprintf(sgeFormat, args...)
}

// After an error completion, the requests already queued behind it and any
// posted later complete with WR_FLUSH_ERR, unsignalled ones included.
func TestErrorThenFlush(t *testing.T) {
	w := newWorld(t)
	holder, reader := w.pair(pairOpts{})
	src := holder.ok("buf src 4096 5")
	reader.ok("buf dst 4096 0")
	// One bad request (unknown rkey) and two good unsignalled behind it.
	reader.ok("post wrid=1 sig=1 rkey=%d raddr=%s sge=dst:0:16", atoi(t, src["rkey"])+1000000, src["addr"])
	reader.ok("post wrid=2 sig=0 count=2 rkey=%s raddr=%s sge=dst:0:16", src["rkey"], src["addr"])
	reader.expect(5*time.Second,
		completion{wrID: 1, status: wcRemAccess},
		completion{wrID: 2, status: wcFlushErr},
		completion{wrID: 3, status: wcFlushErr})
	reader.ok("post wrid=9 sig=1 rkey=%s raddr=%s sge=dst:0:16", src["rkey"], src["addr"])
	reader.expect(5*time.Second, completion{wrID: 9, status: wcFlushErr})
	reader.ok("check dst 0 16 0 0")
	// RESET then reconnect makes the QP usable again.
	reader.ok("reset")
	connect(reader, holder, "")
	reader.ok("post wrid=10 sig=1 rkey=%s raddr=%s sge=dst:0:16", src["rkey"], src["addr"])
	reader.expect(5*time.Second, completion{wrID: 10, status: wcSuccess})
	reader.ok("check dst 0 16 5 0")
}

// Not connected back, or addressed at the wrong GID: no response comes, and
// the request fails with RETRY_EXC_ERR after the QP's timeout.
func TestUnreachablePeerRetryExceeded(t *testing.T) {
	for _, c := range []struct {
		name string
		wire func(w *world) (holder, reader *endpoint)
	}{
		{"holder connected to another QP", func(w *world) (*endpoint, *endpoint) {
			holder := w.open("holder", "")
			reader := w.open("reader", "")
			holder.ok("connect 1 %s", reader.gid)
			connect(reader, holder, "timeout=10 retry=1")
			return holder, reader
		}},
		{"wrong GID", func(w *world) (*endpoint, *endpoint) {
			holder := w.open("holder", "")
			reader := w.open("reader", "")
			connect(holder, reader, "")
			reader.ok("connect %s 00000000000000000000ffff0a0b0c0d timeout=10 retry=1", holder.qpn)
			return holder, reader
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newWorld(t)
			holder, reader := c.wire(w)
			src := holder.ok("buf src 4096 5")
			reader.ok("buf dst 4096 0")
			reader.ok("post wrid=1 sig=1 rkey=%s raddr=%s sge=dst:0:16", src["rkey"], src["addr"])
			reader.expect(5*time.Second, completion{wrID: 1, status: wcRetryExc})
		})
	}
}
