package cuda

import (
	"log/slog"
	"os"
)

// EnvLibrary names the driver library when Config.Path is empty.
const EnvLibrary = "KVFABRIC_CUDA_LIB"

// DefaultLibrary is the driver's soname, what a machine with the NVIDIA
// driver installed has in its loader path.
const DefaultLibrary = "libcuda.so.1"

// Config configures Open.
type Config struct {
	// Path is the driver library to dlopen. If empty, $KVFABRIC_CUDA_LIB,
	// and if that is empty too, libcuda.so.1.
	Path string
	// Logger receives what the driver said at Open. If nil, slog.Default().
	Logger *slog.Logger
}

func (c Config) path() string {
	if c.Path != "" {
		return c.Path
	}
	if p := os.Getenv(EnvLibrary); p != "" {
		return p
	}
	return DefaultLibrary
}

func (c Config) logger() *slog.Logger {
	if c.Logger != nil {
		return c.Logger
	}
	return slog.Default()
}
