package fabric

// applyDumpable makes the process non-dumpable, or dumpable again with
// cfg.Dumpable, before any memory is handed out. A non-dumpable process's
// /proc/<pid> entries belong to root, and the kernel refuses other
// processes of its user the ptrace access that /proc/<pid>/fd,
// /proc/<pid>/map_files, /proc/<pid>/mem and process_vm_readv need: an
// engine reaches only the memory the agent gives it (by descriptor or
// named file). A dumpable agent says so once at start.
func (a *Agent) applyDumpable() error {
	if err := setDumpable(a.cfg.Dumpable); err != nil {
		return err
	}
	if a.cfg.Dumpable {
		a.log.Warn("the agent is dumpable (dumpable): processes of its user can open any block set's memory through /proc and attach to it; for debuggers, core dumps and the software stand-ins of RDMA and CUDA")
	}
	return nil
}
