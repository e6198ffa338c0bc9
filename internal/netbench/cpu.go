package netbench

import (
	"syscall"
	"time"
)

// ProcessCPU is the CPU time, user and system, the process has used so
// far; 0 where the platform does not say. A benchmark reads it before and
// after a transport's run to report CPU per GB beside its throughput.
func ProcessCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
