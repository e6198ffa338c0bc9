package fabric

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kvfabric/kvfabric/pool"
	"github.com/kvfabric/kvfabric/pool/disk"
)

// The limits of the tier settings.
const (
	// MaxTiers bounds the disk tiers of one agent.
	MaxTiers = 8
	// MinTierBytes and MaxTierBytes bound one disk tier: below a few
	// blocks a tier only churns; above, the store's files (disk.MaxFiles
	// of disk.DefaultFileBytes) run out.
	MinTierBytes = 16 << 20
	MaxTierBytes = disk.MaxFiles * disk.DefaultFileBytes
	// DefaultTierQueue and MaxTierQueue bound the blocks waiting to be
	// copied down.
	DefaultTierQueue = 256
	MaxTierQueue     = disk.MaxQueueDepth
	// DefaultTierStagingSlots and MaxTierStagingSlots bound the host
	// slots disk-held blocks are staged into for peers.
	DefaultTierStagingSlots = 64
	MaxTierStagingSlots     = 4096
	// MinHostTierBytes and MaxHostTierBytes bound the host-memory tier
	// ("host=SIZE"; at most one).
	MinHostTierBytes = 16 << 20
	MaxHostTierBytes = disk.MaxMemBytes
)

// TierSpec is one parsed entry of Config.Tiers.
type TierSpec struct {
	Kind string // "disk" or "host"
	// Path is the tier's directory (absolute); "" for the host tier.
	Path string
	// Size is its capacity in bytes.
	Size uint64
}

// ParseTierSpec parses one entry of Config.Tiers: "disk=PATH:SIZE", PATH
// an absolute directory (made if missing), SIZE in bytes with an optional
// KiB, MiB, GiB or TiB suffix, MinTierBytes..MaxTierBytes; or "host=SIZE",
// the host-memory tier (tier_host.go), MinHostTierBytes..MaxHostTierBytes.
func ParseTierSpec(s string) (TierSpec, error) {
	kind, rest, ok := strings.Cut(s, "=")
	if !ok {
		return TierSpec{}, fmt.Errorf("%q is not disk=PATH:SIZE nor host=SIZE (e.g. disk=/nvme/kvfabric:512GiB)", s)
	}
	if kind == tierHost {
		return parseHostTier(s, rest)
	}
	if kind != "disk" {
		return TierSpec{}, fmt.Errorf("%q: unknown tier kind %q (disk or host)", s, kind)
	}
	i := strings.LastIndex(rest, ":")
	if i < 0 {
		return TierSpec{}, fmt.Errorf("%q: no size: want disk=PATH:SIZE", s)
	}
	path, size := rest[:i], rest[i+1:]
	if strings.Contains(size, ",") {
		return TierSpec{}, fmt.Errorf("%q: size %q holds a comma: one tier an entry (a comma before the size is part of the path)", s, size)
	}
	if strings.Contains(path, ",disk=") || strings.Contains(path, ",host=") {
		// disk=/a:1GiB,disk=/b:2GiB is two tiers written as one entry,
		// not a directory of that name.
		return TierSpec{}, fmt.Errorf("%q: two tiers in one entry: one tier an entry (repeat --tier)", s)
	}
	if path == "" || !filepath.IsAbs(path) {
		return TierSpec{}, fmt.Errorf("%q: path %q is not absolute", s, path)
	}
	n, err := ParseSize(size)
	if err != nil {
		return TierSpec{}, fmt.Errorf("%q: %v", s, err)
	}
	if n < MinTierBytes || n > MaxTierBytes {
		return TierSpec{}, fmt.Errorf("%q: size %d is not in %d (16MiB)..%d (1000GiB)", s, n, MinTierBytes, uint64(MaxTierBytes))
	}
	return TierSpec{Kind: kind, Path: filepath.Clean(path), Size: n}, nil
}

// validateTiers checks the tier settings of a populated config.
func (c *Config) validateTiers() error {
	bad := badSetting
	if len(c.Tiers) > MaxTiers {
		return bad("tiers", "%d tiers, at most %d", len(c.Tiers), MaxTiers)
	}
	seen := map[string]int{}
	host := -1
	for i, t := range c.Tiers {
		s, err := ParseTierSpec(t)
		if err != nil {
			return bad(fmt.Sprintf("tiers[%d]", i), "%v", err)
		}
		if s.Kind == tierHost {
			if host >= 0 {
				return bad(fmt.Sprintf("tiers[%d]", i), "%q: a second host tier (tiers[%d]): at most one", t, host)
			}
			host = i
			if err := checkHostMemory(s.Size); err != nil {
				return bad(fmt.Sprintf("tiers[%d]", i), "%q: %v", t, err)
			}
			continue
		}
		if err := notADir(s.Path); err != nil {
			return bad(fmt.Sprintf("tiers[%d]", i), "%q: %v", t, err)
		}
		for p, j := range seen {
			if p == s.Path || strings.HasPrefix(s.Path, p+"/") || strings.HasPrefix(p, s.Path+"/") {
				return bad(fmt.Sprintf("tiers[%d]", i), "%q: its directory overlaps tiers[%d]'s %s", t, j, p)
			}
		}
		seen[s.Path] = i
	}
	// The fractions are checked for what they must be, not what they must
	// not: NaN (which a flag or variable may spell) passes every
	// comparison that refuses.
	switch {
	case !(c.TierWatermark >= 0 && c.TierWatermark <= 1):
		return bad("tier_watermark", "%g is not in (0, 1] (0: %g, %g over device pools)", c.TierWatermark, pool.DefaultOffloadWatermark, deviceOffloadWatermark)
	case !(c.TierInFlight >= 0 && c.TierInFlight <= 1):
		return bad("tier_in_flight", "%g is not in (0, 1] (0: %g)", c.TierInFlight, pool.DefaultOffloadInFlight)
	case c.TierQueue < 0 || c.TierQueue > MaxTierQueue:
		return bad("tier_queue", "%d is not in 1..%d (0: %d)", c.TierQueue, MaxTierQueue, DefaultTierQueue)
	case c.TierStagingSlots < 0 || c.TierStagingSlots > MaxTierStagingSlots:
		return bad("tier_staging_slots", "%d is not in 1..%d (0: %d)", c.TierStagingSlots, MaxTierStagingSlots, DefaultTierStagingSlots)
	case c.TierReadAhead < 0 || c.TierReadAhead > MaxTierReadAhead:
		return bad("tier_read_ahead", "%d is not in 0..%d (0: off)", c.TierReadAhead, MaxTierReadAhead)
	case c.TierBlockBytes < 0 || c.TierBlockBytes > disk.MaxSlotBytes:
		return bad("tier_block_bytes", "%d is not in 1..%d (0: the first block's size)", c.TierBlockBytes, disk.MaxSlotBytes)
	}
	return nil
}

// tierSpecs returns the validated tiers in the tiers' order: the host
// tier first, then the disk tiers as configured.
func (c *Config) tierSpecs() []TierSpec {
	out := make([]TierSpec, 0, len(c.Tiers))
	for _, t := range c.Tiers {
		s, _ := ParseTierSpec(t) // validated
		out = append(out, s)
	}
	slices.SortStableFunc(out, func(a, b TierSpec) int {
		return boolInt(b.Kind == tierHost) - boolInt(a.Kind == tierHost)
	})
	return out
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
