// Package abitest holds our own C declarations of a library's structures
// against the library's real headers, for the bindings that dlopen a
// library instead of including its headers (rdma's kvf_verbs.h, rdma/ofi's
// kvf_fabric.h). Our names are the library's with a kvf_ prefix (KVF_ for
// constants), so one list of names drives two C programs, one on each
// header, whose outputs must match line for line.
package abitest

import (
	"bufio"
	"bytes"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Spec is what to compare: the real headers' includes, our header, the
// types and the constants.
type Spec struct {
	// Includes are the library's headers, as #include lines take them
	// ("<infiniband/verbs.h>").
	Includes []string
	// Ours is our header's file name, found in the test's package folder.
	Ours string
	// Package names the Debian package that brings the real headers, for
	// the error when they are missing.
	Package string
	// Types lists, per C type, its name ("struct x" or "union x") and
	// then the fields whose size and offset the binding relies on (a
	// nested field is "a.b").
	Types     [][]string
	Constants []string
}

// program writes a C program printing "name=size S align A" per type,
// "name.field=size S offset O" per field and "name=value" per constant;
// prefix is "" for the library's names, "kvf_" for ours.
func program(includes []string, prefix string, spec Spec) string {
	var b strings.Builder
	b.WriteString("#include <stdio.h>\n#include <stddef.h>\n")
	for _, inc := range includes {
		fmt.Fprintf(&b, "#include %s\n", inc)
	}
	b.WriteString("\nint main(void) {\n")
	for _, t := range spec.Types {
		kind, name, _ := strings.Cut(t[0], " ")
		typ := kind + " " + prefix + name
		fmt.Fprintf(&b, "\tprintf(\"%s=size %%zu align %%zu\\n\", sizeof(%s), _Alignof(%s));\n", t[0], typ, typ)
		for _, f := range t[1:] {
			fmt.Fprintf(&b, "\tprintf(\"%s.%s=size %%zu offset %%zu\\n\", sizeof(((%s *)0)->%s), offsetof(%s, %s));\n",
				t[0], f, typ, f, typ, f)
		}
	}
	for _, c := range spec.Constants {
		fmt.Fprintf(&b, "\tprintf(\"%s=%%llu\\n\", (unsigned long long)%s%s);\n", c, strings.ToUpper(prefix), c)
	}
	b.WriteString("\treturn 0;\n}\n")
	return b.String()
}

func run(t testing.TB, dir, name, src string, spec Spec) map[string]string {
	t.Helper()
	cfile := filepath.Join(dir, name+".c")
	if err := os.WriteFile(cfile, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	pkgDir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, name)
	out, err := exec.Command("gcc", "-std=gnu11", "-Wall", "-Werror", "-I", pkgDir, "-o", bin, cfile).CombinedOutput()
	if err != nil {
		for _, inc := range spec.Includes {
			if bytes.Contains(out, []byte(strings.Trim(inc, "<>\""))) {
				t.Fatalf("the library's header %s is missing: install %s (make test-deps): %s", inc, spec.Package, out)
			}
		}
		t.Fatalf("gcc %s: %v\n%s", name, err, out)
	}
	res, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatalf("run %s: %v", name, err)
	}
	m := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(res))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), "=")
		if !ok {
			t.Fatalf("%s printed %q", name, sc.Text())
		}
		m[k] = v
	}
	return m
}

// Compare fails t for every size, alignment, field offset or constant in
// which our header differs from the library's.
func Compare(t testing.TB, spec Spec) {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Fatalf("the ABI test needs gcc: %v", err)
	}
	dir := t.TempDir()
	theirs := run(t, dir, "theirs", program(spec.Includes, "", spec), spec)
	ours := run(t, dir, "ours", program([]string{`"` + spec.Ours + `"`}, "kvf_", spec), spec)
	want := len(spec.Constants)
	for _, t := range spec.Types {
		want += len(t)
	}
	if len(theirs) != want || len(ours) != want {
		t.Fatalf("parsed %d lines from the library's program and %d from ours, want %d each", len(theirs), len(ours), want)
	}
	for _, k := range slices.Sorted(maps.Keys(theirs)) {
		if v := theirs[k]; ours[k] != v {
			t.Errorf("%s: %s says %s, %s says %s", k, strings.Join(spec.Includes, " "), v, spec.Ours, ours[k])
		}
	}
}
