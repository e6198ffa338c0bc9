package main

import (
	"fmt"
	"runtime/debug"
)

func runVersion(e *env, args []string) error {
	fs := newFlags(e, "version", "", "Prints the version of kvfabric and of the Go toolchain that built it.")
	if err := parse(fs, args); err != nil {
		return err
	}
	version, goVersion := "(devel)", "unknown"
	if bi, ok := debug.ReadBuildInfo(); ok {
		goVersion = bi.GoVersion
		if bi.Main.Version != "" {
			version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				version += " " + s.Value
			}
		}
	}
	_, err := fmt.Fprintf(e.stdout, "kvfabric %s (%s)\n", version, goVersion)
	return err
}
