package main

import (
	"bytes"
	"strings"
	"testing"
)

// Bad flags are refused before anything is built or started; a run is
// TestSweepThroughput in package testbed.
func TestFlagsRefused(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-pages", "16,x"}, `-pages: "x"`},
		{[]string{"-pages", "0"}, `-pages: "0"`},
		{[]string{"-chunks-mib", "-1"}, `-chunks-mib: "-1"`},
		{[]string{"-mib", "0"}, "-mib 0"},
	} {
		if err := run(c.args, new(bytes.Buffer)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: got %v, want an error naming %q", c.args, err, c.want)
		}
	}
}
