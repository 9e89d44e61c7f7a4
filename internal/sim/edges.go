// Package sim measures the real control plane (apiservers, placement,
// watcher, IAM, NATS) at fleet scale with simulated edges: each fake node
// admits, holds and reports sandboxes with the bookkeeping of a real edge
// (capacity, per-project usage, per-state and per-job counts, heartbeats),
// but starts no processes.
package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/bus"
	"github.com/warrenhq/warren/internal/edgeproto"
)

// EdgesConfig configures a set of simulated nodes.
type EdgesConfig struct {
	NATS         bus.DialConfig
	Nodes        int
	Prefix       string // node names are <prefix><n>
	CPU          float64
	MemoryMB     int64
	MaxSandboxes int
	Conns        int // NATS connections shared by the nodes
	// AuthDir, when set, holds each node's credentials (edge-<name>.nk):
	// every node then has its own connection, with its own permissions.
	AuthDir string
	Logger  *slog.Logger
}

type fakeSandbox struct {
	project string
	job     string
	cpu     float64
	mem     int64
	created time.Time
}

type fakeNode struct {
	cfg  *EdgesConfig
	name string
	conn *bus.Conn

	mu       sync.Mutex
	sbs      map[string]*fakeSandbox
	cpu      float64
	mem      int64
	projects map[string]api.Usage
	jobs     map[string]int
}

// RunEdges serves cfg.Nodes simulated nodes until ctx ends.
func RunEdges(ctx context.Context, cfg EdgesConfig) error {
	if cfg.Conns < 1 {
		cfg.Conns = 8
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "sim"
	}
	if cfg.AuthDir != "" {
		cfg.Conns = cfg.Nodes
	}
	var conns []*bus.Conn
	for i := 0; i < cfg.Conns; i++ {
		c := cfg.NATS
		c.Name = fmt.Sprintf("warren-sim-edges-%d", i)
		if cfg.AuthDir != "" {
			node := fmt.Sprintf("%s%d", cfg.Prefix, i)
			c.NKeySeed = filepath.Join(cfg.AuthDir, bus.SeedFile(bus.RoleEdge, node))
			c.Role, c.Node = bus.RoleEdge, node
		}
		conn, err := bus.Dial(c)
		if err != nil {
			return err
		}
		defer conn.Close()
		conns = append(conns, conn)
	}
	var nodes []*fakeNode
	for i := 0; i < cfg.Nodes; i++ {
		n := &fakeNode{cfg: &cfg, name: fmt.Sprintf("%s%d", cfg.Prefix, i), conn: conns[i%len(conns)],
			sbs: map[string]*fakeSandbox{}, projects: map[string]api.Usage{}, jobs: map[string]int{}}
		if _, err := n.conn.Serve(ctx, bus.EdgeSubject(n.name), "", n.handle); err != nil {
			return err
		}
		nodes = append(nodes, n)
	}
	// Heartbeats, spread over the second.
	t := time.NewTicker(time.Second / time.Duration(max(1, len(nodes))))
	defer t.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			n := nodes[i%len(nodes)]
			_ = n.conn.Publish(bus.SubjectHeartbeat, n.status())
		}
	}
}

func (n *fakeNode) status() api.Node {
	n.mu.Lock()
	defer n.mu.Unlock()
	st := api.Node{Name: n.name, State: "up", CPUCapacity: n.cfg.CPU, MemoryMB: n.cfg.MemoryMB,
		CPURequested: n.cpu, MemRequested: n.mem, Sandboxes: len(n.sbs), Tiers: []string{api.TierContainer},
		LastHeartbeat: time.Now().UTC(), Images: []string{"busybox"},
		States: map[string]int{api.StateRunning: len(n.sbs)}, Projects: make(map[string]api.Usage, len(n.projects)),
		Jobs: make(map[string]int, len(n.jobs))}
	for k, v := range n.projects {
		st.Projects[k] = v
	}
	for k, v := range n.jobs {
		st.Jobs[k] = v
	}
	return st
}

func (n *fakeNode) handle(ctx context.Context, op string, body []byte, w *bus.Replier) (any, error) {
	switch op {
	case edgeproto.OpCreate:
		var req edgeproto.CreateRequest
		if err := json.Unmarshal(body, &req); err != nil {
			return nil, &api.Error{Code: api.CodeBadRequest, Message: err.Error()}
		}
		return n.create(&req)
	case edgeproto.OpCreateBatch:
		var req edgeproto.CreateBatchRequest
		if err := json.Unmarshal(body, &req); err != nil {
			return nil, &api.Error{Code: api.CodeBadRequest, Message: err.Error()}
		}
		out := &edgeproto.CreateBatchResult{Items: make([]edgeproto.CreateBatchItem, len(req.Items))}
		for i := range req.Items {
			sb, err := n.create(&req.Items[i])
			if err != nil {
				out.Items[i].Error = err.(*api.Error)
			} else {
				out.Items[i].Sandbox = sb
			}
		}
		return out, nil
	case edgeproto.OpGet, edgeproto.OpDelete:
		var req edgeproto.IDRequest
		if err := json.Unmarshal(body, &req); err != nil {
			return nil, &api.Error{Code: api.CodeBadRequest, Message: err.Error()}
		}
		n.mu.Lock()
		sb := n.sbs[req.ID]
		if sb != nil && op == edgeproto.OpDelete {
			n.remove(req.ID, sb)
		}
		n.mu.Unlock()
		if sb == nil {
			return nil, &api.Error{Code: api.CodeNotFound, Message: "sandbox " + req.ID + " not found"}
		}
		v := n.view(req.ID, sb)
		if op == edgeproto.OpDelete {
			v.State = api.StateStopped
		}
		return &v, nil
	case edgeproto.OpList:
		return &api.SandboxList{Sandboxes: []api.Sandbox{}}, nil
	case edgeproto.OpImages:
		return &api.ImageList{Images: []api.Image{{Name: "busybox"}}}, nil
	}
	return nil, &api.Error{Code: api.CodeBadRequest, Message: "the simulated node does not do " + op}
}

func (n *fakeNode) view(id string, sb *fakeSandbox) api.Sandbox {
	return api.Sandbox{ID: id, State: api.StateRunning, Node: n.name, Project: sb.project, Tier: api.TierContainer,
		Image: "busybox", CPU: sb.cpu, MemoryMB: sb.mem, CreatedAt: sb.created, LastActive: sb.created}
}

func (n *fakeNode) create(req *edgeproto.CreateRequest) (*api.Sandbox, error) {
	if edgeproto.NodeOf(req.ID) != n.name {
		return nil, &api.Error{Code: api.CodeInvalid, Message: "sandbox id of another node"}
	}
	s := &req.Spec
	n.mu.Lock()
	defer n.mu.Unlock()
	if old := n.sbs[req.ID]; old != nil {
		v := n.view(req.ID, old)
		return &v, nil
	}
	switch {
	case len(n.sbs)+1 > n.cfg.MaxSandboxes,
		n.cpu+s.CPU > n.cfg.CPU,
		n.mem+s.MemoryMB > n.cfg.MemoryMB:
		return nil, &api.Error{Code: api.CodeUnavailable, Message: "node " + n.name + " is full"}
	}
	sb := &fakeSandbox{project: s.Project, job: s.Labels["job"], cpu: s.CPU, mem: s.MemoryMB, created: time.Now().UTC()}
	n.sbs[req.ID] = sb
	n.cpu += sb.cpu
	n.mem += sb.mem
	u := n.projects[sb.project]
	u.Sandboxes++
	u.CPU += sb.cpu
	u.MemoryMB += sb.mem
	n.projects[sb.project] = u
	if sb.job != "" {
		n.jobs[sb.job]++
	}
	v := n.view(req.ID, sb)
	return &v, nil
}

func (n *fakeNode) remove(id string, sb *fakeSandbox) {
	delete(n.sbs, id)
	n.cpu -= sb.cpu
	n.mem -= sb.mem
	u := n.projects[sb.project]
	u.Sandboxes--
	u.CPU -= sb.cpu
	u.MemoryMB -= sb.mem
	if u.Sandboxes <= 0 {
		delete(n.projects, sb.project)
	} else {
		n.projects[sb.project] = u
	}
	if sb.job != "" {
		if n.jobs[sb.job]--; n.jobs[sb.job] <= 0 {
			delete(n.jobs, sb.job)
		}
	}
}
