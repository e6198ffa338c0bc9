// Package archtest holds tests of the repository's structure: which package
// may import which, as docs/architecture.md draws it.
package archtest
