package elastic

import "github.com/warrenhq/warren/api"

// sampleLocked charges the CPU time since the last sample to the level
// that was set meanwhile (c.full).
func (c *CPU) sampleLocked() {
	u, th, err := c.gate.Sample()
	if err != nil {
		return
	}
	du, dth := max(u-c.lastUsage, 0), max(th-c.lastThrott, 0)
	if c.full {
		c.activeNs += du
		c.throttled += dth
	} else {
		c.idleNs += du
		c.harvested += dth
	}
	c.lastUsage, c.lastThrott = u, th
}

// Gated reports whether the sandbox has a gate open now (under its lock).
func (c *CPU) Gated() bool { return c.gate != nil }

// CloseLocked gives a stopping sandbox its full CPU back (its teardown,
// or the wipe of a recycled container, runs at full speed; the next owner
// of a recycled container opens its own gate) and closes the gate.
func (c *CPU) CloseLocked() {
	if c.gate == nil {
		return
	}
	if !c.full {
		_ = c.gate.Set(true)
	}
	_ = c.gate.Close()
	c.gate = nil
}

// StatsLocked is the sandbox's CPU view, sampled now.
func (c *CPU) StatsLocked() *api.SandboxCPU {
	if c.gate != nil {
		c.sampleLocked()
	}
	lvl := "idle"
	if c.full || c.gate == nil {
		lvl = "full"
	}
	return &api.SandboxCPU{
		Active: float64(c.activeNs) / 1e9, Idle: float64(c.idleNs) / 1e9,
		Throttled: float64(c.harvested+c.throttled) / 1e9, Level: lvl,
	}
}

// AddLocked adds the sandbox of spec to the node's elastic view n (from
// the samples of its last switch: the heartbeat reads no cgroup file).
func (c *CPU) AddLocked(n *api.NodeElastic, spec *api.CreateSandboxRequest) {
	n.ActiveSeconds += float64(c.activeNs) / 1e9
	n.IdleSeconds += float64(c.idleNs) / 1e9
	n.HarvestedSeconds += float64(c.harvested) / 1e9
	if c.gate != nil && !c.full {
		n.IdleSandboxes++
	}
	n.FreedCPU += c.FreedLocked(spec)
}

// FreedLocked is the requested cpu a best-effort sandbox of spec at its
// idle budget does not use now (0 for the others: latency-class
// sandboxes keep their guarantee, and always_on ones, FnCall workers and
// sandboxes running an operation have their full cpu).
func (c *CPU) FreedLocked(spec *api.CreateSandboxRequest) float64 {
	if c.gate == nil || c.full || spec.Priority != api.PriorityBestEffort {
		return 0
	}
	return max(spec.CPU-IdleCPU(spec), 0)
}

// Fits says whether a best-effort spec fits when the node's best-effort
// sandboxes between operations count with their idle budget instead of
// their request (cpu is what the live sandboxes request, freed the sum of
// their FreedLocked), and the host's CPU is not under pressure (a node
// full of waiting sandboxes admits more; a busy one does not).
func (n *Node) Fits(cpu, freed float64, spec *api.CreateSandboxRequest) bool {
	if spec.Priority != api.PriorityBestEffort || cpu-freed+spec.CPU > n.capacity+1e-9 {
		return false
	}
	if n.maxPressure < 0 {
		return true
	}
	p, err := n.pressure()
	return err == nil && p <= n.maxPressure
}
