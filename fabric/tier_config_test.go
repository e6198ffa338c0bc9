package fabric

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvfabric/kvfabric/pool/disk"
)

// The tier settings: each refusal names its field and what is wrong; every
// limit holds at the limit and refuses one past it.
func TestValidateTierConfig(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	tiers := func(n int) []string {
		var out []string
		for i := range n {
			out = append(out, fmt.Sprintf("disk=/nvme/t%d:1GiB", i))
		}
		return out
	}
	for _, tc := range []struct {
		name  string
		mut   func(c *Config)
		field string // "" when valid
		says  string
	}{
		{"none", func(c *Config) {}, "", ""},
		{"one", func(c *Config) { c.Tiers = []string{"disk=/nvme/kvfabric:512GiB"} }, "", ""},
		{"a colon in the path", func(c *Config) { c.Tiers = []string{"disk=/nvme/a:b:1GiB"} }, "", ""},
		{"a comma in the path", func(c *Config) { c.Tiers = []string{"disk=/nvme/a,b:1GiB"} }, "", ""},
		{"two tiers in one entry", func(c *Config) { c.Tiers = []string{"disk=/nvme/a:1GiB,host=1GiB"} }, "tiers[0]", "holds a comma: one tier an entry"},
		{"two disk tiers in one entry", func(c *Config) { c.Tiers = []string{"disk=/nvme/a:1GiB,disk=/nvme/b:2GiB"} }, "tiers[0]", "two tiers in one entry"},
		{"host then disk in one entry", func(c *Config) { c.Tiers = []string{"disk=/nvme/a,host=1GiB,disk=/b:2GiB"} }, "tiers[0]", "two tiers in one entry"},
		{"size at its floor", func(c *Config) { c.Tiers = []string{"disk=/d:16MiB"} }, "", ""},
		{"size a byte under its floor", func(c *Config) { c.Tiers = []string{fmt.Sprintf("disk=/d:%d", MinTierBytes-1)} }, "tiers[0]", "not in"},
		{"size at its ceiling", func(c *Config) { c.Tiers = []string{"disk=/d:1000GiB"} }, "", ""},
		{"size a byte over its ceiling", func(c *Config) { c.Tiers = []string{fmt.Sprintf("disk=/d:%d", MaxTierBytes+1)} }, "tiers[0]", "not in"},
		{"no size", func(c *Config) { c.Tiers = []string{"disk=/d"} }, "tiers[0]", "no size"},
		{"bad size", func(c *Config) { c.Tiers = []string{"disk=/d:lots"} }, "tiers[0]", "not a positive number"},
		{"relative path", func(c *Config) { c.Tiers = []string{"disk=nvme:1GiB"} }, "tiers[0]", "not absolute"},
		{"no path", func(c *Config) { c.Tiers = []string{"disk=:1GiB"} }, "tiers[0]", "not absolute"},
		{"unknown kind", func(c *Config) { c.Tiers = []string{"ssd=/d:1GiB"} }, "tiers[0]", "unknown tier kind"},
		{"no kind", func(c *Config) { c.Tiers = []string{"/d:1GiB"} }, "tiers[0]", "disk=PATH:SIZE"},
		{"same directory twice", func(c *Config) { c.Tiers = []string{"disk=/d:1GiB", "disk=/d/:1GiB"} }, "tiers[1]", "overlaps tiers[0]"},
		{"one inside another", func(c *Config) { c.Tiers = []string{"disk=/d:1GiB", "disk=/d/x:1GiB"} }, "tiers[1]", "overlaps"},
		{"tiers at their limit", func(c *Config) { c.Tiers = tiers(MaxTiers) }, "", ""},
		{"tiers past their limit", func(c *Config) { c.Tiers = tiers(MaxTiers + 1) }, "tiers", "at most 8"},
		{"watermark at its ceiling", func(c *Config) { c.TierWatermark = 1 }, "", ""},
		{"watermark past its ceiling", func(c *Config) { c.TierWatermark = 1.01 }, "tier_watermark", "not in (0, 1]"},
		{"negative watermark", func(c *Config) { c.TierWatermark = -0.5 }, "tier_watermark", ""},
		{"copies in flight at their ceiling", func(c *Config) { c.TierInFlight = 1 }, "", ""},
		{"copies in flight past their ceiling", func(c *Config) { c.TierInFlight = 1.01 }, "tier_in_flight", "not in (0, 1]"},
		{"negative copies in flight", func(c *Config) { c.TierInFlight = -0.25 }, "tier_in_flight", ""},
		{"watermark not a number", func(c *Config) { c.TierWatermark = math.NaN() }, "tier_watermark", "NaN is not in (0, 1]"},
		{"copies in flight not a number", func(c *Config) { c.TierInFlight = math.NaN() }, "tier_in_flight", "NaN is not in (0, 1]"},
		{"watermark infinite", func(c *Config) { c.TierWatermark = math.Inf(1) }, "tier_watermark", "not in (0, 1]"},
		{"queue at its limit", func(c *Config) { c.TierQueue = MaxTierQueue }, "", ""},
		{"queue past its limit", func(c *Config) { c.TierQueue = MaxTierQueue + 1 }, "tier_queue", "not in 1..4096"},
		{"negative queue", func(c *Config) { c.TierQueue = -1 }, "tier_queue", ""},
		{"staging at its limit", func(c *Config) { c.TierStagingSlots = MaxTierStagingSlots }, "", ""},
		{"staging past its limit", func(c *Config) { c.TierStagingSlots = MaxTierStagingSlots + 1 }, "tier_staging_slots", "not in 1..4096"},
		{"block bytes at their limit", func(c *Config) { c.TierBlockBytes = disk.MaxSlotBytes }, "", ""},
		{"block bytes past their limit", func(c *Config) { c.TierBlockBytes = disk.MaxSlotBytes + 1 }, "tier_block_bytes", "not in"},
		{"negative block bytes", func(c *Config) { c.TierBlockBytes = -1 }, "tier_block_bytes", ""},
		{"read-ahead off", func(c *Config) { c.TierReadAhead = 0 }, "", ""},
		{"read-ahead at its limit", func(c *Config) { c.TierReadAhead = MaxTierReadAhead }, "", ""},
		{"read-ahead past its limit", func(c *Config) { c.TierReadAhead = MaxTierReadAhead + 1 }, "tier_read_ahead", "not in 0..256"},
		{"negative read-ahead", func(c *Config) { c.TierReadAhead = -1 }, "tier_read_ahead", ""},
		{"a file", func(c *Config) { c.Tiers = []string{"disk=" + file + ":1GiB"} }, "tiers[0]", "is a file, not a directory"},
		{"below a file", func(c *Config) { c.Tiers = []string{"disk=" + file + "/t:1GiB"} }, "tiers[0]", "a file is on its way"},
	} {
		c := DefaultLocalConfig()
		tc.mut(&c)
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
