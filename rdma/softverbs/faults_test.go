package softverbs_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func readerWith(t *testing.T, o pairOpts) (src map[string]string, reader *endpoint, post string) {
	t.Helper()
	w := newWorld(t)
	holder, r := w.pair(o)
	src = holder.ok("buf src 4096 5")
	r.ok("buf dst 4096 0")
	return src, r, "rkey=" + src["rkey"] + " raddr=" + src["addr"] + " sge=dst:0:64"
}

// fail_read=N from the environment fails the Nth READ with
// REM_ACCESS_ERR (or fail_status); what follows flushes.
func TestFaultFailNthRead(t *testing.T) {
	for _, c := range []struct {
		faults string
		want   int
	}{
		{"fail_read=2", wcRemAccess},
		{"fail_read=2,fail_status=RETRY_EXC_ERR", wcRetryExc},
		{"fail_read=2,fail_status=IBV_WC_REM_INV_REQ_ERR", wcRemInvReq},
		{"fail_read=2,fail_status=4", wcLocProtErr},
	} {
		t.Run(c.faults, func(t *testing.T) {
			_, reader, post := readerWith(t, pairOpts{readerEnv: []string{"SOFTVERBS_FAULTS=" + c.faults}})
			reader.ok("post wrid=1 count=3 sig=1 %s", post)
			reader.expect(5*time.Second, completion{wrID: 1, status: wcSuccess},
				completion{wrID: 2, status: c.want}, completion{wrID: 3, status: wcFlushErr})
		})
	}
}

// The control file is re-read on every post: fail_read=1 written there
// fails the next READ, counted from when it was written.
func TestFaultControlFile(t *testing.T) {
	ctl := filepath.Join(t.TempDir(), "control")
	if err := os.WriteFile(ctl, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	_, reader, post := readerWith(t, pairOpts{readerEnv: []string{"SOFTVERBS_CONTROL=" + ctl}})
	reader.ok("post wrid=1 count=3 sig=1 %s", post)
	reader.expect(5*time.Second, completion{wrID: 1}, completion{wrID: 2}, completion{wrID: 3})
	writeFile(t, ctl, "fail_read=1\n")
	reader.ok("post wrid=4 sig=1 %s", post)
	reader.expect(5*time.Second, completion{wrID: 4, status: wcRemAccess})
}

func writeFile(t *testing.T, path, s string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// delay_us delays every completion.
func TestFaultDelay(t *testing.T) {
	_, reader, post := readerWith(t, pairOpts{readerEnv: []string{"SOFTVERBS_FAULTS=delay_us=500000"}})
	reader.ok("post wrid=1 sig=1 %s", post)
	got, ms, _ := reader.poll(1, 10*time.Second)
	// The poll's clock starts after the post's answer came back through
	// this test: 400 ms leaves 100 ms for that on a loaded machine.
	if len(got) != 1 || got[0].status != wcSuccess || ms < 400 {
		t.Fatalf("with delay_us=500000: %v after %d ms", got, ms)
	}
}

// stall=1: no completion while it holds; cleared within the QP's timeout
// the READ completes; held past it, RETRY_EXC_ERR.
func TestFaultStall(t *testing.T) {
	t.Run("cleared in time", func(t *testing.T) {
		ctl := filepath.Join(t.TempDir(), "control")
		writeFile(t, ctl, "stall=1")
		// timeout 20, retry 7: 34 s, capped at 20 s: far past the test's
		// clearing of the stall, however loaded the machine.
		_, reader, post := readerWith(t, pairOpts{readerConn: "timeout=20 retry=7",
			readerEnv: []string{"SOFTVERBS_CONTROL=" + ctl, "SOFTVERBS_TIMEOUT_CAP_MS=20000"}})
		reader.ok("post wrid=1 sig=1 %s", post)
		if got, _, _ := reader.poll(1, 100*time.Millisecond); len(got) != 0 {
			t.Fatalf("completion while stalled: %v", got)
		}
		writeFile(t, ctl, "stall=0")
		reader.expect(10*time.Second, completion{wrID: 1, status: wcSuccess})
		reader.ok("check dst 0 64 5 0")
	})
	t.Run("past the timeout", func(t *testing.T) {
		_, reader, post := readerWith(t, pairOpts{readerConn: "timeout=10 retry=1",
			readerEnv: []string{"SOFTVERBS_FAULTS=stall=1"}})
		reader.ok("post wrid=1 sig=1 %s", post)
		reader.expect(10*time.Second, completion{wrID: 1, status: wcRetryExc})
	})
	t.Run("peer stalled by its control file", func(t *testing.T) {
		ctl := filepath.Join(t.TempDir(), "control")
		writeFile(t, ctl, "")
		_, reader, post := readerWith(t, pairOpts{readerConn: "timeout=10 retry=1",
			holderEnv: []string{"SOFTVERBS_CONTROL=" + ctl}})
		reader.ok("post wrid=1 sig=1 %s", post)
		reader.expect(5*time.Second, completion{wrID: 1, status: wcSuccess})
		writeFile(t, ctl, "stall=1")
		reader.ok("post wrid=2 sig=1 %s", post)
		reader.expect(10*time.Second, completion{wrID: 2, status: wcRetryExc})
	})
}

// port_down=1 (control file) and SOFTVERBS_PORT_STATE=down report the port
// DOWN; READs then time out.
func TestFaultPortDown(t *testing.T) {
	ctl := filepath.Join(t.TempDir(), "control")
	writeFile(t, ctl, "")
	_, reader, post := readerWith(t, pairOpts{readerConn: "timeout=10 retry=1",
		readerEnv: []string{"SOFTVERBS_CONTROL=" + ctl}})
	if st := reader.ok("port")["state"]; st != "4" {
		t.Fatalf("port state %s, want 4 (ACTIVE)", st)
	}
	writeFile(t, ctl, "port_down=1")
	if st := reader.ok("port")["state"]; st != "1" {
		t.Fatalf("port state %s with port_down=1, want 1 (DOWN)", st)
	}
	reader.ok("post wrid=1 sig=1 %s", post)
	reader.expect(10*time.Second, completion{wrID: 1, status: wcRetryExc})

	w := newWorld(t)
	p := w.open("down", "", "SOFTVERBS_PORT_STATE=down")
	if st := p.ok("port")["state"]; st != "1" {
		t.Fatalf("SOFTVERBS_PORT_STATE=down: port state %s", st)
	}
}
