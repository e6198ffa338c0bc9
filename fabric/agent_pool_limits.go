package fabric

import "fmt"

// MinPoolBytes is the smallest pool (host, pinned or device) the agent
// accepts: 1 MiB. A smaller one holds no block of a real model; a size
// such as host=64 is a missing unit, and is refused with that said.
const MinPoolBytes = 1 << 20

// checkPoolFloor refuses a pool size below MinPoolBytes.
func checkPoolFloor(spec string, size uint64) error {
	if size < MinPoolBytes {
		return fmt.Errorf("%q: %d bytes is below the smallest pool, %d bytes (1MiB); is a unit missing? (e.g. 64GiB)", spec, size, MinPoolBytes)
	}
	return nil
}

// checkPoolFits refuses a pool of size bytes carved from memory of
// avail bytes (what names that memory) when it does not fit.
func checkPoolFits(kind string, size uint64, what string, avail uint64) error {
	if size > avail {
		return badSetting("pools", "a %s pool of %d bytes is more than %s (%d bytes)", kind, size, what, avail)
	}
	return nil
}

// checkHostPoolFits refuses a host or pinned pool larger than the
// machine's memory, or, with a memory directory, than the file system
// that holds it (a tmpfs is usually half the memory).
func (a *Agent) checkHostPoolFits(spec PoolSpec) error {
	mem, err := hostMemory()
	if err != nil {
		return err
	}
	if err := checkPoolFits(spec.Kind, spec.Size, "this machine's memory", mem); err != nil {
		return err
	}
	if a.cfg.MemoryDir == "" {
		return nil
	}
	fs, err := fsSize(a.cfg.MemoryDir)
	if err != nil {
		return err
	}
	return checkPoolFits(spec.Kind, spec.Size, "the file system of memory_dir "+a.cfg.MemoryDir, fs)
}
