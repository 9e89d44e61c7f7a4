// Command ipc makes IPC objects that outlive their process inside a
// sandbox (make), or reports which exist (count). Built static by the
// container tests and run inside sandboxes.
package main

import (
	"fmt"
	"os"

	"github.com/warrenhq/warren/internal/confine/confinetest"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: ipc make|count")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "make":
		if err := confinetest.MakeIPC(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println("made")
	case "count":
		s, err := confinetest.CountIPC()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println(s)
	}
}
