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
	_, err := fmt.Fprintf(e.stdout, "kvfabric %s (%s)\n", version(), goVersion())
	return err
}

// version is the module version the binary was built from, with the VCS
// revision when the build recorded one.
func version() string {
	v := "(devel)"
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				v += " " + s.Value
			}
		}
	}
	return v
}

// goVersion is the Go toolchain that built the binary.
func goVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		return bi.GoVersion
	}
	return "unknown"
}
