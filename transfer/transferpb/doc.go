// Package transferpb holds the wire messages of the kvfabric peer protocol.
//
// transfer.pb.go is generated from transfer.proto; regenerate from the
// repository root with:
//
//	protoc --go_out=. --go_opt=paths=source_relative transfer/transferpb/transfer.proto
package transferpb
