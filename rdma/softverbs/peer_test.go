package softverbs_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/internal/wait"
)

// A holder killed with SIGKILL: the next READ gets no response and fails
// with RETRY_EXC_ERR after the QP's timeout (timeout 14, retry 7, as
// Mooncake and brpc use: 4.096 us * 2^14 * 8 = 537 ms), and the request
// behind it flushes.
func TestPeerKilledRetryExceededThenFlush(t *testing.T) {
	w := newWorld(t)
	holder, reader := w.pair(pairOpts{readerConn: "timeout=14 retry=7"})
	src := holder.ok("buf src 65536 5")
	reader.ok("buf dst 65536 0")
	post := "rkey=" + src["rkey"] + " raddr=" + src["addr"] + " sge=dst:0:4096"
	reader.ok("post wrid=1 sig=1 %s", post)
	reader.expect(5*time.Second, completion{wrID: 1})
	holder.kill()
	reader.ok("post wrid=2 sig=1 %s", post)
	reader.ok("post wrid=3 sig=0 %s", post)
	got, ms, errLine := reader.poll(2, 10*time.Second)
	if errLine != "" || len(got) != 2 || got[0].wrID != 2 || got[0].status != wcRetryExc ||
		got[1].wrID != 3 || got[1].status != wcFlushErr {
		t.Fatalf("after SIGKILL: %v %s, want wr 2 RETRY_EXC_ERR then wr 3 WR_FLUSH_ERR", got, errLine)
	}
	// The poll's clock starts after the post's answer came back through
	// this test, so it may undercount by a round trip: 400 ms leaves
	// 137 ms for it on a loaded machine.
	if ms < 400 {
		t.Fatalf("RETRY_EXC_ERR after %d ms, before the QP's 537 ms timeout", ms)
	}
	t.Logf("RETRY_EXC_ERR after %d ms (QP timeout 537 ms)", ms)
}

// With timeout 0 a dead peer never ends a request, as on hardware (0 is
// infinite): nothing completes well past SOFTVERBS_TIMEOUT_CAP_MS, which caps
// only finite timeouts, until the QP is moved to ERR and the request is
// flushed.
func TestTimeoutZeroIsInfinite(t *testing.T) {
	w := newWorld(t)
	holder := w.open("holder", "")
	reader := w.open("reader", "", "SOFTVERBS_TIMEOUT_CAP_MS=300")
	connect(holder, reader, "")
	connect(reader, holder, "timeout=0")
	src := holder.ok("buf src 4096 5")
	reader.ok("buf dst 4096 0")
	holder.kill()
	reader.ok("post wrid=1 sig=1 rkey=%s raddr=%s sge=dst:0:8", src["rkey"], src["addr"])
	if got, ms, errLine := reader.poll(1, 2*time.Second); len(got) != 0 || errLine != "" {
		t.Fatalf("timeout 0: %v %s after %d ms, want nothing (infinite)", got, errLine, ms)
	}
	if f := reader.ok("modify state=%d mask=%d", qpsErr, mState); f["rc"] != "0" {
		t.Fatalf("move to ERR: %v", f)
	}
	reader.expect(5*time.Second, completion{wrID: 1, status: wcFlushErr})
}

func registryFiles(t *testing.T, w *world) []string {
	t.Helper()
	ents, err := os.ReadDir(w.registry)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "qp-") || strings.HasPrefix(e.Name(), "mr-") {
			names = append(names, e.Name())
		}
	}
	return names
}

// Registry entries go at dereg and destroy, at exit, and, for a process
// killed with SIGKILL, at the next ibv_open_device on the machine; until
// then the dead process's entries are ignored.
func TestRegistryCleanup(t *testing.T) {
	w := newWorld(t)
	a := w.open("a", "")
	mr := a.ok("buf m 4096 1")
	qpFile, mrFile := "qp-"+a.qpn, "mr-"+mr["rkey"]
	if files := registryFiles(t, w); !slices.Contains(files, qpFile) || !slices.Contains(files, mrFile) {
		t.Fatalf("registry %v lacks %s or %s", files, qpFile, mrFile)
	}
	a.ok("dereg m")
	if files := registryFiles(t, w); slices.Contains(files, mrFile) {
		t.Fatalf("%s still in the registry after dereg: %v", mrFile, files)
	}
	a.ok("destroy")
	if files := registryFiles(t, w); len(files) != 0 {
		t.Fatalf("registry after dereg and destroy: %v", files)
	}

	// Exit.
	b := w.open("b", "")
	b.ok("buf m 4096 1")
	if len(registryFiles(t, w)) != 2 {
		t.Fatalf("registry: %v", registryFiles(t, w))
	}
	b.exit()
	wait.For(t, 10*time.Second, "exited process's entries gone", func() error {
		if files := registryFiles(t, w); len(files) != 0 {
			return fmt.Errorf("left: %v", files)
		}
		return nil
	})

	// SIGKILL: the files stay, then the next open sweeps them.
	c := w.open("c", "")
	c.ok("buf m 4096 1")
	c.kill()
	if files := registryFiles(t, w); len(files) != 2 {
		t.Fatalf("after SIGKILL the entries stay until a sweep: %v", files)
	}
	d := w.open("d", "")
	files := registryFiles(t, w)
	if len(files) != 1 || files[0] != "qp-"+d.qpn {
		t.Fatalf("after the next open: %v, want only d's QP and nothing of c", files)
	}
	if _, err := os.Stat(filepath.Join(w.registry, "qp-"+c.qpn)); !os.IsNotExist(err) {
		t.Fatalf("killed process's QP entry: %v", err)
	}
}

// A dead process's entry whose pid now names another process (pid reuse)
// is ignored: the start time does not match.
func TestRegistryIgnoresReusedPid(t *testing.T) {
	w := newWorld(t)
	holder, reader := w.pair(pairOpts{readerConn: "timeout=10 retry=1"})
	src := holder.ok("buf src 4096 5")
	reader.ok("buf dst 4096 0")
	// Rewrite the holder's QP and MR entries to a live process (this test)
	// with a wrong start time, as if the holder had died and its pid been
	// reused.
	for _, name := range []string{"qp-" + holder.qpn, "mr-" + src["rkey"]} {
		path := filepath.Join(w.registry, name)
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		line := string(b)
		pidField := strings.Fields(line)[0]
		startField := strings.Fields(line)[1]
		line = strings.Replace(line, pidField, fmt.Sprintf("pid=%d", os.Getpid()), 1)
		line = strings.Replace(line, startField, "start=1", 1)
		if err := os.WriteFile(path, []byte(line), 0o666); err != nil {
			t.Fatal(err)
		}
	}
	reader.ok("post wrid=1 sig=1 rkey=%s raddr=%s sge=dst:0:8", src["rkey"], src["addr"])
	reader.expect(5*time.Second, completion{wrID: 1, status: wcRetryExc})
}

// An rkey the holder deregistered no longer reads, though the reader used it
// a moment before.
func TestDeregisteredRkey(t *testing.T) {
	w := newWorld(t)
	holder, reader := w.pair(pairOpts{})
	src := holder.ok("buf src 4096 5")
	reader.ok("buf dst 4096 0")
	post := "rkey=" + src["rkey"] + " raddr=" + src["addr"] + " sge=dst:0:64"
	reader.ok("post wrid=1 sig=1 %s", post)
	reader.expect(5*time.Second, completion{wrID: 1})
	holder.ok("dereg src")
	reader.ok("post wrid=2 sig=1 %s", post)
	reader.expect(5*time.Second, completion{wrID: 2, status: wcRemAccess})
}

// A holder whose QP went to ERR no longer answers: the reader times out.
func TestHolderQPInErrorDoesNotRespond(t *testing.T) {
	w := newWorld(t)
	holder, reader := w.pair(pairOpts{readerConn: "timeout=10 retry=1"})
	src := holder.ok("buf src 4096 5")
	reader.ok("buf dst 4096 0")
	post := "rkey=" + src["rkey"] + " raddr=" + src["addr"] + " sge=dst:0:64"
	reader.ok("post wrid=1 sig=1 %s", post)
	reader.expect(5*time.Second, completion{wrID: 1})
	if f := holder.ok("modify state=%d mask=%d", qpsErr, mState); f["rc"] != "0" {
		t.Fatalf("holder to ERR: %v", f)
	}
	reader.ok("post wrid=2 sig=1 %s", post)
	reader.expect(5*time.Second, completion{wrID: 2, status: wcRetryExc})
}
