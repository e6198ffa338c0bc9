package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric"
)

// runEnv runs a command with environ as its whole environment.
func runEnv(t *testing.T, environ []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(&env{stdin: strings.NewReader(""), stdout: &out, stderr: &errb, env: append([]string{}, environ...)}, args)
	return code, out.String(), errb.String()
}

// Every setting of fabric.Config that a file can hold is bound once, to
// one flag: none can be forgotten by one of the three ways in.
func TestEverySettingBoundOnce(t *testing.T) {
	bound := map[string]bool{}
	flags := map[string]bool{}
	for _, s := range agentSettings {
		if bound[s.field] || flags[s.flag] {
			t.Errorf("%s (--%s) bound twice", s.field, s.flag)
		}
		bound[s.field], flags[s.flag] = true, true
	}
	ct := reflect.TypeFor[fabric.Config]()
	for i := range ct.NumField() {
		f := ct.Field(i)
		key, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if !f.IsExported() || key == "-" || key == "local" { // local: the --local flag picks other defaults
			continue
		}
		if !bound[f.Name] {
			t.Errorf("fabric.Config.%s (%s) has no flag", f.Name, key)
		}
	}
}

// Defaults, then the file, then the environment, then flags; and what
// --print-config prints is a configuration file that reads back the same.
func TestSettingsPrecedence(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "agent.json")
	if err := os.WriteFile(file, []byte(`{"node_name": "from-file", "lease_duration": "10s", "join": ["10.0.0.1:7946"]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"agent", "--local", "--data-dir", dir, "--print-config", "--config", file}
	effective := func(environ []string, args ...string) fabric.Config {
		t.Helper()
		code, out, errs := runEnv(t, environ, append(append([]string{}, base...), args...)...)
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errs)
		}
		printed := filepath.Join(t.TempDir(), "printed.json")
		os.WriteFile(printed, []byte(out), 0o600)
		c, err := fabric.LoadConfigFile(printed, fabric.Config{})
		if err != nil {
			t.Fatalf("--print-config does not read back: %v\n%s", err, out)
		}
		return c
	}
	// The file may be named by KVFABRIC_CONFIG instead.
	code, out, errs := runEnv(t, []string{"KVFABRIC_CONFIG=" + file}, "agent", "--local", "--data-dir", dir, "--print-config")
	if code != 0 || !strings.Contains(out, `"node_name": "from-file"`) {
		t.Fatalf("KVFABRIC_CONFIG: exit %d: %s %s", code, out, errs)
	}
	c := effective(nil)
	if c.NodeName != "from-file" || c.LeaseDuration != 10*time.Second || len(c.Join) != 1 || c.PeerTimeout != 2*time.Second {
		t.Fatalf("file over defaults: %+v", c)
	}
	environ := []string{"KVFABRIC_NODE_NAME=from-env", "KVFABRIC_DEV_CA_DIR=/tmp/a,b", "KVFABRIC_JOIN=10.0.0.2:7946,10.0.0.3:7946", "KVFABRIC_IMPORT_CHUNK_BYTES=8MiB", "KVFABRIC_SOCKET=/elsewhere.sock"}
	c = effective(environ)
	if c.NodeName != "from-env" || len(c.Join) != 2 || c.ImportChunkBytes != 8<<20 || c.LeaseDuration != 10*time.Second || c.DevCADir != "/tmp/a,b" {
		t.Fatalf("environment over the file: %+v", c)
	}
	c = effective(environ, "--node", "from-flag", "--join", "10.0.0.4:7946", "--join", "10.0.0.5:7946", "--lease-duration", "20s")
	if c.NodeName != "from-flag" || strings.Join(c.Join, ",") != "10.0.0.4:7946,10.0.0.5:7946" || c.LeaseDuration != 20*time.Second || c.ImportChunkBytes != 8<<20 {
		t.Fatalf("flags over the environment: %+v", c)
	}
}

// What --print-config prints, given back as --config, is the same
// configuration, settings whose zero is not their default included:
// --tier-read-ahead 0 stays off, where the file left it out and read back
// it was 16 again; --dev=false stays so under --local.
func TestPrintConfigReadsBackTheSame(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name       string
		args, back []string
		want       string
	}{
		{"read-ahead off", []string{"--tier-read-ahead", "0"}, nil, `"tier_read_ahead": 0`},
		{"read-ahead off under --local", []string{"--tier-read-ahead", "0"}, []string{"--local"}, `"tier_read_ahead": 0`},
		{"no dev under --local", []string{"--dev=false", "--ca", "ca.crt", "--cert", "n1.crt", "--key", "n1.key"}, []string{"--local"}, `"dev": false,`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, printed, errs := runCmd(t, "", append([]string{"agent", "--local", "--data-dir", dir, "--print-config"}, tc.args...)...)
			if code != 0 || !strings.Contains(printed, tc.want) {
				t.Fatalf("exit %d (%s); want %s in:\n%s", code, errs, tc.want, printed)
			}
			file := filepath.Join(t.TempDir(), "printed.json")
			if err := os.WriteFile(file, []byte(printed), 0o600); err != nil {
				t.Fatal(err)
			}
			code, again, errs := runCmd(t, "", append([]string{"agent", "--print-config", "--config", file}, tc.back...)...)
			if code != 0 || again != printed {
				t.Fatalf("read back: exit %d (%s):\n%s\nwant as printed:\n%s", code, errs, again, printed)
			}
		})
	}
}

// --print-config writes each duration in the form --help gives it ("10m",
// not "10m0s"): the defaults it prints are the help's, word for word.
func TestPrintConfigDurationsAsTheHelpGivesThem(t *testing.T) {
	code, out, errs := runCmd(t, "", "agent", "--local", "--data-dir", t.TempDir(), "--print-config")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var printed map[string]any
	if err := json.Unmarshal([]byte(out), &printed); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	_, _, help := runCmd(t, "", "agent", "-h")
	for _, s := range agentSettings {
		d, ok := fabric.DurationSettingOf(s.field)
		if !ok {
			continue
		}
		want := fabric.Duration(d.Default).String()
		if got := printed[d.Key]; got != want || !strings.Contains(help, "(default "+want) {
			t.Errorf("%s: printed %q, want %q as --%s's help gives it", d.Key, got, want, s.flag)
		}
	}
}

// A size given as 0 by a flag or the environment is the default, as 0 in
// the file is: the only way back over a file's value to a default that no
// size spells (engine_quota's fair share, tier_block_bytes' first block).
func TestSizeZeroIsTheDefault(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "agent.json")
	if err := os.WriteFile(file, []byte(`{"engine_quota": 1073741824, "tier_block_bytes": 8388608, "import_chunk_bytes": 8388608}`), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errs := runEnv(t, []string{"KVFABRIC_TIER_BLOCK_BYTES=0"}, "agent", "--local", "--data-dir", dir, "--print-config", "--config", file,
		"--engine-quota", "0", "--import-chunk-bytes", "0")
	if code != 0 || strings.Contains(out, `"engine_quota"`) || strings.Contains(out, `"tier_block_bytes"`) || !strings.Contains(out, `"import_chunk_bytes": 67108864`) {
		t.Fatalf("exit %d (%s); want the defaults: no engine_quota or tier_block_bytes, import_chunk_bytes 64MiB:\n%s", code, errs, out)
	}
	if code, _, errs := runCmd(t, "", "agent", "--local", "--data-dir", dir, "--print-config", "--engine-quota", "none"); code != 2 || !strings.Contains(errs, "want a size such as 64MiB, or 0 for the default") {
		t.Fatalf("--engine-quota none: exit %d, %q", code, errs)
	}
}

// A misspelled or malformed variable is a usage error naming it.
func TestSettingsFromEnvironmentRefused(t *testing.T) {
	for _, tc := range []struct {
		environ []string
		want    string
	}{
		{[]string{"KVFABRIC_NODENAME=x"}, "KVFABRIC_NODENAME is not a setting"},
		{[]string{"KVFABRIC_LEASE_DURATION=soon"}, `KVFABRIC_LEASE_DURATION="soon": want a duration`},
		{[]string{"KVFABRIC_DEV=perhaps"}, `KVFABRIC_DEV="perhaps": want true or false`},
		{[]string{"KVFABRIC_MAX_LEASED=many"}, `KVFABRIC_MAX_LEASED="many": want a whole number`},
	} {
		code, _, errs := runEnv(t, tc.environ, "agent", "--local", "--print-config")
		if code != 2 || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d, %q; want 2 and %q", tc.environ, code, errs, tc.want)
		}
	}
	// The libraries' own path variables, which the library settings' help
	// names as their defaults, are not refused.
	environ := []string{"KVFABRIC_IBVERBS_LIB=/opt/rdma/libibverbs.so.1", "KVFABRIC_CUDA_LIB=/opt/cuda/libcuda.so.1"}
	if code, _, errs := runEnv(t, environ, "agent", "--local", "--print-config"); code != 0 {
		t.Errorf("%v: exit %d, %q; want 0", environ, code, errs)
	}
}

// The agent is non-dumpable unless --dumpable, KVFABRIC_DUMPABLE or the
// file's dumpable says otherwise.
func TestDumpableSetting(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "agent.json")
	if err := os.WriteFile(file, []byte(`{"dumpable": true}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		environ []string
		args    []string
		want    bool
	}{
		{"default", nil, nil, false},
		{"flag", nil, []string{"--dumpable"}, true},
		{"flag false", nil, []string{"--dumpable=false"}, false},
		{"environment", []string{"KVFABRIC_DUMPABLE=true"}, nil, true},
		{"file", nil, []string{"--config", file}, true},
		{"flag over file", nil, []string{"--config", file, "--dumpable=false"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"agent", "--local", "--data-dir", dir, "--print-config"}, tc.args...)
			code, out, errs := runEnv(t, tc.environ, args...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errs)
			}
			if got := strings.Contains(out, `"dumpable": true`); got != tc.want {
				t.Fatalf("dumpable %v, want %v:\n%s", got, tc.want, out)
			}
		})
	}
}

// --data-dir's help says where --dev keeps its CA as the agent does: in
// kvfabric-dev-ca beside the data directory, not in it.
func TestDevCABesideTheDataDir(t *testing.T) {
	dir := t.TempDir()
	code, out, errs := runCmd(t, "", "agent", "--local", "--data-dir", filepath.Join(dir, "data"), "--print-config")
	if want := `"dev_ca_dir": "` + filepath.Join(dir, "kvfabric-dev-ca") + `"`; code != 0 || !strings.Contains(out, want) {
		t.Fatalf("exit %d (%s); want %s in:\n%s", code, errs, want, out)
	}
	_, _, help := runCmd(t, "", "agent", "-h")
	if want := "directory for the engine socket; --dev keeps its development CA beside it, in kvfabric-dev-ca"; !strings.Contains(help, want) {
		t.Errorf("agent -h does not say %q:\n%s", want, help)
	}
	if strings.Contains(help, "engine socket and the development CA") {
		t.Errorf("agent -h says the development CA is in the data directory")
	}
}

// A directory setting that names a file, or a path through one, is a
// usage error naming the setting before anything starts, where the agent
// failed as it began to make the directory (exit status 1).
func TestDirectorySettingsThatAreFiles(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	below := filepath.Join(file, "d")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--tier", "disk=" + file + ":1GiB"}, `tiers[0] (--tier): "disk=` + file + `:1GiB": ` + file + ` is a file, not a directory`},
		{[]string{"--tier", "disk=" + filepath.Join(dir, "t") + ":1GiB", "--tier", "disk=" + below + ":1GiB"}, `tiers[1] (--tier): "disk=` + below + `:1GiB": ` + below + `: a file is on its way, not a directory`},
		{[]string{"--memory-dir", file}, "memory_dir (--memory-dir): " + file + " is a file, not a directory"},
		{[]string{"--data-dir", file}, "data_dir (--data-dir): " + file + " is a file, not a directory"},
		{[]string{"--data-dir", below}, "data_dir (--data-dir): " + below + ": a file is on its way, not a directory"},
	} {
		args := append([]string{"agent", "--local", "--data-dir", filepath.Join(dir, "data"), "--metrics-addr", "off", "--print-config"}, tc.args...)
		code, _, errs := runCmd(t, "", args...)
		if want := "kvfabric agent: fabric: invalid configuration: " + tc.want + "\n"; code != 2 || errs != want {
			t.Errorf("%v: exit %d, %q; want 2 and %q", tc.args, code, errs, want)
		}
	}
	// Directories, or paths that can be made, pass.
	code, _, errs := runCmd(t, "", "agent", "--local", "--data-dir", filepath.Join(dir, "data"), "--print-config",
		"--memory-dir", dir, "--tier", "disk="+filepath.Join(dir, "new", "t")+":1GiB")
	if code != 0 {
		t.Fatalf("directories: exit %d: %s", code, errs)
	}
}

// The systemd unit's ExecStart is a command line the agent takes with the
// example configuration, and every flag its comments name is the agent's;
// they say how engines of another user reach the socket (the socket's
// mode and group), which they once said could not be configured.
func TestSystemdUnit(t *testing.T) {
	b, err := os.ReadFile("../../deploy/systemd/kvfabric.service")
	if err != nil {
		t.Fatal(err)
	}
	unit := string(b)
	_, _, help := runCmd(t, "", "agent", "-h")
	// The install steps, indented in the first comment, are other
	// programs' command lines.
	agent := regexp.MustCompile(`(?m)^#\s{2,}.*$`).ReplaceAllString(unit, "")
	named := map[string]bool{}
	for _, f := range regexp.MustCompile(`--([a-z][a-z-]*)`).FindAllStringSubmatch(agent, -1) {
		named[f[1]] = true
		if !strings.Contains(help, "\n  -"+f[1]+" ") && !strings.Contains(help, "\n  -"+f[1]+"\n") {
			t.Errorf("the unit names --%s, which kvfabric agent does not take", f[1])
		}
	}
	for _, f := range []string{"engine-socket-mode", "engine-socket-group"} {
		if !named[f] {
			t.Errorf("the unit does not say that --%s lets engines of another user in", f)
		}
	}
	if strings.Contains(unit, "once the socket group is configurable") || strings.Contains(unit, "the pool's files") {
		t.Errorf("the unit says what the agent does not do:\n%s", unit)
	}
	exec := regexp.MustCompile(`(?m)^ExecStart=\S+ (.*)$`).FindStringSubmatch(unit)
	if exec == nil {
		t.Fatal("no ExecStart line")
	}
	args := strings.Fields(strings.NewReplacer("%H", "gpu-node-07", "/etc/kvfabric/agent.json", "../../deploy/agent.json").Replace(exec[1]))
	if code, _, errs := runCmd(t, "", append(args, "--print-config")...); args[0] != "agent" || code != 0 {
		t.Fatalf("ExecStart %v: exit %d: %s", args, code, errs)
	}
}
