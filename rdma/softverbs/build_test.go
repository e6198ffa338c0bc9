package softverbs_test

import (
	"debug/elf"
	"os"
	"testing"

	"github.com/kvfabric/kvfabric/rdma/softverbs"
)

// The symbols the rdma binding resolves with dlsym, as the contract lists
// them (ibv_reg_dmabuf_mr and _ibv_query_gid_ex are optional there; softverbs
// has both).
var contract = []string{
	"ibv_get_device_list", "ibv_free_device_list", "ibv_get_device_name", "ibv_get_device_guid",
	"ibv_open_device", "ibv_close_device", "ibv_query_device", "ibv_query_port",
	"_ibv_query_gid_ex", "ibv_query_gid", "ibv_alloc_pd", "ibv_dealloc_pd", "ibv_reg_mr",
	"ibv_reg_dmabuf_mr", "ibv_dereg_mr", "ibv_create_cq", "ibv_destroy_cq", "ibv_create_qp",
	"ibv_modify_qp", "ibv_query_qp", "ibv_destroy_qp", "ibv_wc_status_str",
}

func TestExportsTheContract(t *testing.T) {
	needDriver(t)
	f, err := elf.Open(libPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	defined := map[string]bool{}
	for _, s := range syms {
		if s.Section != elf.SHN_UNDEF && elf.ST_TYPE(s.Info) == elf.STT_FUNC {
			defined[s.Name] = true
		}
	}
	for _, name := range contract {
		if !defined[name] {
			t.Errorf("%s is not exported by %s", name, libPath)
		}
	}
}

// Build reuses a library it built before in the same directory.
func TestBuildCaches(t *testing.T) {
	needDriver(t)
	dir := t.TempDir()
	a, err := softverbs.Build(dir)
	if err != nil {
		t.Fatal(err)
	}
	st1, err := os.Stat(a)
	if err != nil {
		t.Fatal(err)
	}
	b, err := softverbs.Build(dir)
	if err != nil {
		t.Fatal(err)
	}
	st2, err := os.Stat(b)
	if err != nil {
		t.Fatal(err)
	}
	if a != b || !os.SameFile(st1, st2) || !st1.ModTime().Equal(st2.ModTime()) {
		t.Fatalf("second Build gave %s (%v), first %s (%v)", b, st2.ModTime(), a, st1.ModTime())
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Fatalf("build dir holds %d entries, want the library alone", len(ents))
	}
}
