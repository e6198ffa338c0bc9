package fabric

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/kvfabric/kvfabric/pool"
)

// EvictionFreshAge: 0 to pool.MaxFreshAge; past either end, or not a
// number, an error naming it.
func TestEvictionFreshAgeBounds(t *testing.T) {
	for _, tc := range []struct {
		age float64
		ok  bool
	}{
		{0, true}, {5, true}, {pool.MaxFreshAge, true},
		{pool.MaxFreshAge + 1, false}, {-1, false}, {math.NaN(), false},
	} {
		c := DefaultLocalConfig()
		c.EvictionFreshAge = tc.age
		c.populate()
		_, err := c.validate()
		if tc.ok && err != nil {
			t.Errorf("eviction_fresh_age %g: %v", tc.age, err)
		}
		if !tc.ok && (!errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "eviction_fresh_age")) {
			t.Errorf("eviction_fresh_age %g: err = %v, want an error naming eviction_fresh_age", tc.age, err)
		}
	}
}
