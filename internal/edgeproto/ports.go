package edgeproto

// OpPort opens a stream to a port of the sandbox (data plane only): a
// PortRequest; the upload is what goes in, data frames what comes out.
const OpPort = "port"

// PortRequest names a port of a sandbox's loopback.
type PortRequest struct {
	ID   string `json:"id"`
	Port int    `json:"port"`
}
