package fabric

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// hostMemory returns the machine's physical memory in bytes.
func hostMemory() (uint64, error) {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return 0, fmt.Errorf("fabric: sysinfo: %w", err)
	}
	return uint64(si.Totalram) * uint64(si.Unit), nil
}

// fsSize returns the size of the file system holding dir, in bytes.
func fsSize(dir string) (uint64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("fabric: statfs %s: %w", dir, err)
	}
	return st.Blocks * uint64(st.Bsize), nil
}
