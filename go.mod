module github.com/kvfabric/kvfabric

go 1.26.0

require (
	github.com/quic-go/quic-go v0.65.0
	github.com/zeebo/xxh3 v1.1.0
	golang.org/x/sys v0.48.0
	google.golang.org/grpc v1.85.0
	google.golang.org/protobuf v1.36.12
)

require (
	github.com/klauspost/cpuid/v2 v2.2.10 // indirect
	golang.org/x/crypto v0.57.0 // indirect
	golang.org/x/net v0.60.0 // indirect
	golang.org/x/text v0.42.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260817212433-ac3dfec99bb1 // indirect
)
