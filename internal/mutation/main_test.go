package main

import (
	"context"
	"errors"
	"go/parser"
	"go/token"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	good := "# a comment\n\n[psn]\nwhy: w\nfile: a.go\ntest: ./a -run X\n-\tfrom 1\n-\tfrom 2\n+\tto\n"
	muts, err := parse(strings.NewReader(good))
	if err != nil || len(muts) != 1 {
		t.Fatalf("%v %v", muts, err)
	}
	m := muts[0]
	if m.name != "psn" || m.why != "w" || m.file != "a.go" || m.test != "./a -run X" || m.from != "\tfrom 1\n\tfrom 2" || m.to != "\tto" {
		t.Fatalf("parsed %+v", m)
	}
	for _, bad := range []struct{ name, text, want string }{
		{"line before a name", "why: w\n", "before the first [name]"},
		{"no file", "[x]\ntest: ./a\n-a\n", "needs file:"},
		{"no test", "[x]\nfile: a.go\n-a\n", "needs file:"},
		{"nothing to find", "[x]\nfile: a.go\ntest: ./a\n+b\n", "needs file:"},
		{"unknown line", "[x]\nfile: a.go\nwhat\n", "not why:"},
	} {
		if _, err := parse(strings.NewReader(bad.text)); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s: %v, want an error saying %q", bad.name, err, bad.want)
		}
	}
}

// The list in the repository parses, names every kind the check must
// plant, each text to find is in its file exactly once, and a Go file with
// its bug planted still parses (a text that now matches only part of a
// changed line would plant a syntax error, which no test can catch).
func TestListApplies(t *testing.T) {
	f, err := os.Open("mutations.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	muts, err := parse(f)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, m := range muts {
		names[m.name] = true
		src, err := os.ReadFile("../../" + m.file)
		if err != nil {
			t.Errorf("%s: %v", m.name, err)
			continue
		}
		if n := strings.Count(string(src), m.from); n != 1 {
			t.Errorf("%s: its text is in %s %d times, want once", m.name, m.file, n)
			continue
		}
		if strings.HasSuffix(m.file, ".go") {
			planted := strings.Replace(string(src), m.from, m.to, 1)
			if _, err := parser.ParseFile(token.NewFileSet(), m.file, planted, parser.SkipObjectResolution); err != nil {
				t.Errorf("%s: %s does not parse with the bug planted: %v", m.name, m.file, err)
			}
		}
	}
	for _, want := range []string{"psn", "mtu", "read-depth", "gid-type", "timeout-0", "stream-sync", "other-gpu-context",
		"access-flags", "wrong-key", "off-by-one", "unsignalled-last", "lease-expired"} {
		if !names[want] {
			t.Errorf("no %s mutation", want)
		}
	}
}

func TestPytestArgs(t *testing.T) {
	if args, ok := pytestArgs("pytest tests/test_a.py -k b"); !ok || strings.Join(args, " ") != "tests/test_a.py -k b" {
		t.Errorf("pytest test: %q %v", args, ok)
	}
	if _, ok := pytestArgs("./fabric -run ^TestX$"); ok {
		t.Error("a Go test taken for a Python one")
	}
}

func TestPytestBroken(t *testing.T) {
	for _, c := range []struct {
		code     int
		timedOut bool
		broken   bool
	}{
		{0, false, false},
		{1, false, false}, // tests failed: the bug caught
		{2, false, true},  // interrupted, or a module that does not import
		{3, false, true},
		{4, false, true},
		{5, false, true},  // no tests collected
		{2, true, false},  // interrupted at the limit: a failure
		{-9, true, false}, // killed at the limit
	} {
		var err error
		if c.code < 0 {
			cmd := exec.Command("sh", "-c", "kill -9 $$")
			err = cmd.Run()
		} else if c.code > 0 {
			err = exec.Command("sh", "-c", "exit "+strconv.Itoa(c.code)).Run()
		}
		if got := pytestBroken(err, c.timedOut); got != c.broken {
			t.Errorf("exit %d, timed out %v: broken %v, want %v (%v)", c.code, c.timedOut, got, c.broken, err)
		}
	}
	if !pytestBroken(exec.Command("/nonexistent/python").Run(), false) {
		t.Error("a pytest that did not start is not broken")
	}
}

// A pytest run at its limit is interrupted, so that its fixtures' cleanup
// runs: a command that traps SIGINT exits by its own trap.
func TestInterruptibleInterrupts(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cmd := interruptible(ctx, time.Minute, "sh", "-c", `trap "exit 7" INT; echo up; while :; do sleep 0.05; done`)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line := make([]byte, 3)
	if _, err := io.ReadFull(out, line); err != nil {
		t.Fatal(err)
	}
	cancel()
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 7 {
		t.Fatalf("command at its limit ended with %v, want exit 7 from its SIGINT trap", err)
	}
}

// A command that ignores the interrupt is killed once its wait is over,
// not left running.
func TestInterruptibleKillsWhatIgnoresTheInterrupt(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cmd := interruptible(ctx, 100*time.Millisecond, "sh", "-c", `trap "" INT; echo up; while :; do sleep 0.05; done`)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line := make([]byte, 3)
	if _, err := io.ReadFull(out, line); err != nil {
		t.Fatal(err)
	}
	cancel()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("command that ignores SIGINT still runs 20 s after its limit; want it killed after its 100ms wait: %v", <-done)
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("command at its limit ended with %v, want killed", err)
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("command at its limit ended with %v, want killed (SIGKILL)", err)
	}
}
