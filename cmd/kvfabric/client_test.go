package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/internal/wait"
	"github.com/kvfabric/kvfabric/transfer/certs"
)

// The client commands against a real agent: put stores blocks, lookup and
// status see them, get verifies every element, and bad input is a usage
// error.
func TestClientCommands(t *testing.T) {
	a := startTestAgent(t, "cli1")
	sock := []string{"--socket", a.EngineSocket()}
	model := []string{"--tp", "2", "--layers", "2", "--head-dim", "16"}

	code, out, errs := runCmd(t, "", append(append([]string{"put", "--generate", "5", "--json"}, sock...), model...)...)
	if code != 0 {
		t.Fatalf("put: exit %d: %s", code, errs)
	}
	var put struct {
		BlockSet string   `json:"block_set"`
		Hashes   []string // strings, as in every --json
	}
	if err := json.Unmarshal([]byte(out), &put); err != nil || len(put.Hashes) != 5 {
		t.Fatalf("put --json: %q (%v)", out, err)
	}
	list := put.Hashes
	waitIndexed(t, a, put.BlockSet, list)
	hashes := strings.Join(list, ",")

	code, out, errs = runCmd(t, "", append([]string{"lookup", "--hashes", hashes}, sock...)...)
	if code != 0 || !strings.Contains(out, "cli1") || !strings.Contains(out, " 5 ") {
		t.Fatalf("lookup: exit %d: %q %s", code, out, errs)
	}
	code, out, errs = runCmd(t, "", append([]string{"status"}, sock...)...)
	if code != 0 || !strings.Contains(out, "node cli1") || !strings.Contains(out, "kvfabric-put") || !strings.Contains(out, ", joined:") {
		t.Fatalf("status: exit %d: %q %s", code, out, errs)
	}
	// The pool: its kind, no GPU, its size, what block sets took of it,
	// and no RDMA registration of GPU memory.
	if !regexp.MustCompile(`(?m)^host\s+-\s+64\.0 MiB\s+\S+ \S+\s+1\s+-$`).MatchString(out) {
		t.Fatalf("status shows no host pool of 64 MiB with one block set:\n%s", out)
	}
	code, out, errs = runCmd(t, "", append([]string{"members", "--json"}, sock...)...)
	var members []struct {
		Node   string
		Blocks string // uint64 in protobuf JSON
	}
	if err := json.Unmarshal([]byte(out), &members); code != 0 || err != nil || len(members) != 1 || members[0].Node != "cli1" || members[0].Blocks != "5" {
		t.Fatalf("members --json: exit %d: %q %s (%v)", code, out, errs, err)
	}
	// The blocks are local: get finds them here, under another TP and
	// order, and checks every element.
	file := filepath.Join(t.TempDir(), "blocks.bin")
	args := append([]string{"get", "--hashes", hashes, "--out", file, "--verify", "--tp", "1", "--order", "NHD", "--layers", "2", "--head-dim", "16"}, sock...)
	code, _, errs = runCmd(t, "", args...)
	if code != 0 || !strings.Contains(errs, "verified 5 blocks") {
		t.Fatalf("get --verify: exit %d: %s", code, errs)
	}
	if fi, err := os.Stat(file); err != nil || fi.Size() != 5*2*2*8*16*2*16 {
		t.Fatalf("get wrote %v bytes (%v), want 5 blocks of %d", fi.Size(), err, 2*2*8*16*2*16)
	}
	// Token ids are hashed with the engine's page size; a relative socket
	// path works.
	tokens := make([]string, 64)
	for i := range tokens {
		tokens[i] = strconv.Itoa(1000 + i)
	}
	code, _, errs = runCmd(t, "", append(append([]string{"put", "--page-size", "32"}, model...), append(sock, tokens...)...)...)
	if code != 0 {
		t.Fatalf("put --page-size 32: exit %d: %s", code, errs)
	}
	wd, _ := os.Getwd()
	rel, err := filepath.Rel(wd, a.EngineSocket())
	if err != nil {
		t.Fatal(err)
	}
	code, out, errs = runCmd(t, "", append(append([]string{"import", "--page-size", "32", "--socket", rel}, model...), tokens...)...)
	if code != 0 || !strings.Contains(out, "2 of 2 blocks here") {
		t.Fatalf("import of tokens, page 32, relative socket: exit %d: %q %s", code, out, errs)
	}
	// A hash nobody holds: import says so and fails.
	code, _, errs = runCmd(t, "", append([]string{"import", "--hashes", "12345"}, sock...)...)
	if code != 1 || !strings.Contains(errs, "not imported") {
		t.Fatalf("import of a missing hash: exit %d: %s", code, errs)
	}
	for _, bad := range [][]string{
		{"lookup", "--hashes", "1,x"},
		{"put", "--generate", "2", "--order", "XYZ"},
		{"put", "--generate", "2", "--dtype", "f64"},
		{"get", "--hashes", "1"},
	} {
		if code, _, errs := runCmd(t, "", append(bad, sock...)...); code != 2 {
			t.Errorf("%v: exit %d (%s), want 2", bad, code, errs)
		}
	}
	if code, _, errs := runCmd(t, "", "status", "--socket", filepath.Join(t.TempDir(), "none.sock")); code != 1 || !strings.Contains(errs, "is the agent running") {
		t.Errorf("status without an agent: exit %d: %s", code, errs)
	}
}

// certs makes a CA and a node certificate into folders that do not exist
// yet, and never overwrites a key.
func TestCertsCommand(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "etc", "kvfabric")
	if code, _, errs := runCmd(t, "", "certs", "ca", "--out", dir); code != 0 {
		t.Fatalf("certs ca: exit %d: %s", code, errs)
	}
	if code, _, errs := runCmd(t, "", "certs", "node", "gpu-7", "--ca-cert", filepath.Join(dir, "ca.crt"), "--ca-key", filepath.Join(dir, "ca.key"), "--out", filepath.Join(dir, "nodes")); code != 0 {
		t.Fatalf("certs node: exit %d: %s", code, errs)
	}
	fi, err := os.Stat(filepath.Join(dir, "nodes", "gpu-7.key"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("node key: %v %v", fi, err)
	}
	if code, _, errs := runCmd(t, "", "certs", "ca", "--out", dir); code != 1 || !strings.Contains(errs, "exists") {
		t.Fatalf("certs ca over an existing CA: exit %d: %s", code, errs)
	}
	if code, _, _ := runCmd(t, "", "certs", "node", "bad name", "--out", dir); code != 2 {
		t.Fatalf("certs node with a bad name: exit %d, want 2", code)
	}
}

// deploy/agent.json names the files certs writes: certs ca and certs node
// for its node_name, into one folder, make exactly its ca_file, cert_file
// and key_file, and an agent checks them as it would at start.
func TestExampleConfigNamesTheCertsFiles(t *testing.T) {
	c, err := fabric.LoadConfigFile(filepath.Join("..", "..", "deploy", "agent.json"), fabric.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Dir(c.CAFile)
	if filepath.Dir(c.CertFile) != dir || filepath.Dir(c.KeyFile) != dir {
		t.Fatalf("deploy/agent.json: ca_file %s, cert_file %s, key_file %s are not in one folder", c.CAFile, c.CertFile, c.KeyFile)
	}
	out := t.TempDir()
	if code, _, errs := runCmd(t, "", "certs", "ca", "--out", out); code != 0 {
		t.Fatalf("certs ca: exit %d: %s", code, errs)
	}
	if code, _, errs := runCmd(t, "", "certs", "node", c.NodeName, "--ca-cert", filepath.Join(out, "ca.crt"), "--ca-key", filepath.Join(out, "ca.key"), "--out", out); code != 0 {
		t.Fatalf("certs node %s: exit %d: %s", c.NodeName, code, errs)
	}
	for _, f := range []string{c.CAFile, c.CertFile, c.KeyFile} {
		if _, err := os.Stat(filepath.Join(out, filepath.Base(f))); err != nil {
			t.Errorf("deploy/agent.json names %s, which certs does not write: %v", f, err)
		}
	}
	if _, _, _, err := certs.LoadNode(filepath.Join(out, filepath.Base(c.CAFile)), filepath.Join(out, filepath.Base(c.CertFile)),
		filepath.Join(out, filepath.Base(c.KeyFile)), c.NodeName, time.Now()); err != nil {
		t.Fatalf("the files deploy/agent.json names, as certs writes them: %v", err)
	}
}

// Two CAs made by certs ca with the same (default) name still have
// different subjects: an agent given a certificate of one and the other
// as its CA refuses to start, and the refusal names two different CAs.
func TestCertsCAsHaveUniqueSubjects(t *testing.T) {
	dir := t.TempDir()
	one, two := filepath.Join(dir, "one"), filepath.Join(dir, "two")
	for _, d := range []string{one, two} {
		if code, _, errs := runCmd(t, "", "certs", "ca", "--out", d); code != 0 {
			t.Fatalf("certs ca --out %s: exit %d: %s", d, code, errs)
		}
	}
	if code, _, errs := runCmd(t, "", "certs", "node", "n1", "--ca-cert", filepath.Join(two, "ca.crt"), "--ca-key", filepath.Join(two, "ca.key"), "--out", two); code != 0 {
		t.Fatalf("certs node: exit %d: %s", code, errs)
	}
	code, _, errs := runCmd(t, "", "agent", "--local", "--node", "n1", "--data-dir", filepath.Join(dir, "data"),
		"--ca", filepath.Join(one, "ca.crt"), "--cert", filepath.Join(two, "n1.crt"), "--key", filepath.Join(two, "n1.key"))
	m := regexp.MustCompile(`issued by "([^"]+)", which is not the cluster CA "([^"]+)"`).FindStringSubmatch(errs)
	if code != 2 || m == nil {
		t.Fatalf("agent with another CA's certificate: exit %d, want 2 naming both CAs: %s", code, errs)
	}
	if m[1] == m[2] || !strings.Contains(m[1], "CN=kvfabric cluster CA") || !strings.Contains(m[2], "CN=kvfabric cluster CA") {
		t.Fatalf("the refusal names the issuer %q and the cluster CA %q: want two different subjects of the default name", m[1], m[2])
	}
}

// startTestAgent starts a loopback agent named name with a 64 MiB pool for
// the client commands to talk to. Its directory is short (unix socket
// paths are), and removed at the end of the test.
func startTestAgent(t *testing.T, name string) *fabric.Agent {
	t.Helper()
	return startTestAgentWith(t, name, nil)
}

// startTestAgentWith is startTestAgent with configure applied last.
func startTestAgentWith(t *testing.T, name string, configure func(*fabric.Config)) *fabric.Agent {
	t.Helper()
	dir, err := os.MkdirTemp("", "kvfcli")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	c := fabric.DefaultLocalConfig()
	c.NodeName, c.DataDir, c.DevCADir = name, filepath.Join(dir, "d"), filepath.Join(dir, "ca")
	c.GossipAddr, c.PeerAddr, c.MetricsAddr = "127.0.0.1:0", "127.0.0.1:0", "off"
	c.Pools = []string{"host=64MiB"}
	c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	c.Dumpable = true // softverbs and softcuda read agents' memory from other processes
	if configure != nil {
		configure(&c)
	}
	a, err := fabric.Start(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

// waitIndexed waits until a look-up on a finds there the leading blocks of
// hashes that its block set set holds. put returns once the pool has
// registered its blocks, and the pool hands their events to the index from
// its own goroutine, so a look-up at once may find none of them yet. The
// look-up names the set, so that one answer gives both sides: its local
// tiers (what the set holds) and its overlap for a (what the index holds).
func waitIndexed(t *testing.T, a *fabric.Agent, set string, hashes []string) {
	t.Helper()
	req := &fabricpb.LookupRequest{Hashes: make([]uint64, len(hashes))}
	var err error
	if req.BlockSet, err = strconv.ParseUint(set, 10, 64); err != nil {
		t.Fatalf("block set %q: %v", set, err)
	}
	for i, h := range hashes {
		if req.Hashes[i], err = strconv.ParseUint(h, 10, 64); err != nil {
			t.Fatalf("hash %q: %v", h, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, a.EngineSocket())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	wait.For(t, 20*time.Second, a.NodeName()+"'s index to hold what its block set holds", func() error {
		resp, err := c.API().Lookup(ctx, req)
		if err != nil {
			return err
		}
		held := 0
		for held < len(resp.LocalTiers) && resp.LocalTiers[held] != "" {
			held++
		}
		indexed := uint32(0)
		for _, o := range resp.Overlaps {
			if o.Node == a.NodeName() {
				indexed = o.Blocks
			}
		}
		if held == 0 || indexed != uint32(held) {
			return fmt.Errorf("the set holds %d leading blocks of %d, the index %d", held, len(hashes), indexed)
		}
		return nil
	})
}

// import and get given token ids pass them through to the agent, which
// then also finds holders that stored the blocks at a page size dividing
// the engine's: blocks put at page 16 on one node come to another as
// page-32 blocks. Named by the engine's hashes (page 32) instead, no
// holder has them.
func TestImportTokensAcrossPageSizes(t *testing.T) {
	ca := t.TempDir() // one development CA for both agents
	holder := startTestAgentWith(t, "cli-page16", func(c *fabric.Config) { c.DevCADir = ca })
	importer := startTestAgentWith(t, "cli-page32", func(c *fabric.Config) {
		c.DevCADir, c.Join = ca, []string{holder.GossipAddr()}
	})
	model := []string{"--tp", "2", "--layers", "2", "--head-dim", "16"}
	tokens := make([]string, 64)
	for i := range tokens {
		tokens[i] = strconv.Itoa(2000 + i)
	}
	code, _, errs := runCmd(t, "", append(append([]string{"put", "--page-size", "16", "--socket", holder.EngineSocket()}, model...), tokens...)...)
	if code != 0 {
		t.Fatalf("put --page-size 16: exit %d: %s", code, errs)
	}
	sock := []string{"--socket", importer.EngineSocket()}
	wait.For(t, 20*time.Second, "the importer's index to hold the page-16 blocks", func() error {
		code, out, errs := runCmd(t, "", append([]string{"lookup", "--block-size", "16"}, append(sock, tokens...)...)...)
		if code != 0 {
			return fmt.Errorf("lookup: exit %d: %q %s", code, out, errs)
		}
		return nil
	})
	// Asked by the engine's own hashes of the same tokens (what import
	// sent before it passed tokens through), no holder has them.
	code, hashOut, errs := runCmd(t, "", append([]string{"hash", "--block-size", "32"}, tokens...)...)
	if code != 0 {
		t.Fatalf("hash: exit %d: %s", code, errs)
	}
	var hs []string
	for _, line := range strings.Split(strings.TrimSpace(hashOut), "\n") {
		hs = append(hs, strings.Fields(line)[2])
	}
	code, _, errs = runCmd(t, "", append([]string{"import", "--page-size", "32", "--engine", "by-hash", "--hashes", strings.Join(hs, ","),
		"--socket", importer.EngineSocket()}, model...)...)
	if code != 1 || !strings.Contains(errs, "not imported") {
		t.Fatalf("import by page-32 hashes where only page-16 blocks exist: exit %d, want 1: %s", code, errs)
	}
	code, out, errs := runCmd(t, "", append(append([]string{"import", "--page-size", "32"}, model...), append(sock, tokens...)...)...)
	if code != 0 || !strings.Contains(out, "2 of 2 blocks here") || !strings.Contains(out, "cli-page16") {
		t.Fatalf("import of page-16 blocks by tokens at page 32: exit %d: %q %s", code, out, errs)
	}
	file := filepath.Join(t.TempDir(), "blocks.bin")
	code, _, errs = runCmd(t, "", append(append([]string{"get", "--page-size", "32", "--engine", "get32", "--tp", "1", "--out", file, "--layers", "2", "--head-dim", "16"}, sock...), tokens...)...)
	if code != 0 {
		t.Fatalf("get of page-16 blocks by tokens at page 32: exit %d: %s", code, errs)
	}
	if fi, err := os.Stat(file); err != nil || fi.Size() != 2*2*2*8*32*16*2 {
		t.Fatalf("get wrote %v bytes (%v), want 2 page-32 blocks", fi.Size(), err)
	}
}
