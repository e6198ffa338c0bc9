package rdma

import (
	"syscall"
	"time"
)

// rusageThread is RUSAGE_THREAD: the calling thread's usage only.
const rusageThread = 1

// threadCPU is the user and system time the calling OS thread has used; 0
// if the kernel does not say.
func threadCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(rusageThread, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
