package softverbs_test

import (
	"sort"
	"testing"
	"time"
)

// Several QPs per process, two of them completing on one CQ, read from one
// holder at once, byte-exact; destroying one QP drops its completions and
// leaves the other's.
func TestManyQPsShareACQ(t *testing.T) {
	w := newWorld(t)
	holder := w.open("holder", "")
	h := []string{holder.qpn, holder.ok("addqp")["qpn"], holder.ok("addqp")["qpn"]}
	r1 := w.open("r1", "wr=64 cqe=256")
	r1b := r1.ok("addqp")["qpn"]
	r2 := w.open("r2", "wr=64 cqe=256")
	// holder QP 0 <-> r1 QP 0, holder 1 <-> r1 1, holder 2 <-> r2.
	holder.ok("connect %s %s qp=0", r1.qpn, r1.gid)
	holder.ok("connect %s %s qp=1", r1b, r1.gid)
	holder.ok("connect %s %s qp=2", r2.qpn, r2.gid)
	r1.ok("connect %s %s qp=0", h[0], holder.gid)
	r1.ok("connect %s %s qp=1", h[1], holder.gid)
	r2.ok("connect %s %s", h[2], holder.gid)

	const piece = 64 << 10
	src := holder.ok("buf src %d 21", 96*piece)
	r1.ok("buf dst %d 0", 64*piece)
	r2.ok("buf dst %d 0", 32*piece)
	base := atoi(t, src["addr"])
	// r1: wr 0..31 on QP 0 read pieces 0..31, wr 100..131 on QP 1 read
	// pieces 32..63; r2: wr 0..31 read pieces 64..95.
	for i := range 32 {
		r1.ok("post wrid=%d sig=1 rkey=%s raddr=%d sge=dst:%d:%d qp=0", i, src["rkey"], base+i*piece, i*piece, piece)
		r1.ok("post wrid=%d sig=1 rkey=%s raddr=%d sge=dst:%d:%d qp=1", 100+i, src["rkey"], base+(32+i)*piece, (32+i)*piece, piece)
		r2.ok("post wrid=%d sig=1 rkey=%s raddr=%d sge=dst:%d:%d", i, src["rkey"], base+(64+i)*piece, i*piece, piece)
	}
	got1 := collect(t, r1, 64)
	got2 := collect(t, r2, 32)
	want1 := []uint64{}
	for i := range 32 {
		want1 = append(want1, uint64(i))
	}
	for i := range 32 {
		want1 = append(want1, uint64(100+i))
	}
	// Completions of one RC QP come in posting order.
	inOrder(t, got1, func(id uint64) bool { return id < 100 })
	inOrder(t, got1, func(id uint64) bool { return id >= 100 })
	inOrder(t, got2, func(uint64) bool { return true })
	checkIDs(t, "r1", got1, want1)
	checkIDs(t, "r2", got2, want1[:32])
	r1.ok("check dst 0 %d 21 0", 64*piece)
	r2.ok("check dst 0 %d 21 %d", 32*piece, 64*piece)

	// Queue work on both of r1's QPs (into separate memory: two QPs
	// writing one buffer at once race, as two DMAs would), destroy QP 0
	// before polling: only QP 1's completions come.
	r1.ok("post wrid=500 count=8 sig=1 rkey=%s raddr=%d sge=dst:0:%d qp=0", src["rkey"], base, piece)
	r1.ok("post wrid=600 count=8 sig=1 rkey=%s raddr=%d sge=dst:%d:%d qp=1", src["rkey"], base, 32*piece, piece)
	r1.ok("destroy qp=0")
	got := collect(t, r1, 8)
	checkIDs(t, "r1 after destroy", got, []uint64{600, 601, 602, 603, 604, 605, 606, 607})
	if extra, _, _ := r1.poll(1, 100*time.Millisecond); len(extra) != 0 {
		t.Fatalf("completions of a destroyed QP: %v", extra)
	}
}

func collect(t *testing.T, p *endpoint, n int) []completion {
	t.Helper()
	var all []completion
	deadline := time.Now().Add(20 * time.Second)
	for len(all) < n && time.Now().Before(deadline) {
		got, _, errLine := p.poll(n-len(all), 2*time.Second)
		if errLine != "" {
			t.Fatalf("%s: %s", p.name, errLine)
		}
		all = append(all, got...)
	}
	return all
}

func checkIDs(t *testing.T, what string, got []completion, want []uint64) {
	t.Helper()
	var ids []uint64
	for _, c := range got {
		if c.status != wcSuccess {
			t.Fatalf("%s: %+v", what, c)
		}
		ids = append(ids, c.wrID)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	if len(ids) != len(want) {
		t.Fatalf("%s: %d completions %v, want %d", what, len(ids), ids, len(want))
	}
	for i := range ids {
		if ids[i] != want[i] {
			t.Fatalf("%s: wr_ids %v, want %v", what, ids, want)
		}
	}
}

func inOrder(t *testing.T, got []completion, of func(uint64) bool) {
	t.Helper()
	var last uint64
	first := true
	for _, c := range got {
		if !of(c.wrID) {
			continue
		}
		if !first && c.wrID <= last {
			t.Fatalf("completion %d after %d: out of posting order", c.wrID, last)
		}
		last, first = c.wrID, false
	}
}
