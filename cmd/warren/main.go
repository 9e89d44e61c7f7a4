// Command warren is the single binary of warren: server parts and client verbs.
package main

import "github.com/warrenhq/warren/internal/cli"

func main() { cli.Execute() }
