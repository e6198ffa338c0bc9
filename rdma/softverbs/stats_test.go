package softverbs_test

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/rdma/softverbs"
)

// The data-path counters count what READs moved and the CPU their copies
// took, readable from another process while the reader runs, and go with
// the reader's exit; the QP's worker thread is named so that its CPU time
// shows apart in /proc.
func TestStatsCountReadsAndCopyCPU(t *testing.T) {
	w := newWorld(t)
	holder, reader := w.pair(pairOpts{})
	const size = 4 << 20
	src := holder.ok("buf src %d 7", size)
	reader.ok("buf dst %d 0", size)
	pid := atoi(t, reader.ok("pid")["pid"])
	if _, err := softverbs.ReadStats(w.registry, pid); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stats before any READ: %v, want not exist", err)
	}

	// Two READs: one signalled completion covers both.
	reader.ok("post wrid=1 sig=0 rkey=%s raddr=%s sge=dst:0:%d", src["rkey"], src["addr"], size/2)
	reader.ok("post wrid=2 sig=1 rkey=%s raddr=%d sge=dst:%d:%d", src["rkey"], atoi(t, src["addr"])+size/2, size/2, size/2)
	reader.expect(5*time.Second, completion{wrID: 2, status: wcSuccess, byteLen: size / 2})
	reader.ok("check dst 0 %d 7 0", size)
	st, err := softverbs.ReadStats(w.registry, pid)
	if err != nil {
		t.Fatal(err)
	}
	if st.Reads != 2 || st.Bytes != size || st.CopyCPU() <= 0 {
		t.Fatalf("stats %+v after 2 READs of %d bytes: want 2 reads, %d bytes, some copy CPU", st, size/2, size)
	}

	named := false
	tasks, _ := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/comm")
	for _, f := range tasks {
		if b, err := os.ReadFile(f); err == nil && strings.TrimSpace(string(b)) == "softverbs-qp" {
			named = true
		}
	}
	if !named {
		t.Errorf("no thread of the reader (%d threads) is named softverbs-qp", len(tasks))
	}

	reader.exit()
	if _, err := softverbs.ReadStats(w.registry, pid); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stats after the reader exited: %v, want removed", err)
	}
}
