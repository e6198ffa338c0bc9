package fabric

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// MaxEngineSocket bounds the length of Config.EngineSocket: a unix
// socket's path holds 107 bytes on Linux (sun_path's 108 with its NUL),
// and the descriptor socket beside it adds FDSocketSuffix. Past it the
// agent failed at start with "bind: invalid argument".
const MaxEngineSocket = len(syscall.RawSockaddrUnix{}.Path) - 1 - len(FDSocketSuffix)

// checkEngineSocket refuses an engine socket whose path, or its
// descriptor companion's, is too long for a unix socket.
func (c *Config) checkEngineSocket() error {
	n := len(c.EngineSocket)
	if n <= MaxEngineSocket {
		return nil
	}
	why := fmt.Sprintf("%q is %d bytes, at most %d: a unix socket's path holds %d, and the %s socket beside it adds %d",
		c.EngineSocket, n, MaxEngineSocket, MaxEngineSocket+len(FDSocketSuffix), FDSocketSuffix, len(FDSocketSuffix))
	if c.EngineSocket == filepath.Join(c.DataDir, "engine.sock") {
		// Named by the data directory, by default: either setting
		// shortens it.
		return badSetting("data_dir, engine_socket", "%s: give a shorter data_dir, or an engine_socket of its own", why)
	}
	return badSetting("engine_socket", "%s", why)
}

// notADir says why the agent cannot make or use path as a directory: it
// is a file, or a file is on its way to it. A path that can be made, or
// that cannot be looked at (left to the start), is nil.
func notADir(path string) error {
	fi, err := os.Stat(path)
	switch {
	case err == nil && !fi.IsDir():
		return fmt.Errorf("%s is a file, not a directory", path)
	case errors.Is(err, syscall.ENOTDIR):
		return fmt.Errorf("%s: a file is on its way, not a directory", path)
	}
	return nil
}

// socketDirAccess is the mode and group of the directories the agent
// makes on the way to the engine socket: where the socket's mode grants
// its group access, 0710 and that group, so that the group's engines can
// reach the socket (search the directory, not list it); else 0700 and the
// agent's group (gid -1). Both settings were validated.
func (c *Config) socketDirAccess() (perm os.FileMode, gid int) {
	mode, _ := parseSocketMode(c.EngineSocketMode)
	if mode&0o060 == 0 {
		return 0o700, -1
	}
	gid, _ = lookupGroup(c.EngineSocketGroup)
	return 0o710, gid
}

// dataDirAccess is the mode and group the data directory is made with:
// the socket's directories' where it is one of them (the engine socket in
// it, by default, or below it), else 0700 and the agent's group.
func (c *Config) dataDirAccess() (perm os.FileMode, gid int) {
	if onPathTo(c.DataDir, filepath.Dir(c.EngineSocket)) {
		return c.socketDirAccess()
	}
	return 0o700, -1
}

// onPathTo reports whether dir is target or a directory above it.
func onPathTo(dir, target string) bool {
	d, err1 := filepath.Abs(dir)
	t, err2 := filepath.Abs(target)
	if err1 != nil || err2 != nil {
		return false
	}
	return d == t || strings.HasPrefix(t, strings.TrimSuffix(d, "/")+"/")
}

// makeDirs makes dir and the directories missing above it, each with mode
// perm whatever the umask and, where gid >= 0, group gid. Directories that
// exist are left as they are.
func makeDirs(dir string, perm os.FileMode, gid int) error {
	dir = filepath.Clean(dir)
	fi, err := os.Stat(dir)
	switch {
	case err == nil && fi.IsDir():
		return nil
	case err == nil:
		return &fs.PathError{Op: "mkdir", Path: dir, Err: syscall.ENOTDIR}
	case !errors.Is(err, fs.ErrNotExist):
		return err
	}
	if parent := filepath.Dir(dir); parent != dir {
		if err := makeDirs(parent, perm, gid); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, perm); err != nil {
		if fi, serr := os.Stat(dir); serr == nil && fi.IsDir() {
			return nil // made meanwhile by another
		}
		return err
	}
	if gid >= 0 {
		if err := os.Chown(dir, -1, gid); err != nil {
			return err
		}
	}
	return os.Chmod(dir, perm)
}

// warnSocketDirs warns, where the engine socket's mode grants its group
// access, of each directory on the way to the socket that the group
// cannot search: the group's engines cannot reach the socket through it
// (stat: permission denied). The agent makes the directories it makes so
// that the group can (socketDirAccess); those that were there are the
// operator's to change, and the warning says how.
func (a *Agent) warnSocketDirs() {
	_, gid := a.cfg.socketDirAccess()
	if gid < 0 {
		return
	}
	group := a.cfg.EngineSocketGroup
	if group == "" {
		group = strconv.Itoa(gid)
	}
	dir, err := filepath.Abs(filepath.Dir(a.cfg.EngineSocket))
	if err != nil {
		return
	}
	for {
		if fi, err := os.Stat(dir); err == nil && !groupCanSearch(fi, gid) {
			a.log.Warn("the engine socket's group cannot search a directory on the way to the socket: its engines cannot reach the socket",
				"dir", dir, "group", group, "change", fmt.Sprintf("chgrp %s %s && chmod g+x %s (or chmod o+x %s)", group, dir, dir, dir))
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return
		}
		dir = parent
	}
}

// groupCanSearch reports whether members of group gid who do not own fi
// may search it: by its group's bits where it is theirs, else by its
// others' bits.
func groupCanSearch(fi os.FileInfo, gid int) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return true // nothing to tell by
	}
	if int(st.Gid) == gid {
		return fi.Mode().Perm()&0o010 != 0
	}
	return fi.Mode().Perm()&0o001 != 0
}
