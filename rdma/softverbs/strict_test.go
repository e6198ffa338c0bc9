package softverbs_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/internal/wait"
)

// readCase connects a holder and a reader as o says, reads n bytes and
// expects the completion status want. A lost response ends quickly: the
// reader's timeout is 8 (about 1 ms a try) unless o says otherwise.
type readCase struct {
	name string
	o    pairOpts
	n    int
	want int
}

func runReadCases(t *testing.T, cases []readCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := c.o
			if !strings.Contains(o.readerConn, "timeout=") {
				o.readerConn += " timeout=8"
			}
			w := newWorld(t)
			holder, reader := w.pair(o)
			src := holder.ok("buf src 16384 5")
			reader.ok("buf dst 16384 0")
			reader.ok("post wrid=1 sig=1 rkey=%s raddr=%s sge=dst:0:%d", src["rkey"], src["addr"], c.n)
			reader.expect(10*time.Second, completion{wrID: 1, status: c.want})
			if c.want == wcSuccess {
				reader.ok("check dst 0 %d 5 0", c.n)
			}
		})
	}
}

// The requester's first PSN must be the one the responder expects: any
// other is a duplicate or out of sequence, and the requester retries until
// it gives up.
func TestPSNComparedBetweenEnds(t *testing.T) {
	runReadCases(t, []readCase{
		{"both 0", pairOpts{}, 64, wcSuccess},
		{"both 0x123456", pairOpts{holderConn: "rqpsn=0x123456", readerConn: "sqpsn=0x123456"}, 64, wcSuccess},
		{"reader sends 5, holder expects 0", pairOpts{readerConn: "sqpsn=5"}, 64, wcRetryExc},
		{"reader sends 0, holder expects 1", pairOpts{holderConn: "rqpsn=1"}, 64, wcRetryExc},
	})
}

// The active MTU is 1024 unless SOFTVERBS_ACTIVE_MTU says otherwise; a READ
// longer than the link's MTU reaches the reader only when both path MTUs fit
// the link (path_mtu 5 is 4096, 3 is 1024).
func TestPathMTUEnforced(t *testing.T) {
	jumbo := []string{"SOFTVERBS_ACTIVE_MTU=4096"}
	runReadCases(t, []readCase{
		{"port MTU both ends", pairOpts{}, 16384, wcSuccess},
		{"reader 4096 on a 1024 link, 1024 bytes (at the limit)", pairOpts{readerConn: "mtu=5"}, 1024, wcSuccess},
		{"reader 4096 on a 1024 link, 1025 bytes", pairOpts{readerConn: "mtu=5"}, 1025, wcRetryExc},
		{"holder 4096 on a 1024 link", pairOpts{holderConn: "mtu=5"}, 8192, wcRetryExc},
		{"4096 on a jumbo link", pairOpts{holderConn: "mtu=5", readerConn: "mtu=5", holderEnv: jumbo, readerEnv: jumbo}, 16384, wcSuccess},
		{"4096 where one port is 1024", pairOpts{holderConn: "mtu=5", readerConn: "mtu=5", readerEnv: jumbo}, 8192, wcRetryExc},
	})
	w := newWorld(t)
	for _, v := range []string{"1500", "8192", "0", "1k"} {
		p := w.start("bad-mtu", "SOFTVERBS_ACTIVE_MTU="+v)
		if ans := p.do("open"); !strings.HasPrefix(ans, "err") {
			t.Errorf("SOFTVERBS_ACTIVE_MTU=%s: open answered %q, want a refusal", v, ans)
		}
		p.exit()
	}
}

// mlx5's GID table: 2 is the IPv4-mapped address as RoCE v1, 3 as v2. Both
// ends must send with the same version, and v1 is not routed unless the
// two are on one segment (SOFTVERBS_ROCE_V1=1).
func TestGIDTypesChecked(t *testing.T) {
	l2 := []string{"SOFTVERBS_ROCE_V1=1"}
	runReadCases(t, []readCase{
		{"v2 both", pairOpts{holderConn: "sgid=3", readerConn: "sgid=3"}, 64, wcSuccess},
		{"reader v1, holder v2", pairOpts{readerConn: "sgid=2"}, 64, wcRetryExc},
		{"reader v2, holder v1", pairOpts{holderConn: "sgid=2"}, 64, wcRetryExc},
		{"v1 both, routed", pairOpts{holderConn: "sgid=2", readerConn: "sgid=2"}, 64, wcRetryExc},
		{"v1 both, one segment", pairOpts{holderConn: "sgid=2", readerConn: "sgid=2", holderEnv: l2, readerEnv: l2}, 64, wcSuccess},
		{"link-local v2 both", pairOpts{holderConn: "sgid=1", readerConn: "sgid=1"}, 64, wcSuccess},
	})
}

// READs outstanding (at most the reader's max_rd_atomic) beyond the
// holder's responder resources (max_dest_rd_atomic) are an invalid request.
func TestReadDepthCheckedAgainstResponder(t *testing.T) {
	for _, c := range []struct {
		name     string
		mra, mda int
		want     int
	}{
		{"reader 2, holder 2 (at the limit)", 2, 2, wcSuccess},
		{"reader 3, holder 2", 3, 2, wcRemInvReq},
		{"reader 16, holder 4", 16, 4, wcRemInvReq},
		{"reader 1, holder 16", 1, 16, wcSuccess},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newWorld(t)
			holder, reader := w.pair(pairOpts{readerOpen: "wr=16", holderConn: "mdra=" + itoa(c.mda), readerConn: "mra=" + itoa(c.mra)})
			src := holder.ok("buf src 4096 5")
			reader.ok("buf dst 4096 0")
			// Eight posted at once: all outstanding together.
			reader.ok("post wrid=1 count=8 sig=1 rkey=%s raddr=%s sge=dst:0:64", src["rkey"], src["addr"])
			got, _, errLine := reader.poll(8, 10*time.Second)
			if errLine != "" || len(got) == 0 {
				t.Fatalf("poll: %v %s", got, errLine)
			}
			if c.want == wcSuccess {
				if len(got) != 8 {
					t.Fatalf("%d completions, want 8: %v", len(got), got)
				}
				for _, g := range got {
					if g.status != wcSuccess {
						t.Fatalf("completions %v, want all successful", got)
					}
				}
				return
			}
			if got[0].status != c.want {
				t.Fatalf("first completion %v, want status %d", got[0], c.want)
			}
		})
	}
}

// Asynchronous events: the port going down and coming back, and a CQ
// overrun with the QP it makes fatal.
func TestAsyncEvents(t *testing.T) {
	const (
		evCQErr      = 0
		evQPFatal    = 1
		evPortActive = 9
		evPortErr    = 10
	)
	t.Run("port", func(t *testing.T) {
		ctl := filepath.Join(t.TempDir(), "control")
		w := newWorld(t)
		p := w.open("p", "", "SOFTVERBS_CONTROL="+ctl)
		if ans := p.do("async ms=200"); ans != "err async errno=11" {
			t.Fatalf("no event yet: %q, want EAGAIN", ans)
		}
		if err := os.WriteFile(ctl, []byte("port_down=1\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if f := p.ok("async"); f["type"] != itoa(evPortErr) {
			t.Fatalf("port down: event %v, want IBV_EVENT_PORT_ERR", f)
		}
		if err := os.WriteFile(ctl, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if f := p.ok("async"); f["type"] != itoa(evPortActive) {
			t.Fatalf("port up: event %v, want IBV_EVENT_PORT_ACTIVE", f)
		}
	})
	t.Run("CQ overrun", func(t *testing.T) {
		w := newWorld(t)
		holder, reader := w.pair(pairOpts{readerOpen: "cqe=2 wr=8"})
		src := holder.ok("buf src 4096 5")
		reader.ok("buf dst 4096 0")
		reader.ok("post wrid=1 count=3 sig=1 rkey=%s raddr=%s sge=dst:0:8", src["rkey"], src["addr"])
		waitState(t, reader, qpsErr)
		if f := reader.ok("async"); f["type"] != itoa(evCQErr) || f["ours"] != "1" {
			t.Fatalf("after the overrun: event %v, want IBV_EVENT_CQ_ERR for our CQ", f)
		}
		if f := reader.ok("async"); f["type"] != itoa(evQPFatal) || f["ours"] != "1" {
			t.Fatalf("after the overrun: event %v, want IBV_EVENT_QP_FATAL for our QP", f)
		}
	})
}

// Deregistering the region a READ is writing into waits for the copy, as
// deregistering pinned memory waits for the NIC: once ibv_dereg_mr returns
// the whole READ has landed and nothing more will. The holder deregistering
// its region during the copy voids it: REM_ACCESS_ERR, not success.
func TestDeregWhileReadInFlight(t *testing.T) {
	const size = 1 << 20 // 16 pieces of 64 KiB, 50 ms each: 800 ms a READ
	slow := []string{"SOFTVERBS_FAULTS=copy_us=50000"}
	start := func(t *testing.T) (holder, reader *endpoint, src map[string]string) {
		w := newWorld(t)
		holder, reader = w.pair(pairOpts{readerEnv: slow})
		src = holder.ok("buf src %d 9", size)
		reader.ok("buf dst %d 0", size)
		reader.ok("post wrid=1 sig=1 rkey=%s raddr=%s sge=dst:0:%d", src["rkey"], src["addr"], size)
		// The copy is under way once its first piece has landed.
		wait.For(t, 10*time.Second, "the READ's first piece", func() error {
			if ans := reader.do("check dst 0 64 9 0"); !strings.HasPrefix(ans, "ok") {
				return fmt.Errorf("%s", ans)
			}
			return nil
		})
		return holder, reader, src
	}
	t.Run("reader deregisters", func(t *testing.T) {
		_, reader, _ := start(t)
		reader.ok("dereg dst keep=1")
		// All of it, at once: the READ ended before the deregistration did.
		reader.ok("check dst 0 %d 9 0", size)
		reader.expect(10*time.Second, completion{wrID: 1, status: wcSuccess})
	})
	t.Run("holder deregisters", func(t *testing.T) {
		holder, reader, _ := start(t)
		holder.ok("dereg src keep=1")
		reader.expect(10*time.Second, completion{wrID: 1, status: wcRemAccess})
	})
}
