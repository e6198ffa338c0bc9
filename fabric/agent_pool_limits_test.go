package fabric

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Pool sizes at and past MinPoolBytes, and a size with its unit left out.
func TestPoolSpecFloor(t *testing.T) {
	for _, tc := range []struct {
		spec string
		ok   bool
	}{
		{"host=1MiB", true},
		{fmt.Sprintf("host=%d", MinPoolBytes), true},
		{fmt.Sprintf("host=%d", MinPoolBytes-1), false},
		{"host=64", false},
		{"pinned=1023KiB", false},
		{"device=1MiB", true},
		{"device:0=4096", false},
		{"device=0.01", true}, // a fraction is sized against the GPU at start
	} {
		_, err := ParsePoolSpec(tc.spec)
		if (err == nil) != tc.ok {
			t.Errorf("ParsePoolSpec(%q): %v, want ok=%v", tc.spec, err, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "below the smallest pool") {
			t.Errorf("ParsePoolSpec(%q): %q does not say the pool is too small", tc.spec, err)
		}
	}
	c := DefaultLocalConfig()
	c.Pools = []string{"host=64"}
	c.populate()
	if _, err := c.validate(); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "pools[0]") {
		t.Fatalf("a 64-byte pool validates: %v", err)
	}
}

// A pool fits memory of its size exactly, and not a byte more.
func TestPoolFits(t *testing.T) {
	const avail = 24 << 30
	if err := checkPoolFits("host", avail, "this machine's memory", avail); err != nil {
		t.Fatalf("a pool of all the memory: %v", err)
	}
	err := checkPoolFits("host", avail+1, "this machine's memory", avail)
	var se *SettingError
	if !errors.As(err, &se) || se.Key != "pools" || !errors.Is(err, ErrConfig) ||
		err.Error() != "fabric: invalid configuration: pools: a host pool of 25769803777 bytes is more than this machine's memory (25769803776 bytes)" {
		t.Fatalf("a pool a byte larger than the memory: %v (%T), want a SettingError about pools", err, err)
	}
}

// An agent asked for a host pool larger than the machine's memory, or
// than the file system of its memory directory, refuses to start and
// says so.
func TestAgentRefusesPoolPastMemory(t *testing.T) {
	mem, err := hostMemory()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "kvfpool")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	memDir := filepath.Join(dir, "mem")
	if err := os.Mkdir(memDir, 0o755); err != nil {
		t.Fatal(err)
	}
	fs, err := fsSize(memDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, memoryDir string
		size            uint64
		want            string
	}{
		{"past the machine's memory", "", mem + 1<<20, "more than this machine's memory"},
		{"past the memory directory's file system", memDir, min(mem, fs) + 1<<20, "more than "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultLocalConfig()
			c.NodeName, c.DataDir, c.DevCADir = "big", filepath.Join(dir, "d"), filepath.Join(dir, "ca")
			c.GossipAddr, c.PeerAddr, c.MetricsAddr = "127.0.0.1:0", "127.0.0.1:0", "off"
			c.MemoryDir = tc.memoryDir
			c.Pools = []string{fmt.Sprintf("host=%d", tc.size)}
			c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
			a, err := Start(context.Background(), c)
			if err == nil {
				a.Close()
				t.Fatalf("an agent with a host pool of %d bytes started (memory %d, file system %d)", tc.size, mem, fs)
			}
			var se *SettingError
			if !errors.As(err, &se) || se.Key != "pools" || !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("start: %v (%T), want a SettingError about pools saying %q", err, err, tc.want)
			}
		})
	}
}
