package main

import (
	"bytes"
	"strings"
	"testing"
)

// Bad flags are refused before any node starts.
func TestFlagsRefused(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-nodes", "64,x"}, `-nodes: "x"`},
		{[]string{"-nodes", "1"}, `-nodes: "1"`},
		{[]string{"-rate", "0"}, "must be positive"},
		{[]string{"-lifetime", "-1s"}, "must be positive"},
		{[]string{"-nope"}, "flag provided but not defined"},
	} {
		var out, errs bytes.Buffer
		err := run(c.args, &out, &errs)
		if err == nil || !strings.Contains(err.Error()+errs.String(), c.want) {
			t.Errorf("%v: error %v (stderr %q), want %q", c.args, err, errs.String(), c.want)
		}
	}
}
