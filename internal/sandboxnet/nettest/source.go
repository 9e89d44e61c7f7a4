package nettest

import "net"

// SourcePort sends zeros (after the greeting) until the client closes:
// a download as fast as the path takes it.
const SourcePort = "8081"

func source(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			if _, err := c.Write([]byte("hello")); err != nil {
				return
			}
			b := make([]byte, 64<<10)
			for {
				if _, err := c.Write(b); err != nil {
					return
				}
			}
		}()
	}
}
