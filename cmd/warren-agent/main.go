// Command warren-agent is PID 1 inside a warren sandbox. The edge starts it
// with fd 3 a listening unix socket; see internal/agent.
package main

import "github.com/warrenhq/warren/internal/agent"

func main() { agent.Main() }
