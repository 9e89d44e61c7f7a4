package e2e

import "testing"

// TestZZSharedServerStopsClean stops the shared server and checks that
// nothing is left behind. Go runs a package's tests file by file, in the
// order of the file names, so it lives in the file that sorts last: in
// sandbox_test.go it ran before the tests of storage_test.go,
// terminal_test.go and others, which then found the shared server gone
// ("connection refused").
func TestZZSharedServerStopsClean(t *testing.T) {
	for _, stop := range sharedStops {
		stop()
	}
	sharedStops = nil
	assertNoLeaks(t)
}
