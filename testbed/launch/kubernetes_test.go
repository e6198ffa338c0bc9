package main

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/kvfabric/kvfabric/testbed"
)

// docs parses every document of a YAML file.
func docs(t *testing.T, path string) []map[string]any {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := yaml.NewDecoder(f)
	var out []map[string]any
	for {
		var d map[string]any
		err := dec.Decode(&d)
		if err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatalf("%s: document %d: %v", path, len(out)+1, err)
		}
		out = append(out, d)
	}
	return out
}

// get walks a parsed document by keys (and list indexes).
func get(t *testing.T, v any, path ...any) any {
	t.Helper()
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				t.Fatalf("at %q: not a mapping", k)
			}
			v = m[k]
		case int:
			l, ok := v.([]any)
			if !ok || k >= len(l) {
				t.Fatalf("at [%d]: not a list that long", k)
			}
			v = l[k]
		}
	}
	return v
}

// The agents' DaemonSet uses host networking and puts the engine socket on
// a hostPath; the testbed's check Job mounts that same hostPath, one pod
// per node, in the DaemonSet's namespace.
func TestKubernetesManifests(t *testing.T) {
	agents := docs(t, "../../deploy/kubernetes/kvfabric.yaml")
	var ds map[string]any
	for _, d := range agents {
		if d["kind"] == "DaemonSet" {
			ds = d
		}
	}
	if ds == nil {
		t.Fatal("no DaemonSet in deploy/kubernetes/kvfabric.yaml")
	}
	spec := get(t, ds, "spec", "template", "spec")
	if get(t, spec, "hostNetwork") != true {
		t.Fatal("the DaemonSet does not use host networking")
	}
	// The engine socket's directory, which engine pods mount, is one of
	// the DaemonSet's hostPaths.
	var hostPaths []string
	for _, v := range get(t, spec, "volumes").([]any) {
		if p, ok := get(t, v, "hostPath").(map[string]any); ok {
			hostPaths = append(hostPaths, p["path"].(string))
		}
	}
	const hostPath = "/var/lib/kvfabric"
	if !slices.Contains(hostPaths, hostPath) {
		t.Fatalf("the DaemonSet's hostPaths %q do not include the engine socket's /var/lib/kvfabric", hostPaths)
	}

	check := docs(t, "../../testbed/kubernetes/check.yaml")
	if len(check) != 1 || check[0]["kind"] != "Job" {
		t.Fatalf("check.yaml: %d documents", len(check))
	}
	job := check[0]
	if ns := get(t, job, "metadata", "namespace"); ns != get(t, ds, "metadata", "namespace") {
		t.Fatalf("check Job in namespace %v, agents in %v", ns, get(t, ds, "metadata", "namespace"))
	}
	if get(t, job, "spec", "completionMode") != "Indexed" || get(t, job, "spec", "completions").(int) < 2 {
		t.Fatal("the check Job is not indexed over at least 2 pods")
	}
	js := get(t, job, "spec", "template", "spec")
	if get(t, js, "affinity", "podAntiAffinity", "requiredDuringSchedulingIgnoredDuringExecution", 0, "topologyKey") != "kubernetes.io/hostname" {
		t.Fatal("the check's pods may share a node")
	}
	if p := get(t, js, "volumes", 0, "hostPath", "path"); p != hostPath {
		t.Fatalf("the check mounts %v, the agents serve %s", p, hostPath)
	}
	c := get(t, js, "containers", 0)
	if m := get(t, c, "volumeMounts", 0, "mountPath"); m != hostPath {
		t.Fatalf("the check mounts the socket folder at %v", m)
	}
	script := get(t, c, "args", 0).(string)

	// The pods' script itself, run here against two agents: pod 0 stores
	// the blocks through node1's socket, pod 1 imports and verifies them
	// through node2's.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl, err := testbed.Start(ctx, testbed.Options{Bin: bin, Nodes: 2, Pool: "host=128MiB"})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	// "kvfabric" on PATH, as in the image.
	binDir := filepath.Dir(bin)
	for i, n := range cl.Nodes {
		cmd := exec.CommandContext(ctx, "/bin/sh", "-c", script)
		cmd.Env = append(os.Environ(), "PATH="+binDir+":"+os.Getenv("PATH"), "KVFABRIC_SOCKET="+n.Socket,
			"JOB_COMPLETION_INDEX="+strconv.Itoa(i), "HOLD_SECONDS=0")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("pod %d's script: %v\n%s", i, err, out)
		}
		t.Logf("pod %d:\n%s", i, out)
		if i == 1 && !strings.Contains(string(out), "verified 64 blocks") {
			t.Fatalf("pod 1 did not verify 64 blocks:\n%s", out)
		}
	}
}
