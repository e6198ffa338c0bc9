package fabric

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// setDumpable sets the process's dumpable flag (prctl PR_SET_DUMPABLE).
// It is the process's, not the thread's: every thread shares it.
func setDumpable(on bool) error {
	v := uintptr(0)
	if on {
		v = 1
	}
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, v, 0, 0, 0); err != nil {
		return fmt.Errorf("fabric: prctl(PR_SET_DUMPABLE, %d): %w", v, err)
	}
	return nil
}

// isDumpable reports the process's dumpable flag (prctl PR_GET_DUMPABLE).
func isDumpable() (bool, error) {
	v, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0)
	if err != nil {
		return false, fmt.Errorf("fabric: prctl(PR_GET_DUMPABLE): %w", err)
	}
	return v != 0, nil
}
