package api

import "time"

// PortRequest changes a sandbox port's exposure: POST
// /v1/sandboxes/{id}/ports/{port}. Public true makes an unguessable URL
// that reaches the port without a token (a new one each time: the old is
// revoked); false revokes it.
type PortRequest struct {
	Public bool `json:"public"`
}

// Port is a sandbox port's exposure. URL and Path are set only in the
// answer that made them: warren keeps only a hash of the URL's secret.
type Port struct {
	Sandbox string     `json:"sandbox"`
	Port    int        `json:"port"`
	Public  bool       `json:"public"`
	URL     string     `json:"url,omitempty"`  // absolute, as the caller reached the API
	Path    string     `json:"path,omitempty"` // /p/<secret>/
	Project string     `json:"project,omitempty"`
	Created *time.Time `json:"created,omitempty"`
}

// PortList is a sandbox's public ports.
type PortList struct {
	Ports []Port `json:"ports"`
}
