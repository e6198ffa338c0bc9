// Package archtest holds tests of the repository's structure: which package
// may import which, as DESIGN.md draws it.
package archtest
