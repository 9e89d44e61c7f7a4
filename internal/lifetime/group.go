// Package lifetime owns a part's goroutines and the calls it serves: it
// starts them, refuses new ones once the part is closing, and waits for
// what is still running, with a deadline when the caller wants one.
//
// Unlike sync.WaitGroup, a Group may be waited on while work is still
// being added (a refused Go says so instead of racing the Wait), and
// waited on more than once.
package lifetime

// Locks: Group.mu alone; nothing is called while it is held.

import (
	"context"
	"sync"
)

// Group counts goroutines and calls in flight. The zero value is ready.
type Group struct {
	mu     sync.Mutex
	n      int
	closed bool
	zero   chan struct{} // closed when n drops to 0 while a Wait waits
}

// Go runs fn in a goroutine the group waits for. Once Close was called it
// runs nothing and reports false.
func (g *Group) Go(fn func()) bool {
	if !g.Enter() {
		return false
	}
	go func() {
		defer g.Done()
		fn()
	}()
	return true
}

// Enter counts one call in flight (end it with Done); false once Close was
// called.
func (g *Group) Enter() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.n++
	return true
}

// Add counts n more, as sync.WaitGroup's Add, even after Close: for work
// started by work the group already counts (so it cannot be refused
// halfway), which Wait then waits for as well.
func (g *Group) Add(n int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.n += n
	g.checkLocked()
}

// Done ends one counted goroutine or call.
func (g *Group) Done() { g.Add(-1) }

func (g *Group) checkLocked() {
	if g.n < 0 {
		panic("lifetime: negative count")
	}
	if g.n == 0 && g.zero != nil {
		close(g.zero)
		g.zero = nil
	}
}

// Close refuses new work (Go and Enter); what runs goes on.
func (g *Group) Close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
}

// Len is how much is in flight.
func (g *Group) Len() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.n
}

// Wait waits until nothing is in flight, or until ctx ends (its error).
func (g *Group) Wait(ctx context.Context) error {
	g.mu.Lock()
	if g.n == 0 {
		g.mu.Unlock()
		return nil
	}
	if g.zero == nil {
		g.zero = make(chan struct{})
	}
	z := g.zero
	g.mu.Unlock()
	select {
	case <-z:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
