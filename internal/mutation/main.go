// Command mutation is the mutation check, a test of the tests: it plants
// each bug of a list (mutations.txt beside this file) in a scratch copy of
// the tree, runs the tests that should notice, and reports whether they
// did. Every planted bug must be caught: a bug the tests miss is a rule the
// stand-ins (softverbs, softcuda) or the tests do not enforce.
//
//	go run ./internal/mutation [-p 2] [-run regexp] [-list file] [-timeout 4m]
//
// Run from the repository's root (make mutation-check does). Each mutation
// gets its own copy of the tracked and untracked-but-not-ignored files
// under one temporary directory, removed at the end; the tests of every
// distinct command first run once on an unmutated copy, so that a failure
// is the bug's and not the tree's. A mutation whose text is not found, or
// whose tree no longer builds, counts as not caught. The exit status is 1
// unless every mutation was caught.
//
// A test: line starting with "pytest " names Python client tests instead
// (pytest's arguments, run in python/ against the copy's bin/kvfabric, with
// $PYTHON, else /usr/bin/python3, as make test-python runs them). Its exit
// status tells a caught bug (1: tests failed) from a tree that does not
// build (2 to 5: a module that does not import, an internal or usage
// error, no tests collected).
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"
)

// mutation is one planted bug.
type mutation struct {
	name, why, file, test string
	from, to              string
}

// parse reads the list: blocks starting with "[name]", then "why:",
// "file:" and "test:" lines, then the text to find ("-" lines) and its
// replacement ("+" lines), each line without its one-character prefix.
// Lines starting with "#" are comments.
func parse(r io.Reader) ([]mutation, error) {
	var out []mutation
	var cur *mutation
	var from, to []string
	flush := func() error {
		if cur == nil {
			return nil
		}
		if cur.file == "" || cur.test == "" || len(from) == 0 {
			return fmt.Errorf("mutation %s: needs file:, test: and - lines", cur.name)
		}
		cur.from, cur.to = strings.Join(from, "\n"), strings.Join(to, "\n")
		out = append(out, *cur)
		cur, from, to = nil, nil, nil
		return nil
	}
	sc := bufio.NewScanner(r)
	n := 0
	for sc.Scan() {
		n++
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "#") || strings.TrimSpace(line) == "":
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			if err := flush(); err != nil {
				return nil, err
			}
			cur = &mutation{name: line[1 : len(line)-1]}
		case cur == nil:
			return nil, fmt.Errorf("line %d: %q before the first [name]", n, line)
		case strings.HasPrefix(line, "why: "):
			cur.why = strings.TrimPrefix(line, "why: ")
		case strings.HasPrefix(line, "file: "):
			cur.file = strings.TrimPrefix(line, "file: ")
		case strings.HasPrefix(line, "test: "):
			cur.test = strings.TrimPrefix(line, "test: ")
		case strings.HasPrefix(line, "-"):
			from = append(from, line[1:])
		case strings.HasPrefix(line, "+"):
			to = append(to, line[1:])
		default:
			return nil, fmt.Errorf("line %d: %q: not why:, file:, test:, - or +", n, line)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return out, nil
}

// copyTree copies the listed files of root into dst.
func copyTree(root, dst string, files []string) error {
	for _, f := range files {
		src := filepath.Join(root, f)
		info, err := os.Lstat(src)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue // deleted in the work tree
			}
			return err
		}
		if !info.Mode().IsRegular() {
			continue
		}
		b, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, f)
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(to, b, info.Mode().Perm()); err != nil {
			return err
		}
	}
	return nil
}

// result of one test run.
type result struct {
	failed, broken bool // broken: did not build
	timedOut       bool // killed at the limit
	took           time.Duration
	tail           string
}

// pytestArgs are a Python test's pytest arguments, ok false for a Go test.
func pytestArgs(test string) ([]string, bool) {
	args, ok := strings.CutPrefix(test, "pytest ")
	return strings.Fields(args), ok
}

// pytestBroken tells from how pytest ended (cmd.Run's error) whether its
// run says nothing of the tests: exit status 1 is tests that failed; 2 an
// interrupted run or a module that does not import (whatever its error:
// SyntaxError, IndentationError, NameError...), 3 an internal error, 4 a
// usage error, 5 no tests collected. A run killed at its limit is a
// failure, as a Go test's is; one that could not start is broken.
func pytestBroken(err error, timedOut bool) bool {
	if err == nil || timedOut {
		return false
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return true
	}
	c := ee.ExitCode()
	return c >= 2 && c <= 5
}

// pytestWaitDelay is how long a pytest run interrupted at its limit has
// to exit before it is killed: longer than its own cleanup, which joins
// hung workers (30 s each) and then stops each agent (SIGTERM, 10 s, kill,
// 10 s). The agents die with it however it ends (conftest.py).
const pytestWaitDelay = 2 * time.Minute

// interruptible is a command that ctx's end interrupts (SIGINT) rather
// than kills, and kills only if it has not exited wait later: pytest's
// fixtures then stop the agents they started instead of leaving them
// running.
func interruptible(ctx context.Context, wait time.Duration, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = wait
	return cmd
}

func runTest(dir, test string, timeout time.Duration) result {
	// The command's own limit, with room for go test's own report.
	ctx, cancel := context.WithTimeout(context.Background(), timeout+time.Minute)
	defer cancel()
	var cmd *exec.Cmd
	var out bytes.Buffer
	py, isPy := pytestArgs(test)
	if isPy {
		build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", "bin/kvfabric", "./cmd/kvfabric")
		build.Dir = dir
		if b, err := build.CombinedOutput(); err != nil {
			return result{failed: true, broken: true, tail: string(b)}
		}
		python := os.Getenv("PYTHON")
		if python == "" {
			python = "/usr/bin/python3"
		}
		cmd = interruptible(ctx, pytestWaitDelay, python, append([]string{"-m", "pytest", "-q", "-p", "no:cacheprovider"}, py...)...)
		cmd.Dir = filepath.Join(dir, "python")
		cmd.Env = append(os.Environ(), "KVFABRIC_BIN="+filepath.Join(dir, "bin", "kvfabric"))
	} else {
		// -trimpath: the scratch copies share the build cache (cgo packages
		// are otherwise cached per source directory).
		args := append([]string{"test", "-count=1", "-trimpath", "-timeout", timeout.String()}, strings.Fields(test)...)
		cmd = exec.CommandContext(ctx, "go", args...)
		cmd.Dir = dir
	}
	cmd.Stdout, cmd.Stderr = &out, &out
	t0 := time.Now()
	err := cmd.Run()
	r := result{failed: err != nil, took: time.Since(t0), timedOut: ctx.Err() != nil}
	s := out.String()
	r.broken = strings.Contains(s, "[build failed]") || strings.Contains(s, "[setup failed]") ||
		isPy && pytestBroken(err, r.timedOut)
	if len(s) > 1500 {
		s = s[len(s)-1500:]
	}
	r.tail = s
	return r
}

func main() {
	list := flag.String("list", "internal/mutation/mutations.txt", "the planted bugs")
	par := flag.Int("p", 2, "mutations tested at once")
	only := flag.String("run", "", "only mutations whose name matches this regexp")
	timeout := flag.Duration("timeout", 4*time.Minute, "limit of one test command")
	verbose := flag.Bool("v", false, "print the end of each test's output")
	flag.Parse()
	if err := run(*list, *par, *only, *timeout, *verbose); err != nil {
		fmt.Fprintln(os.Stderr, "mutation:", err)
		os.Exit(1)
	}
}

func run(list string, par int, only string, timeout time.Duration, verbose bool) error {
	start := time.Now()
	f, err := os.Open(list)
	if err != nil {
		return err
	}
	muts, err := parse(f)
	f.Close()
	if err != nil {
		return fmt.Errorf("%s: %w", list, err)
	}
	if only != "" {
		re, err := regexp.Compile(only)
		if err != nil {
			return err
		}
		var keep []mutation
		for _, m := range muts {
			if re.MatchString(m.name) {
				keep = append(keep, m)
			}
		}
		muts = keep
	}
	if len(muts) == 0 {
		return errors.New("no mutations selected")
	}
	out, err := exec.Command("git", "ls-files", "-z", "-c", "-o", "--exclude-standard").Output()
	if err != nil {
		return fmt.Errorf("git ls-files (run from the repository's root): %w", err)
	}
	var files []string
	for _, f := range strings.Split(string(out), "\x00") {
		if f != "" {
			files = append(files, f)
		}
	}
	tmp, err := os.MkdirTemp("", "kvfabric-mutation-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	// Baselines: each distinct command on the unmutated tree, after its
	// test binaries are built once (with -trimpath, the scratch copies
	// then find them in the build cache).
	base := filepath.Join(tmp, "base")
	if err := copyTree(".", base, files); err != nil {
		return err
	}
	pkgs := map[string]bool{}
	build := []string{"test", "-count=1", "-trimpath", "-run", "^$"}
	for _, m := range muts {
		if _, isPy := pytestArgs(m.test); isPy {
			continue // built by its own run
		}
		if p := strings.Fields(m.test)[0]; !pkgs[p] {
			pkgs[p] = true
			build = append(build, p)
		}
	}
	if len(pkgs) > 0 {
		t0 := time.Now()
		cmd := exec.Command("go", build...)
		cmd.Dir = base
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("building the tests: %v\n%s", err, out)
		}
		fmt.Fprintf(os.Stderr, "test binaries built (%v)\n", time.Since(t0).Round(time.Second))
	}
	tests := map[string]result{}
	var mu sync.Mutex
	sem := make(chan struct{}, max(par, 1))
	var wg sync.WaitGroup
	for _, m := range muts {
		if _, ok := tests[m.test]; ok {
			continue
		}
		tests[m.test] = result{}
		wg.Add(1)
		go func(test string) {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			r := runTest(base, test, timeout)
			mu.Lock()
			tests[test] = r
			mu.Unlock()
			fmt.Fprintf(os.Stderr, "baseline %s: failed=%v (%v)\n", test, r.failed, r.took.Round(time.Second))
		}(m.test)
	}
	wg.Wait()

	type outcome struct {
		verdict string
		took    time.Duration
		tail    string
	}
	res := make([]outcome, len(muts))
	for i, m := range muts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			res[i] = func() outcome {
				if b := tests[m.test]; b.timedOut {
					return outcome{verdict: "NOT CAUGHT (the test ran past -timeout without the bug)", tail: b.tail}
				} else if b.failed {
					return outcome{verdict: "NOT CAUGHT (the test fails without the bug)", tail: b.tail}
				}
				dir := filepath.Join(tmp, fmt.Sprintf("m%02d", i))
				if err := copyTree(".", dir, files); err != nil {
					return outcome{verdict: "NOT CAUGHT (copy: " + err.Error() + ")"}
				}
				path := filepath.Join(dir, m.file)
				src, err := os.ReadFile(path)
				if err != nil {
					return outcome{verdict: "NOT CAUGHT (" + err.Error() + ")"}
				}
				if n := strings.Count(string(src), m.from); n != 1 {
					return outcome{verdict: fmt.Sprintf("NOT CAUGHT (its text is found %d times in %s, not once)", n, m.file)}
				}
				if err := os.WriteFile(path, []byte(strings.Replace(string(src), m.from, m.to, 1)), 0o644); err != nil {
					return outcome{verdict: "NOT CAUGHT (" + err.Error() + ")"}
				}
				r := runTest(dir, m.test, timeout)
				defer os.RemoveAll(dir)
				switch {
				case r.broken:
					return outcome{verdict: "NOT CAUGHT (the mutated tree does not build)", took: r.took, tail: r.tail}
				case r.failed:
					return outcome{verdict: "caught", took: r.took, tail: r.tail}
				}
				return outcome{verdict: "NOT CAUGHT", took: r.took, tail: r.tail}
			}()
			fmt.Fprintf(os.Stderr, "%s: %s (%v)\n", m.name, res[i].verdict, res[i].took.Round(time.Second))
		}()
	}
	wg.Wait()

	fmt.Println("| mutation | planted bug | test | result | test time |")
	fmt.Println("| --- | --- | --- | --- | --- |")
	missed := 0
	for i, m := range muts {
		if res[i].verdict != "caught" {
			missed++
		}
		shown := "go test " + m.test
		if _, isPy := pytestArgs(m.test); isPy {
			shown = m.test
		}
		fmt.Printf("| %s | %s (%s) | `%s` | %s | %v |\n", m.name, m.why, m.file, shown, res[i].verdict, res[i].took.Round(time.Second))
		if verbose || res[i].verdict != "caught" {
			fmt.Fprintf(os.Stderr, "--- %s: end of the test's output:\n%s\n", m.name, res[i].tail)
		}
	}
	fmt.Printf("\n%d of %d caught in %v\n", len(muts)-missed, len(muts), time.Since(start).Round(time.Second))
	if missed > 0 {
		return fmt.Errorf("%d planted bugs not caught", missed)
	}
	return nil
}
