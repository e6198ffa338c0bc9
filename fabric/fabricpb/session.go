package fabricpb

// SessionMetadata is the gRPC metadata key naming, in decimal, the session
// a call works under (the id from OpenSession's first event).
const SessionMetadata = "kvfabric-session"
