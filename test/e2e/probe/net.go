package main

// Network subcommands of the probe, for the network e2e tests:
//
//	probe scan ADDR PORTS SECS    connect to ports 1..PORTS of ADDR, 100 at a
//	                              time, round after round for at least SECS
//	                              seconds (one round at least); prints
//	                              "rounds R refused N open N timeout N other N
//	                              round-max D"
//	probe rtt ADDR SECS           connect to ADDR one after another for SECS
//	                              seconds, reading each greeting, 0.5 ms
//	                              apart; prints "n N failed N p50 D p99 D",
//	                              and the first failure to stderr
//	probe conns ADDR N SECS       open N connections to ADDR at once, hold the
//	                              ones that were greeted for SECS seconds;
//	                              prints "greeted N refused N timeout N"
//	                              before the hold

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"
)

func atoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	return n
}

// netMain runs a network subcommand; false when args name none.
func netMain(args []string) bool {
	switch {
	case len(args) == 4 && args[0] == "scan":
		scan(args[1], atoi(args[2]), atoi(args[3]))
	case len(args) == 3 && args[0] == "rtt":
		rtt(args[1], atoi(args[2]))
	case len(args) == 4 && args[0] == "conns":
		conns(args[1], atoi(args[2]), atoi(args[3]))
	default:
		return false
	}
	return true
}

type outcomes struct {
	mu                            sync.Mutex
	open, refused, timeout, other int
}

func (o *outcomes) add(err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	var ne net.Error
	switch {
	case err == nil:
		o.open++
	case errors.Is(err, syscall.ECONNREFUSED):
		o.refused++
	case errors.As(err, &ne) && ne.Timeout():
		o.timeout++
	default:
		o.other++
		if o.other <= 3 {
			fmt.Fprintln(os.Stderr, err)
		}
	}
}

func scan(addr string, ports, secs int) {
	var o outcomes
	var roundMax time.Duration
	t0 := time.Now()
	rounds := 0
	// At least 10 rounds (10,000 SYNs for 1,000 ports), for secs at least.
	for rounds < 10 || time.Since(t0) < time.Duration(secs)*time.Second {
		r0 := time.Now()
		sem := make(chan struct{}, 100)
		var wg sync.WaitGroup
		for p := 1; p <= ports; p++ {
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer func() { <-sem; wg.Done() }()
				c, err := net.DialTimeout("tcp4", net.JoinHostPort(addr, strconv.Itoa(p)), 5*time.Second)
				if c != nil {
					c.Close()
				}
				o.add(err)
			}()
		}
		wg.Wait()
		rounds++
		roundMax = max(roundMax, time.Since(r0))
	}
	fmt.Printf("rounds %d refused %d open %d timeout %d other %d round-max %s\n",
		rounds, o.refused, o.open, o.timeout, o.other, roundMax)
}

func greet(addr string) (net.Conn, error) {
	c, err := net.DialTimeout("tcp4", addr, 3*time.Second)
	if err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	b := make([]byte, 5)
	if _, err := c.Read(b); err != nil {
		c.Close()
		return nil, err
	}
	_ = c.SetDeadline(time.Time{})
	return c, nil
}

func rtt(addr string, secs int) {
	var ds []time.Duration
	failed := 0
	t0 := time.Now()
	// Paced: a sample of the round trip, not a flood of its own (back to
	// back, 20,000 connections in 2 s churned through the sandbox's
	// ephemeral ports and the host's connection tracking, and one in
	// 10,000 failed even before any scan).
	for time.Since(t0) < time.Duration(secs)*time.Second {
		s := time.Now()
		c, err := greet(addr)
		if err != nil {
			if failed == 0 {
				fmt.Fprintf(os.Stderr, "first failure: %v\n", err)
			}
			failed++
			continue
		}
		ds = append(ds, time.Since(s))
		c.Close()
		time.Sleep(500 * time.Microsecond)
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	q := func(f float64) time.Duration {
		if len(ds) == 0 {
			return 0
		}
		return ds[int(f*float64(len(ds)-1))]
	}
	fmt.Printf("n %d failed %d p50 %d p99 %d\n", len(ds), failed, q(0.5).Microseconds(), q(0.99).Microseconds())
}

func conns(addr string, n, secs int) {
	var o outcomes
	var mu sync.Mutex
	var held []net.Conn
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := greet(addr)
			o.add(err)
			if c != nil {
				mu.Lock()
				held = append(held, c)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	fmt.Printf("greeted %d refused %d timeout %d other %d\n", o.open, o.refused, o.timeout, o.other)
	time.Sleep(time.Duration(secs) * time.Second)
	for _, c := range held {
		c.Close()
	}
}
