package edgeproto

import "github.com/warrenhq/warren/api"

// A sandbox's screen (tier vm with display: true; issue 17, item 9).
const (
	// OpScreenshot: IDRequest → ScreenshotResult.
	OpScreenshot = "screenshot"
	// OpDisplayInput: DisplayInputRequest → {}.
	OpDisplayInput = "display_input"
	// OpDisplay opens a stream to the screen's VNC server (data plane
	// only, as OpPort): an IDRequest; the upload is what goes in (RFB from
	// the client), data frames what comes out.
	OpDisplay = "display"
)

// ScreenshotResult is the screen as a PNG.
type ScreenshotResult struct {
	PNG []byte `json:"png"`
}

// DisplayInputRequest is one input event for sandbox ID's screen.
type DisplayInputRequest struct {
	ID    string           `json:"id"`
	Input api.DisplayInput `json:"input"`
}
