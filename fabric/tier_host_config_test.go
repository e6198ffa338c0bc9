package fabric

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvfabric/kvfabric/pool/disk"
)

// The host tier's setting: its size at and past its limits, its syntax,
// and one at most; each refusal names its field and what is wrong.
func TestValidateHostTierConfig(t *testing.T) {
	defer func() { hostTierMemory = readHostMemory }()
	for _, tc := range []struct {
		name  string
		tiers []string
		field string // "" when valid
		says  string
		avail uint64 // the memory available (0: 2TiB)
		noMem bool   // the memory available cannot be read
	}{
		{"alone", []string{"host=64GiB"}, "", "", 0, false},
		{"with disk tiers", []string{"disk=/d:1GiB", "host=1GiB", "disk=/e:1GiB"}, "", "", 0, false},
		{"size at its floor", []string{"host=16MiB"}, "", "", 0, false},
		{"size a byte under its floor", []string{fmt.Sprintf("host=%d", MinHostTierBytes-1)}, "tiers[0]", "not in 16777216 (16MiB)", 0, false},
		{"size at its ceiling", []string{"host=1TiB"}, "", "", 0, false},
		{"size a byte over its ceiling", []string{fmt.Sprintf("host=%d", MaxHostTierBytes+1)}, "tiers[0]", "(1TiB)", 0, false},
		{"no size", []string{"host="}, "tiers[0]", "no size", 0, false},
		{"bad size", []string{"host=lots"}, "tiers[0]", "not a positive number", 0, false},
		{"a path", []string{"host=/d:1GiB"}, "tiers[0]", "not a positive number", 0, false},
		{"no kind", []string{"host"}, "tiers[0]", "host=SIZE", 0, false},
		{"two host tiers", []string{"host=1GiB", "disk=/d:1GiB", "host=2GiB"}, "tiers[2]", "a second host tier (tiers[0])", 0, false},
		{"size at the memory available", []string{"host=1GiB"}, "", "", 1 << 30, false},
		{"size a byte past the memory available", []string{fmt.Sprintf("host=%d", 1<<30+1)}, "tiers[0]",
			"host tier of 1073741825 bytes is more than the 1073741824 bytes of memory available (test)", 1 << 30, false},
		{"memory available not known", []string{"host=1TiB"}, "", "", 0, true},
	} {
		avail := tc.avail
		if avail == 0 {
			avail = 2 << 40
		}
		hostTierMemory = func() (uint64, string, error) {
			if tc.noMem {
				return 0, "", errors.New("no /proc/meminfo")
			}
			return avail, "test", nil
		}
		c := DefaultLocalConfig()
		c.Tiers = tc.tiers
		c.populate()
		_, err := c.validate()
		switch {
		case tc.field == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.field != "" && (!errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.field+":") || !strings.Contains(err.Error(), tc.says)):
			t.Errorf("%s: %v, want ErrConfig naming %s and saying %q", tc.name, err, tc.field, tc.says)
		}
	}
}

// The host tier comes first in the tiers' order, wherever it is
// configured; the disk tiers keep theirs.
func TestHostTierComesFirst(t *testing.T) {
	c := DefaultLocalConfig()
	c.Tiers = []string{"disk=/d:1GiB", "disk=/e:1GiB", "host=1GiB"}
	var got []string
	for _, s := range c.tierSpecs() {
		got = append(got, s.Kind+":"+s.Path)
	}
	if want := "host: disk:/d disk:/e"; strings.Join(got, " ") != want {
		t.Fatalf("tiers in the order %q, want %q", got, want)
	}
}

// The memory a host tier may take is read from this machine: some, and
// where the figure came from.
func TestReadHostMemory(t *testing.T) {
	n, from, err := readHostMemory()
	if err != nil || n == 0 || from == "" {
		t.Fatalf("readHostMemory: %d bytes from %q, %v", n, from, err)
	}
}

// A host tier whose memory the kernel refuses to map (overcommit refused)
// is an error when the tiers open at start, naming the tier, not a tier
// missing later; one it maps opens.
func TestHostTierMemoryRefusedAtStart(t *testing.T) {
	defer func() { probeHostMemory = disk.ProbeMem }()
	a := &Agent{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	specs := []TierSpec{{Kind: tierHost, Size: 1 << 30}}
	probeHostMemory = func(n int64) error {
		return fmt.Errorf("disk: host memory of %d bytes: %w", n, unix.ENOMEM)
	}
	if tr, err := openTiers(a, specs); err == nil || !errors.Is(err, unix.ENOMEM) || !strings.Contains(err.Error(), "tiers[0] host") {
		if tr != nil {
			tr.close()
		}
		t.Fatalf("tiers opened with the host tier's memory refused: %v, want ENOMEM naming tiers[0] host", err)
	}
	probeHostMemory = disk.ProbeMem
	tr, err := openTiers(a, specs)
	if err != nil {
		t.Fatalf("tiers with a host tier of 1GiB: %v", err)
	}
	tr.close()
}
