package agent

import (
	"sync"
	"time"
)

// warmPool keeps shells of the default user started ahead of time, blocked
// reading their script: an exec then skips fork+exec of the shell (about
// 0.7 ms here) on its critical path.
type warmPool struct {
	a     *Agent
	size  int
	shell string
	env   map[string]string
	dir   string
	cred  *credential

	// perTask: a stateless (FnCall) sandbox is reset after every task, and
	// the reset kills every shell, idle or not. Its pool holds the one
	// shell the next task uses and refills only after a reset, never
	// during a task, so no shell is spawned only to be killed.
	perTask bool

	mu      sync.Mutex
	gen     int  // bumped by a reset: shells of an older generation are discarded
	stopped bool // no refills during a reset
	idle    []*shellProc
	filling bool
	filled  *sync.Cond // on mu: a refill added a shell or stopped
	failed  time.Time
	timer   *time.Timer
}

func newWarmPool(a *Agent, size int, shell string, env map[string]string, dir string, cred *credential, perTask bool) *warmPool {
	// The pool fills on first use, not at setup: a sandbox that is created,
	// runs one command and stops (or sits idle) never pays for shells it
	// does not use.
	if perTask {
		size = 1
	}
	p := &warmPool{a: a, size: size, shell: shell, env: env, dir: dir, cred: cred, perTask: perTask}
	p.filled = sync.NewCond(&p.mu)
	return p
}

// get returns a live idle shell for cred, or nil.
func (p *warmPool) get(cred *credential) *shellProc {
	if cred.key() != p.cred.key() {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.perTask {
		// The reset's refill may still be starting the shell: wait for it
		// rather than start a second one that would only be killed.
		for len(p.idle) == 0 && p.filling && !p.stopped {
			p.filled.Wait()
		}
		p.stopped = true // until the reset's refill
	} else if len(p.idle) <= 1 {
		// Refill at once only when running dry; otherwise refillSoon
		// after the command, off its critical path.
		defer p.refillLocked()
	}
	for len(p.idle) > 0 {
		sp := p.idle[0]
		p.idle = p.idle[1:]
		select {
		case <-sp.exit: // died while idle (e.g. kill -9 -1 in the sandbox)
			sp.release()
		default:
			return sp
		}
	}
	return nil
}

func (p *warmPool) refillLocked() {
	if p.filling || p.stopped || len(p.idle) >= p.size || time.Since(p.failed) < time.Second {
		return
	}
	p.filling = true
	go func() {
		for {
			p.mu.Lock()
			if p.stopped || len(p.idle) >= p.size {
				p.filling = false
				p.filled.Broadcast()
				p.mu.Unlock()
				return
			}
			gen := p.gen
			p.mu.Unlock()
			sp, err := p.a.spawnShell(p.shell, p.env, p.dir, p.cred, "")
			p.mu.Lock()
			if err == nil && gen != p.gen {
				// A reset happened meanwhile: this shell may be dead, or
				// may have seen the previous task.
				p.discard(sp)
				p.mu.Unlock()
				continue
			}
			if err != nil {
				p.a.log.Warn("agent: warm shell", "err", err)
				p.failed = time.Now()
				p.filling = false
				p.filled.Broadcast()
				p.mu.Unlock()
				return
			}
			p.idle = append(p.idle, sp)
			p.filled.Broadcast()
			p.mu.Unlock()
		}
	}()
}

// discard ends an idle shell that cannot be used.
func (p *warmPool) discard(sp *shellProc) {
	_ = killGroup(sp.pid)
	sp.release()
	go func() { <-sp.exit }()
}

// refillDelay is the quiet time after a command before the pool is topped
// up, so the refill's fork+exec does not compete with answering the command
// or with the client's next one.
const refillDelay = time.Millisecond

// refillSoon tops the pool up once no command has ended for refillDelay.
func (p *warmPool) refillSoon() {
	if p.perTask {
		return // the reset refills
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.timer == nil {
		p.timer = time.AfterFunc(refillDelay, func() {
			p.mu.Lock()
			p.refillLocked()
			p.mu.Unlock()
		})
		return
	}
	p.timer.Reset(refillDelay)
}

// invalidate forgets every idle shell (a reset kills them) and makes the
// shells being spawned right now discarded when they arrive.
func (p *warmPool) invalidate() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gen++
	p.stopped = true
	for _, sp := range p.idle {
		p.discard(sp)
	}
	p.idle = nil
	p.failed = time.Time{}
	p.filled.Broadcast()
}

// refill starts topping the pool up now.
func (p *warmPool) refill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopped = false
	p.refillLocked()
}

// quiesce invalidates the pool for good and waits until no refill is
// starting a shell (a wipe must not race a fork).
func (p *warmPool) quiesce() {
	p.invalidate()
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.filling {
		p.filled.Wait()
	}
}
