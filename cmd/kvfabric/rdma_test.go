//go:build cgo && linux

package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvfabric/kvfabric/rdma"
	"github.com/kvfabric/kvfabric/rdma/softverbs"
)

func TestRDMADevicesOnSoftverbs(t *testing.T) {
	dir := t.TempDir()
	lib, err := softverbs.Build(filepath.Join(dir, "lib"))
	if err != nil {
		t.Fatalf("softverbs: %v", err)
	}
	// softverbs reads its settings from the process environment.
	t.Setenv("SOFTVERBS_REGISTRY", filepath.Join(dir, "registry"))
	t.Setenv("SOFTVERBS_DEVICES", "sv0,sv1")
	t.Setenv("SOFTVERBS_GID_ADDR", "10.9.8.7")
	t.Setenv(rdma.EnvLibrary, lib)

	code, out, errs := runCmd(t, "", "rdma", "devices")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "DEVICE") {
		t.Fatalf("table:\n%s", out)
	}
	for i, name := range []string{"sv0", "sv1"} {
		f := strings.Fields(lines[i+1])
		if f[0] != name || f[1] != "1" || f[2] != "active" || f[3] != "ethernet" || !strings.Contains(lines[i+1], "3 0000:0000:0000:0000:0000:ffff:0a09:0807 (RoCE v2)") {
			t.Fatalf("row %q", lines[i+1])
		}
	}

	code, out, errs = runCmd(t, "", "rdma", "devices", "--json")
	if code != 0 {
		t.Fatalf("--json: exit %d: %s", code, errs)
	}
	var devs []struct {
		Name  string `json:"name"`
		Ports []struct {
			State string `json:"state"`
			GIDs  []struct {
				Index int    `json:"index"`
				Type  string `json:"type"`
			} `json:"gids"`
		} `json:"ports"`
	}
	if err := json.Unmarshal([]byte(out), &devs); err != nil {
		t.Fatalf("--json output: %v\n%s", err, out)
	}
	if len(devs) != 2 || devs[1].Name != "sv1" || devs[1].Ports[0].State != "active" || len(devs[1].Ports[0].GIDs) != 4 {
		t.Fatalf("--json: %+v", devs)
	}
}
