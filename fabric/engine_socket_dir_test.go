package fabric_test

import (
	"log/slog"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/kvfabric/kvfabric/fabric"
)

// With a socket mode that grants the group access, the directories the
// agent makes on the way to the engine socket are 0710 and the socket's
// group, so that a user of the group reaches the socket; a directory that
// was there and that the group cannot search is left as it is and named in
// a warning at start, with what to change. With a mode for the owner
// only, the agent's directories stay 0700.
func TestEngineSocketDirGroupAccess(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("giving a directory to another group needs root")
	}
	g, err := user.LookupGroup("nogroup")
	if err != nil {
		if g, err = user.LookupGroupId("1"); err != nil {
			t.Skip("no group nogroup nor group id 1 to give the socket to")
		}
	}
	gid, _ := strconv.Atoi(g.Gid)
	const warning = "the engine socket's group cannot search a directory"
	start := func(t *testing.T, mode string, dataDir func(tmp string) string) (*fabric.Agent, *logBuffer) {
		cfg := testConfig(t, "n1")
		var logs logBuffer
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		cfg.EngineSocketMode, cfg.EngineSocketGroup = mode, g.Name
		cfg.DataDir = dataDir(cfg.DataDir)
		return startAgent(t, cfg), &logs
	}
	check := func(t *testing.T, dir string, perm os.FileMode, gid int) {
		t.Helper()
		fi, err := os.Stat(dir)
		if err != nil {
			t.Fatal(err)
		}
		if got := int(fi.Sys().(*syscall.Stat_t).Gid); fi.Mode().Perm() != perm || got != gid {
			t.Errorf("%s: mode %#o, group %d; want %#o and %d", dir, fi.Mode().Perm(), got, perm, gid)
		}
	}

	t.Run("made by the agent", func(t *testing.T) {
		var base string
		a, logs := start(t, "0660", func(tmp string) string {
			base = tmp
			if err := os.Chmod(base, 0o711); err != nil { // searchable by all, as /var/lib is
				t.Fatal(err)
			}
			return filepath.Join(base, "run", "kvfabric")
		})
		check(t, filepath.Join(base, "run"), 0o710, gid)
		check(t, filepath.Join(base, "run", "kvfabric"), 0o710, gid)
		if strings.Contains(logs.String(), warning) {
			t.Errorf("warned of directories the group can search:\n%s", logs)
		}
		// A user of the group finds the socket, where it was refused
		// (stat: permission denied) by a directory of mode 0700.
		nobody, err := user.Lookup("nobody")
		if err != nil {
			t.Skip("no user nobody to look for the socket as")
		}
		uid, _ := strconv.Atoi(nobody.Uid)
		cmd := exec.Command("/bin/sh", "-c", `test -S "$0"`, a.EngineSocket())
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("user %s of group %s cannot find the socket %s: %v %s", nobody.Username, g.Name, a.EngineSocket(), err, out)
		}
	})

	t.Run("there already", func(t *testing.T) {
		var base string
		_, logs := start(t, "0660", func(tmp string) string { base = tmp; return tmp }) // made 0700 by the test
		check(t, base, 0o700, os.Getegid())
		if l := logs.String(); !strings.Contains(l, warning) || !strings.Contains(l, "dir="+base+" ") ||
			!strings.Contains(l, "chmod g+x "+base) || !strings.Contains(l, "group="+g.Name) {
			t.Errorf("no warning naming %s, the group and what to change:\n%s", base, l)
		}
	})

	t.Run("owner only", func(t *testing.T) {
		var base string
		_, logs := start(t, "0600", func(tmp string) string { base = tmp; return filepath.Join(tmp, "run") })
		check(t, filepath.Join(base, "run"), 0o700, os.Getegid())
		if strings.Contains(logs.String(), warning) {
			t.Errorf("warned with a mode for the owner only:\n%s", logs)
		}
	})
}
