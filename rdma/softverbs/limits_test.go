package softverbs_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/internal/wait"
)

// The send queue holds max_send_wr requests; a slot frees when a completion
// of its request, or of a later one, is polled. Past that, post_send returns
// ENOMEM with bad_wr at the first request that did not fit.
func TestSendQueueDepth(t *testing.T) {
	w := newWorld(t)
	holder, reader := w.pair(pairOpts{readerOpen: "wr=4 cqe=16"})
	src := holder.ok("buf src 4096 5")
	reader.ok("buf dst 4096 0")
	post := "rkey=" + src["rkey"] + " raddr=" + src["addr"] + " sge=dst:0:64"
	// At the limit: four unsignalled but the last.
	reader.ok("post wrid=1 count=4 sig=0 siglast=1 %s", post)
	// Past it, before anything is polled.
	if ans := reader.do("post wrid=5 sig=1 %s", post); ans != "err rc=12 bad=5" {
		t.Fatalf("fifth post: %q, want err rc=12 bad=5", ans)
	}
	reader.expect(5*time.Second, completion{wrID: 4, status: wcSuccess})
	// Polling wr 4's completion freed all four slots: a chain of five
	// takes four and reports the fifth as bad_wr.
	if ans := reader.do("post wrid=10 count=5 sig=1 %s", post); ans != "err rc=12 bad=14" {
		t.Fatalf("chain of five into four slots: %q, want err rc=12 bad=14", ans)
	}
	reader.expect(5*time.Second,
		completion{wrID: 10}, completion{wrID: 11}, completion{wrID: 12}, completion{wrID: 13})
	reader.ok("check dst 0 64 5 0")
}

// Unsignalled successes never reach the CQ, and their slots stay taken
// until a later completion is polled: a queue of only unsignalled requests
// fills up for good.
func TestUnsignalledFillQueue(t *testing.T) {
	w := newWorld(t)
	holder, reader := w.pair(pairOpts{readerOpen: "wr=2"})
	src := holder.ok("buf src 4096 5")
	reader.ok("buf dst 4096 0")
	reader.ok("post wrid=1 count=2 sig=0 rkey=%s raddr=%s sge=dst:0:8", src["rkey"], src["addr"])
	got, _, errLine := reader.poll(1, 200*time.Millisecond)
	if errLine != "" || len(got) != 0 {
		t.Fatalf("unsignalled requests completed: %v %s", got, errLine)
	}
	if ans := reader.do("post wrid=3 sig=1 rkey=%s raddr=%s sge=dst:0:8", src["rkey"], src["addr"]); ans != "err rc=12 bad=3" {
		t.Fatalf("post after two unsignalled into two slots: %q", ans)
	}
}

// sq_sig_all makes every request signalled.
func TestSignalAll(t *testing.T) {
	w := newWorld(t)
	holder, reader := w.pair(pairOpts{readerOpen: "sigall=1"})
	src := holder.ok("buf src 4096 5")
	reader.ok("buf dst 4096 0")
	reader.ok("post wrid=1 count=3 sig=0 rkey=%s raddr=%s sge=dst:0:8", src["rkey"], src["addr"])
	reader.expect(5*time.Second, completion{wrID: 1}, completion{wrID: 2}, completion{wrID: 3})
}

// A request may carry max_send_sge SGEs, not one more; creation refuses
// queues and CQs past the device's limits and takes them at the limits.
func TestSGEAndCreationLimits(t *testing.T) {
	w := newWorld(t)
	holder, reader := w.pair(pairOpts{readerOpen: "sge=30"})
	src := holder.ok("buf src 65536 9")
	reader.ok("buf dst 65536 0")
	var sge []string
	for i := range 31 {
		sge = append(sge, sprintf("dst:%d:100", i*200))
	}
	list := strings.Join(sge, ",")
	if ans := reader.do("post wrid=1 nsge=31 rkey=%s raddr=%s sge=%s", src["rkey"], src["addr"], list); ans != "err rc=22 bad=1" {
		t.Fatalf("31 SGEs on a QP of 30: %q", ans)
	}
	reader.ok("post wrid=2 nsge=30 rkey=%s raddr=%s sge=%s", src["rkey"], src["addr"], list)
	reader.expect(5*time.Second, completion{wrID: 2})
	for i := range 30 {
		reader.ok("check dst %d 100 9 %d", i*200, i*100)
	}

	for _, c := range []struct {
		open string
		ok   bool
	}{
		{"wr=4096", true},
		{"wr=4097", false},
		{"sge=31", false},
		{"cqe=65536", true},
		{"cqe=65537", false},
		{"cqe=0", false},
	} {
		p := w.start("limits")
		ans := p.do("open %s", c.open)
		if strings.HasPrefix(ans, "ok") != c.ok {
			t.Errorf("open %s: %q, want ok=%v", c.open, ans, c.ok)
		}
		if !c.ok && !strings.Contains(ans, "errno=22") {
			t.Errorf("open %s: %q, want EINVAL", c.open, ans)
		}
	}
}

// CQ overrun: with cqe=2, a third completion is lost, the CQ is in error
// and the QP moves to ERR; poll returns the two stored completions, then
// -EOVERFLOW.
func TestCQOverflow(t *testing.T) {
	w := newWorld(t)
	holder, reader := w.pair(pairOpts{readerOpen: "cqe=2 wr=8"})
	src := holder.ok("buf src 4096 5")
	reader.ok("buf dst 4096 0")
	reader.ok("post wrid=1 count=2 sig=1 rkey=%s raddr=%s sge=dst:0:8", src["rkey"], src["addr"])
	reader.expect(5*time.Second, completion{wrID: 1}, completion{wrID: 2})
	// At the limit: two completions fit; past it: the third overruns.
	reader.ok("post wrid=3 count=3 sig=1 rkey=%s raddr=%s sge=dst:0:8", src["rkey"], src["addr"])
	waitState(t, reader, qpsErr)
	got, _, errLine := reader.poll(3, 2*time.Second)
	if errLine != "err poll rc=-75 got=2" {
		t.Fatalf("poll after overrun: %v %q, want two completions then rc -75 (EOVERFLOW)", got, errLine)
	}
	if ans := reader.do("poll 1 100"); ans != "err poll rc=-75 got=0" {
		t.Fatalf("poll of a CQ in error: %q", ans)
	}
}

func waitState(t *testing.T, p *endpoint, state int) {
	t.Helper()
	wait.For(t, 10*time.Second, "QP state "+itoa(state), func() error {
		if st := p.ok("state")["state"]; st != itoa(state) {
			return fmt.Errorf("state %s", st)
		}
		return nil
	})
}

// A context holds max_qp QPs, max_pd PDs and max_mr regions: at the limit
// they are made, past it ENOMEM.
func TestObjectCountLimits(t *testing.T) {
	w := newWorld(t)
	for _, c := range []struct {
		kind  string
		limit int // the device's limit less what "open" made
	}{
		{"qp", 256 - 1},
		{"pd", 64 - 1},
		{"mr", 4096},
	} {
		p := w.open(c.kind, "")
		f := p.ok("many %s %d", c.kind, c.limit+1)
		if f["made"] != itoa(c.limit) || f["errno"] != itoa(eNoMem) {
			t.Errorf("%s: made %s then errno %s, want %d then ENOMEM", c.kind, f["made"], f["errno"], c.limit)
		}
	}
}

// Teardown out of order is refused with EBUSY while objects are in use, then
// succeeds in order; the registry is empty after it.
func TestTeardownOrder(t *testing.T) {
	w := newWorld(t)
	p := w.open("p", "")
	p.ok("buf m 4096 1")
	f := p.ok("teardown")
	want := map[string]string{"cq1": "16", "pd1": "16", "ctx1": "16", "pd3": "16", "qp2": "0", "mr2": "0", "cq2": "0", "pd2": "0", "ctx2": "0"}
	for k, v := range want {
		if f[k] != v {
			t.Errorf("%s = %s, want %s (all: %v)", k, f[k], v, f)
		}
	}
	if files := registryFiles(t, w); len(files) != 0 {
		t.Fatalf("registry after teardown: %v", files)
	}
}
