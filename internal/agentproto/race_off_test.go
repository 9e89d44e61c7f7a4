//go:build !race

package agentproto

// raceOn: built with the race detector (see race_on_test.go).
const raceOn = false
