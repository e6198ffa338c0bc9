package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/transfer/certs"
)

// maxCertDays bounds --days: a century, far short of the 106,751 days
// past which the validity overflows a time.Duration (and, wrapped to zero
// or less, became the package's default validity without a word).
const maxCertDays = 36500

// certDays checks --days.
func certDays(days int) (time.Duration, error) {
	if days < 1 || days > maxCertDays {
		return 0, usagef("--days %d: want 1..%d", days, maxCertDays)
	}
	return time.Duration(days) * 24 * time.Hour, nil
}

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
		days := fs.Int("days", 3650, fmt.Sprintf("validity in days, 1..%d", maxCertDays))
		if err := parse(fs, args[1:]); err != nil {
			return err
		}
		if fs.NArg() > 0 {
			return usagef("unexpected argument %q", fs.Arg(0))
		}
		if *name == "" {
			return usagef("--name: the CA's name is empty")
		}
		validity, err := certDays(*days)
		if err != nil {
			return err
		}
		ca, err := certs.NewCA(*name, validity)
		if errors.Is(err, certs.ErrInvalid) {
			return usagef("%v", err)
		}
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
	days := fs.Int("days", 365, fmt.Sprintf("validity in days, 1..%d, cut to the CA's own expiry", maxCertDays))
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
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	// The agent's bound, not only a certificate's (253 bytes): a
	// certificate no agent can use is refused here.
	if err := fabric.ValidNodeName(name); err != nil {
		return usagef("node name %v", err)
	}
	validity, err := certDays(*days)
	if err != nil {
		return err
	}
	ca, err := certs.LoadCA(*caCert, *caKey)
	if err != nil {
		return err
	}
	pair, err := ca.IssueNode(name, validity)
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
