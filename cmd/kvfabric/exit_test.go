package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Every command exits 0 when all is done, 1 when some or all blocks are
// not available (or the work failed), 2 for usage and configuration
// errors, as main.go's table says.
func TestExitCodes(t *testing.T) {
	a := startTestAgent(t, "exit1")
	sock := []string{"--socket", a.EngineSocket()}
	noAgent := []string{"--socket", filepath.Join(t.TempDir(), "none.sock")}
	dir := t.TempDir()
	badJSON := filepath.Join(dir, "bad.json")
	os.WriteFile(badJSON, []byte(`{"node_name": 7`), 0o644)
	unknownKey := filepath.Join(dir, "unknown.json")
	os.WriteFile(unknownKey, []byte(`{"no_such_setting": 1}`), 0o644)
	ex := filepath.Join("..", "..", "examples", "layouts") + "/"

	code, out, errs := runCmd(t, "", append([]string{"put", "--generate", "3", "--json"}, sock...)...)
	if code != 0 {
		t.Fatalf("put: exit %d: %s", code, errs)
	}
	var put struct {
		BlockSet string `json:"block_set"`
		Hashes   []string
	}
	if err := json.Unmarshal([]byte(out), &put); err != nil || len(put.Hashes) != 3 {
		t.Fatalf("put --json: %q %v", out, err)
	}
	waitIndexed(t, a, put.BlockSet, put.Hashes)
	held := strings.Join(put.Hashes, ",")
	partly := held + ",12345"
	caDir := filepath.Join(dir, "ca")

	for _, tc := range []struct {
		args []string
		want int
	}{
		{[]string{}, 2},
		{[]string{"no-such-command"}, 2},
		{[]string{"--help"}, 0},
		{[]string{"--version"}, 0},
		{[]string{"version"}, 0},
		{[]string{"version", "--bogus"}, 2},

		{[]string{"agent", "--bogus"}, 2},
		{[]string{"agent", "--config", filepath.Join(dir, "missing.json")}, 2},
		{[]string{"agent", "--config", badJSON}, 2},
		{[]string{"agent", "--config", unknownKey}, 2},
		{[]string{"agent", "--local", "--data-dir", filepath.Join(dir, "a"), "--engine-socket-group", "kvfabric-no-such-group"}, 2},
		{[]string{"agent", "--local", "--data-dir", filepath.Join(dir, "a"), "--engine-socket-mode", "0666"}, 2},
		{[]string{"agent", "--local", "--print-config"}, 0},
		{[]string{"agent", "--local", "--data-dir", filepath.Join(dir, "a"), "--pool", "host=64"}, 2},          // a unit left out
		{[]string{"agent", "--local", "--data-dir", filepath.Join(dir, "a"), "--pool", "host=16777216TiB"}, 2}, // past any machine's memory
		{[]string{"agent", "--local", "--data-dir", filepath.Join(dir, "a"), "--tier", "host=1TiB"}, 2},        // more memory than is available

		{[]string{"certs"}, 2},
		{[]string{"certs", "ca", "--out", caDir}, 0},
		{[]string{"certs", "ca", "--out", caDir}, 1}, // exists

		{[]string{"hash", "--block-size", "2", "1", "2"}, 0},
		{[]string{"hash", "--block-size", "0", "1"}, 2},

		{[]string{"plan", "--src", ex + "llama70b-tp4-hnd.json", "--dst", ex + "llama70b-tp2-hnd.json"}, 0},
		{[]string{"plan", "--src", filepath.Join(dir, "missing.json"), "--dst", ex + "llama70b-tp2-hnd.json"}, 2},
		{[]string{"plan", "--src", badJSON, "--dst", ex + "llama70b-tp2-hnd.json"}, 2},

		{append([]string{"members"}, sock...), 0},
		{append([]string{"members"}, noAgent...), 1},
		{append([]string{"members", "--bogus"}, sock...), 2},
		{append([]string{"status", "--json"}, sock...), 0},
		{append([]string{"status"}, noAgent...), 1},
		{append([]string{"status", "extra"}, sock...), 2},
		{append([]string{"members", "extra"}, sock...), 2},

		{append([]string{"put", "--generate", "1"}, sock...), 0},
		{append([]string{"put", "--generate", "1"}, noAgent...), 1},
		{append([]string{"put", "--generate", "-1"}, sock...), 2},

		{append([]string{"lookup", "--hashes", held}, sock...), 0},
		{append([]string{"lookup", "--hashes", partly}, sock...), 1},
		{append([]string{"lookup", "--hashes", "x"}, sock...), 2},
		{append([]string{"lookup", "--hashes", held + ",,12345"}, sock...), 2}, // an empty entry: it named one block fewer
		{append([]string{"lookup", "--hashes", held + ","}, sock...), 2},
		{append([]string{"import", "--hashes", "," + held}, sock...), 2},
		{append([]string{"lookup", "--hashes", " "}, sock...), 2},
		{append([]string{"lookup", "--hashes", strings.ReplaceAll(held, ",", ", ")}, sock...), 0}, // spaces around the commas

		{append([]string{"import", "--hashes", held}, sock...), 0},
		{append([]string{"import", "--hashes", partly}, sock...), 1},
		{append([]string{"import", "--hashes", "12345"}, sock...), 1},
		{append([]string{"import", "--hashes", held}, noAgent...), 1},
		{append([]string{"import", "--hashes", held, "--order", "XYZ"}, sock...), 2},

		{append([]string{"get", "--hashes", held, "--out", filepath.Join(dir, "out.bin"), "--verify"}, sock...), 0},
		{append([]string{"get", "--hashes", partly, "--out", filepath.Join(dir, "out.bin")}, sock...), 1},
		{append([]string{"get", "--hashes", held}, sock...), 2}, // no --out
	} {
		code, _, errs := runCmd(t, "", tc.args...)
		if code != tc.want {
			t.Errorf("kvfabric %s: exit %d, want %d (stderr %q)", strings.Join(tc.args, " "), code, tc.want, errs)
		}
	}
}

// Every --json output writes hashes (and other 64-bit integers) as
// strings, never as JSON numbers a reader may round.
func TestJSONHashesAreStrings(t *testing.T) {
	a := startTestAgent(t, "json1")
	sock := []string{"--socket", a.EngineSocket()}
	code, out, errs := runCmd(t, "", append([]string{"put", "--generate", "2", "--json"}, sock...)...)
	if code != 0 {
		t.Fatalf("put: exit %d: %s", code, errs)
	}
	var put struct {
		BlockSet string `json:"block_set"`
		Hashes   []string
	}
	if err := json.Unmarshal([]byte(out), &put); err != nil || len(put.Hashes) != 2 || put.BlockSet == "" {
		t.Fatalf("put --json: %q %v", out, err)
	}
	waitIndexed(t, a, put.BlockSet, put.Hashes)
	held := strings.Join(put.Hashes, ",")
	number := regexp.MustCompile(`"(hash|hashes|blockSet|block_set|slot)"\s*:\s*\[?\s*[0-9]{6,}`)
	for _, args := range [][]string{
		{"put", "--generate", "2", "--json"},
		{"lookup", "--hashes", held, "--json"},
		{"import", "--hashes", held, "--json"},
		{"status", "--json"},
		{"members", "--json"},
	} {
		code, out, errs := runCmd(t, "", append(args, sock...)...)
		if code != 0 || !json.Valid([]byte(out)) {
			t.Fatalf("%v: exit %d, %q %s", args, code, out, errs)
		}
		if m := number.FindString(out); m != "" {
			t.Errorf("%v: a 64-bit integer as a JSON number: %s", args, m)
		}
		if args[0] == "lookup" || args[0] == "import" {
			if !strings.Contains(out, `"`+put.Hashes[0]+`"`) {
				t.Errorf("%v: hash %s not written as a string: %s", args, put.Hashes[0], out)
			}
		}
	}
}

// An import shows a progress line on stderr when stderr is a terminal,
// and none otherwise.
func TestImportProgressLine(t *testing.T) {
	a := startTestAgent(t, "prog1")
	sock := []string{"--socket", a.EngineSocket()}
	code, out, errs := runCmd(t, "", append([]string{"put", "--generate", "4"}, sock...)...)
	if code != 0 {
		t.Fatalf("put: exit %d: %s", code, errs)
	}
	hashes := strings.TrimSpace(out)
	var stdout, stderr strings.Builder
	e := &env{stdin: strings.NewReader(""), stdout: &stdout, stderr: &stderr, progress: true}
	if code := run(e, append([]string{"import", "--hashes", hashes}, sock...)); code != 0 {
		t.Fatalf("import: exit %d: %s", code, stderr.String())
	}
	if !strings.Contains(stderr.String(), "imported 4 of 4 blocks in ") {
		t.Fatalf("no progress line on a terminal: %q", stderr.String())
	}
	code, _, errs = runCmd(t, "", append([]string{"import", "--hashes", hashes}, sock...)...)
	if code != 0 || strings.Contains(errs, "imported") {
		t.Fatalf("progress written to a non-terminal: exit %d, %q", code, errs)
	}
}

// An argument a command takes none of is a usage error naming it, before
// anything is written, as for the other commands; so is an empty CA name,
// which exited 1 as a failure.
func TestExtraArgumentsRefused(t *testing.T) {
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca")
	if code, _, errs := runCmd(t, "", "certs", "ca", "--out", ca); code != 0 {
		t.Fatalf("certs ca: exit %d: %s", code, errs)
	}
	out := filepath.Join(dir, "out")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"version", "extra"}, `kvfabric version: unexpected argument "extra"`},
		{[]string{"--version", "extra"}, `kvfabric version: unexpected argument "extra"`},
		{[]string{"certs", "ca", "--out", out, "extra"}, `kvfabric certs: unexpected argument "extra"`},
		{[]string{"certs", "ca", "--out", out, "--name", ""}, `kvfabric certs: --name: the CA's name is empty`},
		{[]string{"certs", "node", "n1", "--ca-cert", filepath.Join(ca, "ca.crt"), "--ca-key", filepath.Join(ca, "ca.key"), "--out", out, "extra"},
			`kvfabric certs: unexpected argument "extra"`},
		{[]string{"certs", "node", "n1", "--ca-cert", filepath.Join(ca, "ca.crt"), "extra", "--out", out},
			`kvfabric certs: unexpected argument "extra"`},
	} {
		code, stdout, errs := runCmd(t, "", tc.args...)
		if code != 2 || errs != tc.want+"\n" || stdout != "" {
			t.Errorf("kvfabric %s: exit %d, %q %q; want 2 and %q", strings.Join(tc.args, " "), code, stdout, errs, tc.want)
		}
		if _, err := os.Stat(out); !os.IsNotExist(err) {
			t.Fatalf("kvfabric %s wrote %s: %v", strings.Join(tc.args, " "), out, err)
		}
	}
}
