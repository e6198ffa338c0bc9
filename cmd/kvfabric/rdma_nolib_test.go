package main

import (
	"path/filepath"
	"strings"
	"testing"
)

func TestRDMADevicesWithoutRDMA(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "libibverbs.so.1")
	code, _, errs := runCmd(t, "", "rdma", "devices", "--library", missing)
	// A build without cgo says so instead of naming the library.
	if code != 1 || !strings.Contains(errs, "RDMA is off") {
		t.Fatalf("exit %d, stderr %q; want 1 saying RDMA is off", code, errs)
	}
	for _, args := range [][]string{{"rdma"}, {"rdma", "bogus"}, {"rdma", "devices", "extra"}, {"rdma", "--json"}} {
		if code, _, errs := runCmd(t, "", args...); code != 2 {
			t.Errorf("%v: exit %d (%s), want 2", args, code, errs)
		}
	}
}
