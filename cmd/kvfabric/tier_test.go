package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// --tier is repeatable and read back by --print-config; a bad tier or tier
// setting is a usage error naming it and what is wrong.
func TestTierFlags(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	code, out, errs := runCmd(t, "", "agent", "--local", "--data-dir", dir, "--print-config",
		"--tier", "disk="+a+":1GiB", "--tier", "disk="+b+":16MiB", "--tier-watermark", "0.8", "--tier-queue", "4096", "--tier-in-flight", "1")
	if code != 0 || !strings.Contains(out, `"disk=`+a+`:1GiB"`) || !strings.Contains(out, `"disk=`+b+`:16MiB"`) ||
		!strings.Contains(out, `"tier_watermark": 0.8`) || !strings.Contains(out, `"tier_queue": 4096`) ||
		!strings.Contains(out, `"tier_in_flight": 1`) {
		t.Fatalf("--print-config: exit %d: %s %s", code, out, errs)
	}
	// A comma in a path given by the flag is the path's: the flag is
	// repeated for each tier, not comma-separated as the environment's
	// list is.
	comma := filepath.Join(dir, "a,b")
	code, out, errs = runCmd(t, "", "agent", "--local", "--data-dir", dir, "--print-config", "--tier", "disk="+comma+":1GiB")
	if code != 0 || !strings.Contains(out, `"tiers": [`+"\n"+`    "disk=`+comma+`:1GiB"`+"\n"+`  ]`) {
		t.Fatalf("--tier with a comma in its path: exit %d (%s), want one tier of that path:\n%s", code, errs, out)
	}
	code, out, errs = runEnv(t, []string{"KVFABRIC_TIERS=disk=" + a + ":1GiB,host=16MiB"}, "agent", "--local", "--data-dir", dir, "--print-config")
	if code != 0 || !strings.Contains(out, `"disk=`+a+`:1GiB"`) || !strings.Contains(out, `"host=16MiB"`) {
		t.Fatalf("KVFABRIC_TIERS of two tiers: exit %d (%s):\n%s", code, errs, out)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--tier", "disk=relative:1GiB"}, `tiers[0] (--tier): "disk=relative:1GiB": path "relative" is not absolute`},
		{[]string{"--tier", "disk=" + a + ":1MiB"}, "size 1048576 is not in 16777216 (16MiB)"},
		{[]string{"--tier", "disk=" + a + ":1001GiB"}, "is not in 16777216 (16MiB)..1073741824000 (1000GiB)"},
		{[]string{"--tier", "nvme=" + a + ":1GiB"}, `unknown tier kind "nvme"`},
		{[]string{"--tier", "disk=" + a + ":1GiB", "--tier", "disk=" + a + ":1GiB"}, "tiers[1]"},
		{[]string{"--tier-watermark", "1.5"}, "tier_watermark (--tier-watermark): 1.5 is not in (0, 1]"},
		{[]string{"--tier-watermark", "most"}, "--tier-watermark \"most\": want a number"},
		{[]string{"--tier-queue", "4097"}, "tier_queue (--tier-queue): 4097 is not in 1..4096"},
		{[]string{"--tier-in-flight", "1.01"}, "tier_in_flight (--tier-in-flight): 1.01 is not in (0, 1]"},
		{[]string{"--tier-watermark", "NaN"}, "tier_watermark (--tier-watermark): NaN is not in (0, 1]"},
		{[]string{"--tier-in-flight", "nan"}, "tier_in_flight (--tier-in-flight): NaN is not in (0, 1]"},
		{[]string{"--tier-staging-slots", "4097"}, "tier_staging_slots (--tier-staging-slots): 4097 is not in 1..4096"},
		{[]string{"--tier-block-bytes", "2GiB"}, "tier_block_bytes"},
		// One tier a flag: a comma is part of a path, not a list.
		{[]string{"--tier", "disk=" + a + ":1GiB,host=16MiB"}, `tiers[0] (--tier): "disk=` + a + `:1GiB,host=16MiB": size "1GiB,host=16MiB" holds a comma: one tier an entry`},
		{[]string{"--tier", "disk=" + a + ":1GiB,disk=" + a + "2:2GiB"}, `tiers[0] (--tier): "disk=` + a + `:1GiB,disk=` + a + `2:2GiB": two tiers in one entry`},
	} {
		// --print-config: a value wrongly accepted prints the settings
		// instead of starting an agent.
		args := append([]string{"agent", "--local", "--data-dir", filepath.Join(dir, "d"), "--print-config"}, tc.args...)
		code, _, errs := runCmd(t, "", args...)
		if code != 2 || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d, %q; want 2 and %q", tc.args, code, errs, tc.want)
		}
	}
}
