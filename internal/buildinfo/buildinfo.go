// Package buildinfo says which kvfabric a binary is, the one way every
// place that reports it (kvfabric version, the engine API's status, the
// kvfabric_build_info metric) reads it.
package buildinfo

import "runtime/debug"

// Version is the module version the binary was built from, with the VCS
// revision when the build recorded one; "(devel)" for a build of a work
// tree.
func Version() string {
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

// GoVersion is the Go toolchain that built the binary.
func GoVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		return bi.GoVersion
	}
	return "unknown"
}
