// Command kvfabric is the kvfabric node agent and the tools that operators
// and engine integrators use beside it.
//
//	kvfabric agent [flags]                    run the node agent
//	kvfabric certs ca | node NAME             make the cluster's certificates
//	kvfabric members | status                 what the local agent sees
//	kvfabric lookup | import | get | put      blocks, through the local agent
//	kvfabric hash --block-size N [TOKEN ...]  block hashes of a token sequence
//	kvfabric plan --src FILE --dst FILE       the copy plan between two layouts
//	kvfabric rdma devices [--json]            RDMA devices, ports and GIDs
//	kvfabric version
//
// Every command exits with one of three statuses:
//
//	0  all done: every block asked for is here (import, get), stored (put)
//	   or held by some node (lookup); other commands did what they were asked
//	1  not all done: some or all blocks are not available, or the work
//	   failed (no agent on the socket, a write failed, a key exists); the
//	   reason is one line on standard error
//	2  usage or configuration error, nothing done: an unknown command or
//	   flag, a bad argument or KVFABRIC_ variable, an invalid --config file
//	   or layout file
//
// Hashes are decimal strings in every --json output, as protobuf JSON
// writes 64-bit integers, so that no JSON reader rounds them.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/fabric/fabricpb"
)

// command is one subcommand.
type command struct {
	summary string
	run     func(env *env, args []string) error
}

// env is what a subcommand may touch, so that tests can run it in process.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	// progress enables progress lines on stderr for long imports: when
	// stderr is a terminal.
	progress bool
	// progressAfter is how long an import runs before its progress shows.
	// If zero, at once (tests); main sets a second.
	progressAfter time.Duration
	// env is the environment as KEY=value; if nil, the process's.
	env []string
	// status, if set, stands in for the agent's Status call where a
	// command asks it only to word what it prints (tests).
	status func(context.Context, *client.Client) (*fabricpb.StatusResponse, error)
}

// statusOf is the agent's status, asked through c (or e.status).
func (e *env) statusOf(ctx context.Context, c *client.Client) (*fabricpb.StatusResponse, error) {
	if e.status != nil {
		return e.status(ctx, c)
	}
	return c.Status(ctx)
}

func (e *env) environ() []string {
	if e.env == nil {
		return os.Environ()
	}
	return e.env
}

func (e *env) getenv(name string) string {
	for _, kv := range e.environ() {
		if k, v, ok := strings.Cut(kv, "="); ok && k == name {
			return v
		}
	}
	return ""
}

// usageError is a mistake in how the command was called: exit status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

var commands = map[string]command{
	"agent":   {"run the node agent", runAgent},
	"certs":   {"make the cluster CA and node certificates", runCerts},
	"get":     {"import blocks and write their bytes to a file", runGet},
	"gpus":    {"list this node's GPUs and the RDMA device closest to each", runGPUs},
	"hash":    {"print the block hashes of a token sequence", runHash},
	"import":  {"import blocks from the cluster into the local agent", runImport},
	"lookup":  {"show which nodes hold a sequence's blocks", runLookup},
	"members": {"list the cluster's members", runMembers},
	"plan":    {"summarise the copy plan between two layouts", runPlan},
	"put":     {"store test blocks on the local agent", runPut},
	"rdma":    {"list the RDMA devices and ports this node would use (rdma devices)", runRDMA},
	"status":  {"show whether the local agent has joined, its members, pools, block sets and transfers", runStatus},
	"version": {"print the version of kvfabric and of Go that built it (also kvfabric --version)", runVersion},
}

func main() {
	os.Exit(run(&env{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, progress: isTerminal(os.Stderr), progressAfter: time.Second}, os.Args[1:]))
}

// isTerminal reports whether f is a terminal (a character device; writing
// progress to /dev/null, the other common one, costs nothing).
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// run executes a command line and returns the exit status.
func run(e *env, args []string) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(e.stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	if args[0] == "--version" || args[0] == "-version" {
		args = append([]string{"version"}, args[1:]...)
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(e.stderr, "kvfabric: unknown command %q (run 'kvfabric -h' for the list)\n", args[0])
		return 2
	}
	err := cmd.run(e, args[1:])
	var ue *usageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(e.stderr, "kvfabric %s: %s\n", args[0], ue.msg)
		return 2
	case errors.Is(err, fabric.ErrConfig):
		// A bad --config file: the caller's to fix.
		fmt.Fprintf(e.stderr, "kvfabric %s: %v\n", args[0], err)
		return 2
	default:
		fmt.Fprintf(e.stderr, "kvfabric %s: %v\n", args[0], err)
		return 1
	}
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "kvfabric: a cross-node KV-cache fabric for LLM serving clusters")
	fmt.Fprintln(w, "\nUsage: kvfabric COMMAND [flags]; kvfabric COMMAND -h for a command's flags\n\nCommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-9s %s\n", n, commands[n].summary)
	}
}

// newFlags returns a flag set that reports errors instead of exiting, with
// a help text of synopsis and description.
func newFlags(e *env, name, synopsis, description string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.Usage = func() {
		fmt.Fprintf(e.stderr, "Usage: kvfabric %s %s\n\n%s\n\nFlags:\n", name, synopsis, strings.TrimSpace(description))
		fs.PrintDefaults()
	}
	return fs
}

// parse parses flags. -h prints the help; any other mistake is a one-line
// usage error, not the whole help.
func parse(fs *flag.FlagSet, args []string) error {
	help := fs.Usage
	fs.Usage = func() {}
	out := fs.Output()
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	fs.SetOutput(out)
	if errors.Is(err, flag.ErrHelp) {
		help()
		return err
	}
	if err != nil {
		return usagef("%v (see -h)", err)
	}
	return nil
}
