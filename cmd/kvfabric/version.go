package main

import (
	"fmt"

	"github.com/kvfabric/kvfabric/internal/buildinfo"
)

func runVersion(e *env, args []string) error {
	fs := newFlags(e, "version", "", "Prints the version of kvfabric and of the Go toolchain that built it.")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	_, err := fmt.Fprintf(e.stdout, "kvfabric %s (%s)\n", buildinfo.Version(), buildinfo.GoVersion())
	return err
}
