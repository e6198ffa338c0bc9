module github.com/kvfabric/kvfabric

go 1.26

require (
	github.com/zeebo/xxh3 v1.1.0
	google.golang.org/protobuf v1.36.12
)

require (
	github.com/klauspost/cpuid/v2 v2.2.10 // indirect
	golang.org/x/sys v0.30.0 // indirect
)
