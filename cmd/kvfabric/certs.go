package main

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/kvfabric/kvfabric/transfer/certs"
)

func runCerts(e *env, args []string) error {
	if len(args) == 0 || (args[0] != "ca" && args[0] != "node" && args[0] != "-h" && args[0] != "--help") {
		return usagef("want 'certs ca' or 'certs node NAME' (see certs -h)")
	}
	if args[0] == "-h" || args[0] == "--help" {
		fmt.Fprint(e.stderr, `Usage: kvfabric certs ca [--out DIR]
       kvfabric certs node NAME --ca-cert FILE --ca-key FILE [--out DIR]

Makes the certificates of a cluster: one CA, and one certificate per node
naming it. Agents authenticate each other with mutual TLS against the CA
(agent --ca, --cert, --key). Keys are written with mode 0600.
`)
		return nil
	}
	if args[0] == "ca" {
		fs := newFlags(e, "certs ca", "[--out DIR] [--name NAME] [--days N]", "Makes a cluster CA: DIR/ca.crt and DIR/ca.key.")
		out := fs.String("out", ".", "directory to write ca.crt and ca.key to")
		name := fs.String("name", "kvfabric cluster CA", "the CA's common name")
		days := fs.Int("days", 3650, "validity in days")
		if err := parse(fs, args[1:]); err != nil {
			return err
		}
		if *days <= 0 {
			return usagef("--days %d: must be positive", *days)
		}
		ca, err := certs.NewCA(*name, time.Duration(*days)*24*time.Hour)
		if err != nil {
			return err
		}
		crt, key := filepath.Join(*out, "ca.crt"), filepath.Join(*out, "ca.key")
		if err := os.MkdirAll(*out, 0o700); err != nil {
			return err
		}
		if err := refuseOverwrite(crt, key); err != nil {
			return err
		}
		if err := ca.Save(crt, key); err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "wrote %s and %s (keep the key secret: it certifies nodes)\n", crt, key)
		return nil
	}
	fs := newFlags(e, "certs node", "NAME --ca-cert FILE --ca-key FILE [--out DIR] [--days N]",
		"Certifies node NAME with the cluster CA: DIR/NAME.crt and DIR/NAME.key.")
	out := fs.String("out", ".", "directory to write NAME.crt and NAME.key to")
	caCert := fs.String("ca-cert", "ca.crt", "the CA certificate")
	caKey := fs.String("ca-key", "ca.key", "the CA key")
	days := fs.Int("days", 365, "validity in days")
	if len(args) < 2 || args[1] == "" || args[1][0] == '-' {
		if len(args) >= 2 && (args[1] == "-h" || args[1] == "--help") {
			return parse(fs, args[1:])
		}
		return usagef("certs node: the node NAME comes first")
	}
	name := args[1]
	if err := parse(fs, args[2:]); err != nil {
		return err
	}
	if err := certs.ValidNodeName(name); err != nil {
		return usagef("node name %q: %v", name, err)
	}
	if *days <= 0 {
		return usagef("--days %d: must be positive", *days)
	}
	ca, err := certs.LoadCA(*caCert, *caKey)
	if err != nil {
		return err
	}
	pair, err := ca.IssueNode(name, time.Duration(*days)*24*time.Hour)
	if err != nil {
		return err
	}
	crt, key := filepath.Join(*out, name+".crt"), filepath.Join(*out, name+".key")
	if err := os.MkdirAll(*out, 0o700); err != nil {
		return err
	}
	if err := refuseOverwrite(crt, key); err != nil {
		return err
	}
	if err := pair.Save(crt, key); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "wrote %s and %s for node %s\n", crt, key, name)
	return nil
}

func refuseOverwrite(paths ...string) error {
	for _, p := range paths {
		if _, err := os.Stat(p); err == nil {
			return fmt.Errorf("%s exists; remove it first (keys are not overwritten)", p)
		}
	}
	return nil
}
