package fabric

import (
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/layout"
)

// Bounds on the strings an engine sends. Every one of them ends up in logs,
// in status and in memory the agent keeps for as long as a session or a
// block set lives, so none is taken unbounded.
const (
	// MaxEngineName is the longest engine name (RegisterRequest.engine,
	// SessionRequest.engine) in bytes.
	MaxEngineName = 128
	// MaxDeviceName is the longest device name (RegisterRequest.devices)
	// in bytes: a PCI bus id or a CUDA index is far shorter.
	MaxDeviceName = 64
	// MaxHashNamespace is the longest salt or LoRA name (Tokens.salt,
	// Tokens.lora) in bytes.
	MaxHashNamespace = 256
)

// checkString refuses a string an engine sent that is longer than max
// bytes, naming the field. (Protobuf has already refused one that is not
// UTF-8.)
func checkString(field, s string, max int) error {
	if len(s) > max {
		return status.Errorf(codes.InvalidArgument, "%s: %d bytes (at most %d)", field, len(s), max)
	}
	return nil
}

// checkRegisterStrings bounds the strings of a RegisterRequest.
func checkRegisterStrings(req *fabricpb.RegisterRequest) error {
	if err := checkString("engine", req.GetEngine(), MaxEngineName); err != nil {
		return err
	}
	if req.GetEngine() == stagingEngine {
		return status.Errorf(codes.InvalidArgument, "engine: %q is the agent's own (its staging sets for peers)", stagingEngine)
	}
	if n := len(req.GetDevices()); n > layout.MaxTPSize {
		return status.Errorf(codes.InvalidArgument, "devices: %d entries (at most %d, one per rank)", n, layout.MaxTPSize)
	}
	for _, d := range req.GetDevices() {
		if err := checkString("devices", d, MaxDeviceName); err != nil {
			return err
		}
	}
	return nil
}

// checkTokenStrings bounds the hash namespace of a request's tokens.
func checkTokenStrings(t *fabricpb.Tokens) error {
	if t == nil {
		return nil
	}
	if err := checkString("tokens.salt", t.GetSalt(), MaxHashNamespace); err != nil {
		return err
	}
	return checkString("tokens.lora", t.GetLora(), MaxHashNamespace)
}
