package fabric

import (
	"time"

	"github.com/kvfabric/kvfabric/pool/cuda"
	"github.com/kvfabric/kvfabric/rdma/ofi"
)

// ofiProviderInfo is what the agent takes its libfabric provider to
// report when it chooses how to register a device pool; tests replace it
// to fake a provider's capabilities.
var ofiProviderInfo = func(p ofi.ProviderInfo) ofi.ProviderInfo { return p }

// registerDevicePoolOFI registers device pool i with libfabric's endpoint
// as the provider's DevicePlan says: by device pointer (fi_mr_regattr,
// FI_HMEM_CUDA) where it offers FI_HMEM, so that peers read the pool and
// imports land in it with no host copy; else not at all, its blocks
// staged through pinned host memory over QUIC (import_staging.go), which
// is logged once and is no error, rdma=on included: it is how such a
// provider moves GPU memory. A registration that fails is logged and
// staged the same way, or refused at start with rdma=on.
func (a *Agent) registerDevicePoolOFI(i int, dm *cuda.DeviceMemory) error {
	gpu := a.gpus[i]
	info := ofiProviderInfo(a.ofiEp.Info())
	plan, why := info.DevicePlan()
	if plan == ofi.DeviceStaged {
		a.log.Info("device pool staged through host memory: libfabric's provider does not register GPU memory",
			"gpu", gpu, "provider", info.Provider, "reason", why)
		return nil
	}
	start := time.Now()
	st, err := a.transport.RegisterCUDA(a.poolNIC[i], gpu, dm.Addr(), dm.Size())
	if err == nil {
		a.rdmaReg[i], a.poolDevice[i] = plan.String(), a.rdmaDeviceName(i)
		a.log.Info("device pool registered for RDMA over libfabric by device pointer (FI_HMEM)", "gpu", gpu,
			"device", a.poolDevice[i], "bytes", st.Bytes, "took", st.Duration, "total", time.Since(start))
		return nil
	}
	if a.cfg.RDMA == "on" {
		return badSettingErr("rdma", err, "on, and the device pool on GPU %d cannot be registered with libfabric %s (%s): %v", gpu, info.Provider, why, err)
	}
	a.log.Warn("RDMA registration of the device pool failed: its blocks move over QUIC through pinned staging",
		"gpu", gpu, "provider", info.Provider, "bytes", dm.Size(), "err", err)
	return nil
}
