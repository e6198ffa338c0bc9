package softverbs_test

import (
	"fmt"
	"strconv"
	"testing"
)

func itoa(i int) string { return strconv.Itoa(i) }

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("%q: %v", s, err)
	}
	return n
}

func sprintf(format string, args ...any) string { return fmt.Sprintf(format, args...) }
