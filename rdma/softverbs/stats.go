package softverbs

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// Stats are one process's softverbs data-path counters: the work a NIC
// does without the CPU, which softverbs does on it.
type Stats struct {
	// Reads and Bytes count the READs executed successfully and the bytes
	// they moved.
	Reads, Bytes uint64
	// PollerCPU is the CPU time of the copies made by the threads polling
	// a completion queue (ibv_poll_cq executes queued requests when it
	// finds the queue empty); WorkerCPU that of the copies made by the
	// queue pairs' own threads (named "softverbs-qp").
	PollerCPU, WorkerCPU time.Duration
}

// CopyCPU is all the CPU time softverbs spent moving bytes.
func (s Stats) CopyCPU() time.Duration { return s.PollerCPU + s.WorkerCPU }

// ReadStats returns the counters of process pid, which uses softverbs with
// registry as its SOFTVERBS_REGISTRY, as they are now. A process that has
// executed no READ has none (an error wrapping os.ErrNotExist).
func ReadStats(registry string, pid int) (Stats, error) {
	raw, err := os.ReadFile(filepath.Join(registry, "stats-"+strconv.Itoa(pid)))
	if err != nil {
		return Stats{}, fmt.Errorf("softverbs: stats of pid %d: %w", pid, err)
	}
	if len(raw) < 4*8 {
		return Stats{}, fmt.Errorf("softverbs: stats of pid %d: %d bytes, want at least 32", pid, len(raw))
	}
	u := func(i int) uint64 { return binary.NativeEndian.Uint64(raw[8*i:]) }
	return Stats{Reads: u(0), Bytes: u(1), PollerCPU: time.Duration(u(2)), WorkerCPU: time.Duration(u(3))}, nil
}
