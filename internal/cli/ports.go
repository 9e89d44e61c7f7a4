package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	warren "github.com/warrenhq/warren/sdk/go"
)

// newPortForwardCmd: warren port-forward ID [LOCAL:]PORT forwards a local
// TCP port to a port of the sandbox, one raw stream through the API per
// connection.
func newPortForwardCmd(g *globals) *cobra.Command {
	var addr string
	cmd := &cobra.Command{
		Use:   "port-forward SANDBOX [LOCAL:]PORT",
		Short: "forward a local TCP port to a port inside a sandbox (raw TCP through the API)",
		Long: "Listens on LOCAL (default: PORT; 0 picks a free one) of --address and forwards each\n" +
			"connection to PORT on the sandbox's loopback, until interrupted.",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			local, port, err := parseForward(args[1])
			if err != nil {
				return err
			}
			ln, err := net.Listen("tcp", net.JoinHostPort(addr, strconv.Itoa(local)))
			if err != nil {
				return err
			}
			defer ln.Close()
			fmt.Fprintf(cmd.OutOrStdout(), "forwarding %s -> %s:%d\n", ln.Addr(), args[0], port)
			return forward(cmd.Context(), g.client(), ln, args[0], port, cmd.ErrOrStderr())
		},
	}
	cmd.Flags().StringVar(&addr, "address", "127.0.0.1", "local address to listen on")
	return cmd
}

// parseForward reads [LOCAL:]PORT.
func parseForward(s string) (local, port int, err error) {
	l, p, ok := strings.Cut(s, ":")
	if !ok {
		l, p = s, s
	}
	port, err = strconv.Atoi(p)
	if err != nil || port < 1 || port > 65535 {
		return 0, 0, fmt.Errorf("port %q is not a port number (1-65535)", p)
	}
	local, err = strconv.Atoi(l)
	if err != nil || local < 0 || local > 65535 {
		return 0, 0, fmt.Errorf("local port %q is not a port number (0-65535)", l)
	}
	return local, port, nil
}

// forward serves ln until ctx ends.
func forward(ctx context.Context, c *warren.Client, ln net.Listener, id string, port int, log io.Writer) error {
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		go func() {
			defer conn.Close()
			pc, err := c.DialPort(ctx, id, port)
			if err != nil {
				fmt.Fprintf(log, "port-forward: %v\n", err)
				return
			}
			defer pc.Close()
			pipeBoth(conn, pc)
		}()
	}
}

type halfCloser interface {
	net.Conn
	CloseWrite() error
}

// pipeBoth copies both ways until both directions ended, passing half
// closes on.
func pipeBoth(a net.Conn, b halfCloser) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := io.Copy(b, a); err != nil && !errors.Is(err, net.ErrClosed) {
			b.Close()
			return
		}
		_ = b.CloseWrite()
	}()
	if _, err := io.Copy(a, b); err != nil {
		a.Close()
	} else if cw, ok := a.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	<-done
}

// newExposeCmd: warren expose ID PORT makes a port public (prints its
// URL); --revoke makes it private again.
func newExposeCmd(g *globals) *cobra.Command {
	var revoke bool
	cmd := &cobra.Command{
		Use:   "expose SANDBOX PORT",
		Short: "give a sandbox's port an unguessable public URL (no token needed); --revoke ends it",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			port, err := strconv.Atoi(args[1])
			if err != nil {
				return fmt.Errorf("port %q is not a number", args[1])
			}
			c := g.client()
			if revoke {
				p, err := c.UnexposePort(cmd.Context(), args[0], port)
				if err != nil {
					return err
				}
				if g.json {
					return printJSON(cmd.OutOrStdout(), p)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "port %d of %s is private\n", port, args[0])
				return nil
			}
			p, err := c.ExposePort(cmd.Context(), args[0], port)
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), p)
			}
			fmt.Fprintln(cmd.OutOrStdout(), p.URL)
			return nil
		},
	}
	cmd.Flags().BoolVar(&revoke, "revoke", false, "revoke the port's public URL")
	return cmd
}
