package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"time"
)

// pprofFlags are the agent's profiling flags. Profiles are off unless
// --pprof is given; they are served on loopback only, unless
// --pprof-remote says otherwise, because they show the agent's memory
// (goroutine stacks, heap samples, its command line) and a CPU profile
// costs CPU while it runs.
type pprofFlags struct {
	addr   *string
	remote *bool
}

func bindPprof(fs *flag.FlagSet) pprofFlags {
	return pprofFlags{
		addr: fs.String("pprof", "", "serve Go profiles (net/http/pprof, under /debug/pprof/) on this address, e.g. 127.0.0.1:6060 "+
			"(a bare :PORT means 127.0.0.1); off if empty; a loopback address unless --pprof-remote"),
		remote: fs.Bool("pprof-remote", false, "let --pprof listen on an address that is not loopback, such as 0.0.0.0:PORT (a bare :PORT still means 127.0.0.1; anyone who reaches it reads the agent's stacks and heap samples)"),
	}
}

// listen opens the profiles' listener, or returns nil when --pprof is
// not given. A bad or non-loopback address (without --pprof-remote) is a
// usage error.
func (p pprofFlags) listen() (net.Listener, error) {
	addr := *p.addr
	if addr == "" {
		if *p.remote {
			return nil, usagef("--pprof-remote without --pprof: give the address to serve profiles on")
		}
		return nil, nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, usagef("--pprof %q: want HOST:PORT or :PORT: %v", addr, err)
	}
	switch {
	case host == "":
		host = "127.0.0.1"
	case *p.remote:
	case host == "localhost":
	default:
		ip := net.ParseIP(host)
		if ip == nil {
			return nil, usagef("--pprof %q: give a loopback IP address (127.0.0.1, ::1), or add --pprof-remote to serve profiles on %s", addr, host)
		}
		if !ip.IsLoopback() {
			return nil, usagef("--pprof %q is not a loopback address: profiles show the agent's memory; add --pprof-remote to serve them there", addr)
		}
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, port))
	if err != nil {
		return nil, usagef("--pprof %q: %v", addr, err)
	}
	return ln, nil
}

// servePprof serves net/http/pprof's handlers on ln until the returned
// function closes it; a failure to accept is written to errs.
func servePprof(ln net.Listener, errs io.Writer) (stop func()) {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index) // and every named profile: heap, goroutine, block, mutex, ...
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		http.Redirect(w, r, "/debug/pprof/", http.StatusFound)
	})
	// No WriteTimeout: a CPU profile or trace answers after its seconds.
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintf(errs, "kvfabric agent: profiles on %s stopped: %v\n", ln.Addr(), err)
		}
	}()
	return func() {
		srv.Close()
		<-done
	}
}
