package fabric

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// The host tier's setting: its size at and past its limits, its syntax,
// and one at most; each refusal names its field and what is wrong.
func TestValidateHostTierConfig(t *testing.T) {
	for _, tc := range []struct {
		name  string
		tiers []string
		field string // "" when valid
		says  string
	}{
		{"alone", []string{"host=64GiB"}, "", ""},
		{"with disk tiers", []string{"disk=/d:1GiB", "host=1GiB", "disk=/e:1GiB"}, "", ""},
		{"size at its floor", []string{"host=16MiB"}, "", ""},
		{"size a byte under its floor", []string{fmt.Sprintf("host=%d", MinHostTierBytes-1)}, "tiers[0]", "not in 16777216 (16MiB)"},
		{"size at its ceiling", []string{"host=1TiB"}, "", ""},
		{"size a byte over its ceiling", []string{fmt.Sprintf("host=%d", MaxHostTierBytes+1)}, "tiers[0]", "(1TiB)"},
		{"no size", []string{"host="}, "tiers[0]", "no size"},
		{"bad size", []string{"host=lots"}, "tiers[0]", "not a positive number"},
		{"a path", []string{"host=/d:1GiB"}, "tiers[0]", "not a positive number"},
		{"no kind", []string{"host"}, "tiers[0]", "host=SIZE"},
		{"two host tiers", []string{"host=1GiB", "disk=/d:1GiB", "host=2GiB"}, "tiers[2]", "a second host tier (tiers[0])"},
	} {
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
