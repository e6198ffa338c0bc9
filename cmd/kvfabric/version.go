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
	_, err := fmt.Fprintf(e.stdout, "kvfabric %s (%s)\n", buildinfo.Version(), buildinfo.GoVersion())
	return err
}
