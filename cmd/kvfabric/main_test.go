package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func runCmd(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(&env{stdin: strings.NewReader(stdin), stdout: &out, stderr: &errb}, args)
	return code, out.String(), errb.String()
}

const knownHashes = `0 14643705804678351452 14643705804678351452
1 16777012769546811212 4945711292740353085
2 483935686894639516 12583592247330656132
`

func TestHashCommand(t *testing.T) {
	code, out, errs := runCmd(t, "", "hash", "--block-size", "4", "1", "2", "3", "4", "5,6,7,8", "9", "10", "11", "12", "13")
	if code != 0 || out != knownHashes {
		t.Fatalf("exit %d, stdout:\n%s\nstderr: %s", code, out, errs)
	}
	code, out, _ = runCmd(t, "1,2,3,4\n5 6\t7 8\r\n9,10,11,12,\n\n13", "hash", "--block-size=4")
	if code != 0 || out != knownHashes {
		t.Fatalf("from stdin: exit %d, stdout:\n%s", code, out)
	}
	code, salted, _ := runCmd(t, "", "hash", "--block-size", "4", "--salt", "m", "--lora", "a", "1", "2", "3", "4")
	if code != 0 || salted == "" || strings.Contains(knownHashes, strings.Fields(salted)[1]) {
		t.Fatalf("salted hash: exit %d, %q", code, salted)
	}
}

func TestUsageErrors(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"no command", nil, ""},
		{"unknown command", []string{"frobnicate"}, `unknown command "frobnicate"`},
		{"zero block size", []string{"hash", "--block-size", "0", "1"}, "--block-size 0"},
		{"token not a number", []string{"hash", "--block-size", "2", "1", "two"}, `token 1: "two" is not a u32`},
		{"token too large", []string{"hash", "--block-size", "2", "4294967296"}, `"4294967296" is not a u32`},
		{"negative token", []string{"hash", "--block-size", "2", "-1"}, "not defined: -1"},
		{"unknown flag", []string{"hash", "--nope"}, "not defined: -nope"},
		{"plan without files", []string{"plan"}, "--src and --dst are required"},
		{"plan extra argument", []string{"plan", "--src", "a", "--dst", "b", "c"}, `unexpected argument "c"`},
		{"import chunk not a size", []string{"agent", "--local", "--import-chunk-bytes", "lots"}, `--import-chunk-bytes "lots"`},
		// Refused by the configuration's bounds before anything starts.
		{"import chunk under its floor", []string{"agent", "--local", "--data-dir", "/nonexistent/kvf", "--import-chunk-bytes", "1048575"}, "import_chunk_bytes (--import-chunk-bytes): 1048575 is not in 1048576.."},
		{"import chunk over its ceiling", []string{"agent", "--local", "--data-dir", "/nonexistent/kvf", "--import-chunk-bytes", "4294967297"}, "import_chunk_bytes (--import-chunk-bytes): 4294967297 is not in"},
		{"negative lease cap", []string{"agent", "--local", "--data-dir", "/nonexistent/kvf", "--max-leased-per-peer", "-1"}, "max_leased_per_peer (--max-leased-per-peer): -1 is negative"},
		{"unknown log format", []string{"agent", "--local", "--data-dir", "/nonexistent/kvf", "--log-format", "xml"}, `log_format (--log-format): "xml" is not text or json`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errs := runCmd(t, "", tc.args...)
			if code != 2 {
				t.Fatalf("exit %d, want 2 (stderr %q)", code, errs)
			}
			if tc.want != "" && (!strings.Contains(errs, tc.want) || strings.Count(errs, "\n") != 1) {
				t.Fatalf("stderr %q: want one line containing %q", errs, tc.want)
			}
		})
	}
	if code, _, errs := runCmd(t, "", "hash", "--block-size", "4", "1", "x"); code != 2 || strings.Contains(errs, "Flags:") {
		t.Fatalf("a usage error printed the help: %q", errs)
	}
}

func TestHelp(t *testing.T) {
	for _, c := range []string{"hash", "plan", "version"} {
		code, _, errs := runCmd(t, "", c, "-h")
		if code != 0 || !strings.Contains(errs, "Usage: kvfabric "+c) || strings.Count(errs, "Usage:") != 1 {
			t.Errorf("%s -h: exit %d, help %q", c, code, errs)
		}
	}
}

func TestPlanCommand(t *testing.T) {
	ex := "../../examples/layouts/"
	code, out, errs := runCmd(t, "", "plan", "--src", ex+"llama70b-tp4-hnd.json", "--dst", ex+"llama70b-tp2-hnd.json", "--blocks", "1000")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	// TP 4 -> 2, HND: each destination rank gathers two source ranks, one
	// strided descriptor each, of 8 KiB pieces (2 heads x 16 tokens x 128 x bf16).
	for _, want := range []string{"1000 source blocks", "4.9 GiB", "0          2         2  320000  2.4 GiB   8.0 KiB  8.0 KiB"} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}

	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	os.WriteFile(bad, []byte(`{"version": 1, "pageSize": 16}`), 0o600)
	code, _, errs = runCmd(t, "", "plan", "--src", bad, "--dst", ex+"llama70b-tp2-hnd.json")
	if code != 2 || !strings.Contains(errs, "bad.json") || !strings.Contains(errs, "model") {
		t.Errorf("invalid layout: exit %d, %q", code, errs)
	}
	code, _, errs = runCmd(t, "", "plan", "--src", ex+"llama70b-tp4-hnd.json", "--dst", ex+"llama70b-tp2-hnd.json", "--blocks", "2000")
	if code != 2 || !strings.Contains(errs, "at most 1024") {
		t.Errorf("too many blocks: exit %d, %q", code, errs)
	}
	code, _, errs = runCmd(t, "", "plan", "--src", ex+"llama70b-tp2-nhd.json", "--dst", ex+"llama70b-tp8-nhd-page32-layers.json", "--blocks", "3")
	if code != 2 || !strings.Contains(errs, "multiple of 2") {
		t.Errorf("odd blocks for a page ratio of 2: exit %d, %q", code, errs)
	}
	code, _, errs = runCmd(t, "", "plan", "--src", filepath.Join(dir, "missing.json"), "--dst", bad)
	if code != 2 || !strings.Contains(errs, "missing.json") {
		t.Errorf("missing file: exit %d, %q", code, errs)
	}
}

// kvfabric version and kvfabric --version print the same line.
func TestVersion(t *testing.T) {
	code, a, _ := runCmd(t, "", "version")
	code2, b, _ := runCmd(t, "", "--version")
	if code != 0 || code2 != 0 || a != b || !strings.HasPrefix(a, "kvfabric ") || !strings.Contains(a, "go1.") {
		t.Fatalf("version: %d %q; --version: %d %q", code, a, code2, b)
	}
}
