//go:build !linux

package fabric

// setDumpable does nothing here: there is no /proc/<pid>/fd to close.
func setDumpable(bool) error { return nil }

// isDumpable says what setDumpable leaves: the process as it was.
func isDumpable() (bool, error) { return true, nil }
