//go:build race

package agentproto

// raceOn: built with the race detector, whose sync.Pool drops a quarter of
// what it is given (on purpose, to expose reuse bugs).
const raceOn = true
