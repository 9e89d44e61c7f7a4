package e2b

// filesystem.Filesystem/WatchDir (and CreateWatcher, GetWatcherEvents,
// RemoveWatcher, below) by polling: warren's files API has no
// change notification, so the watched tree is listed every watchEvery
// and compared with the last listing. What this cannot see: a change
// undone within one interval, and a rename, which is reported as a
// remove of the old name and a create of the new one.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"path"
	"sort"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/warrenhq/warren/api"
	efs "github.com/warrenhq/warren/api/e2b/filesystem"
	warren "github.com/warrenhq/warren/sdk/go"
)

const (
	// watchEvery is how often a watched directory is listed.
	watchEvery = 500 * time.Millisecond
	// maxWatchEntries bounds a watched tree.
	maxWatchEntries = 10_000
)

// walkFiles lists dir and, down to depth levels, its subdirectories.
func walkFiles(ctx context.Context, ec *envdCaller, dir string, depth, limit int) ([]api.FileInfo, error) {
	var out []api.FileInfo
	var walk func(dir string, level int) error
	walk = func(dir string, level int) error {
		files, err := ec.c.ListFiles(ctx, ec.id, dir)
		if err != nil {
			return err
		}
		for i := range files {
			if len(out) >= limit {
				return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("more than %d entries", limit))
			}
			out = append(out, files[i])
			if files[i].Type == "dir" && level < depth {
				if err := walk(files[i].Path, level+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return out, walk(dir, 1)
}

// watchSnap is one listing of a watched tree, by path.
type watchSnap map[string]api.FileInfo

func (f *fsService) snapshot(ctx context.Context, ec *envdCaller, root string, depth int) (watchSnap, error) {
	files, err := walkFiles(ctx, ec, root, depth, maxWatchEntries)
	if err != nil {
		var ce *connect.Error
		if errors.As(err, &ce) {
			return nil, err
		}
		return nil, rpcError(err)
	}
	snap := make(watchSnap, len(files))
	for _, fi := range files {
		snap[fi.Path] = fi
	}
	return snap, nil
}

// diff is the events that turn old into cur, in path order.
func diff(root string, old, cur watchSnap, withEntry bool) []*efs.FilesystemEvent {
	var evs []*efs.FilesystemEvent
	add := func(p string, t efs.EventType, fi *api.FileInfo) {
		rel, err := relTo(root, p)
		if err != nil {
			return
		}
		ev := &efs.FilesystemEvent{Name: rel, Type: t}
		if withEntry && fi != nil {
			ev.Entry = entryOf(fi)
		}
		evs = append(evs, ev)
	}
	for p, fi := range cur {
		was, ok := old[p]
		switch {
		case !ok || was.Type != fi.Type:
			add(p, efs.EventType_EVENT_TYPE_CREATE, &fi)
		case fi.Type != "dir" && (was.Size != fi.Size || !was.ModTime.Equal(fi.ModTime)):
			add(p, efs.EventType_EVENT_TYPE_WRITE, &fi)
		case was.Mode != fi.Mode:
			add(p, efs.EventType_EVENT_TYPE_CHMOD, &fi)
		}
	}
	for p := range old {
		if _, ok := cur[p]; !ok {
			add(p, efs.EventType_EVENT_TYPE_REMOVE, nil)
		}
	}
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].Name < evs[j].Name })
	return evs
}

// relTo is p relative to root ("a/b.txt").
func relTo(root, p string) (string, error) {
	if root == "/" {
		return p[1:], nil
	}
	if len(p) <= len(root) || p[:len(root)] != root || p[len(root)] != '/' {
		return "", fmt.Errorf("%s is not under %s", p, root)
	}
	return p[len(root)+1:], nil
}

func (f *fsService) WatchDir(ctx context.Context, req *connect.Request[efs.WatchDirRequest], stream *connect.ServerStream[efs.WatchDirResponse]) error {
	ec, root, err := f.callerAt(ctx, req.Header(), req.Msg.GetPath())
	if err != nil {
		return err
	}
	fi, err := ec.c.Stat(ctx, ec.id, root)
	if err != nil {
		return rpcError(err)
	}
	if fi.Type != "dir" {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path %s is not a directory", root))
	}
	depth := 1
	if req.Msg.GetRecursive() {
		depth = maxListDepth
	}
	snap, err := f.snapshot(ctx, ec, root, depth)
	if err != nil {
		return err
	}
	if err := stream.Send(&efs.WatchDirResponse{Event: &efs.WatchDirResponse_Start{Start: &efs.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	poll := time.NewTicker(watchEvery)
	defer poll.Stop()
	lastSent := time.Now()
	for {
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return nil // the watch's timeout: the stream simply ends
			}
			return ctx.Err()
		case <-poll.C:
		}
		cur, err := f.snapshot(ctx, ec, root, depth)
		if err != nil {
			if ctx.Err() != nil {
				continue
			}
			if warren.IsNotFound(err) || connect.CodeOf(err) == connect.CodeNotFound {
				return connect.NewError(connect.CodeNotFound, fmt.Errorf("the watched directory %s is gone", path.Clean(root)))
			}
			return err
		}
		for _, ev := range diff(root, snap, cur, req.Msg.GetIncludeEntry()) {
			if err := stream.Send(&efs.WatchDirResponse{Event: &efs.WatchDirResponse_Filesystem{Filesystem: ev}}); err != nil {
				return err
			}
			lastSent = time.Now()
		}
		snap = cur
		if time.Since(lastSent) >= keepaliveEvery {
			if err := stream.Send(&efs.WatchDirResponse{Event: &efs.WatchDirResponse_Keepalive{Keepalive: &efs.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
			lastSent = time.Now()
		}
	}
}

// The polling variant (CreateWatcher, GetWatcherEvents, RemoveWatcher):
// a watcher keeps the last listing; each GetWatcherEvents lists again and
// answers what changed since the previous call. A watcher not polled for
// watcherIdle is forgotten.
const (
	watcherIdle = 10 * time.Minute
	maxWatchers = 1000
)

type watcher struct {
	sandbox, root string
	depth         int
	withEntry     bool
	snap          watchSnap
	used          time.Time
}

// watcherTable holds the watchers by id. Its lock is never held across
// a native call: a watcher being polled is taken out of the table.
type watcherTable struct {
	mu sync.Mutex
	ws map[string]*watcher
}

func (t *watcherTable) put(id string, w *watcher) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ws == nil {
		t.ws = map[string]*watcher{}
	}
	for k, o := range t.ws {
		if time.Since(o.used) > watcherIdle {
			delete(t.ws, k)
		}
	}
	if len(t.ws) >= maxWatchers {
		return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("too many watchers (%d): remove some", maxWatchers))
	}
	w.used = time.Now()
	t.ws[id] = w
	return nil
}

// take removes and returns the sandbox's watcher id.
func (t *watcherTable) take(sandbox, id string) (*watcher, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	w, ok := t.ws[id]
	if !ok || w.sandbox != sandbox || time.Since(w.used) > watcherIdle {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher %q not found", id))
	}
	delete(t.ws, id)
	return w, nil
}

func newWatcherID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func (f *fsService) CreateWatcher(ctx context.Context, req *connect.Request[efs.CreateWatcherRequest]) (*connect.Response[efs.CreateWatcherResponse], error) {
	ec, root, err := f.callerAt(ctx, req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	fi, err := ec.c.Stat(ctx, ec.id, root)
	if err != nil {
		return nil, rpcError(err)
	}
	if fi.Type != "dir" {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path %s is not a directory", root))
	}
	w := &watcher{sandbox: ec.id, root: root, depth: 1, withEntry: req.Msg.GetIncludeEntry()}
	if req.Msg.GetRecursive() {
		w.depth = maxListDepth
	}
	if w.snap, err = f.snapshot(ctx, ec, root, w.depth); err != nil {
		return nil, err
	}
	id := newWatcherID()
	if err := f.s.watchers.put(id, w); err != nil {
		return nil, err
	}
	return connect.NewResponse(&efs.CreateWatcherResponse{WatcherId: id}), nil
}

func (f *fsService) GetWatcherEvents(ctx context.Context, req *connect.Request[efs.GetWatcherEventsRequest]) (*connect.Response[efs.GetWatcherEventsResponse], error) {
	ec, err := f.caller(req.Header())
	if err != nil {
		return nil, err
	}
	// The caller must reach the sandbox before its watcher is touched:
	// another project's key must not take it out of the table.
	if _, err := ec.c.Get(ctx, ec.id); err != nil {
		return nil, rpcError(err)
	}
	w, err := f.s.watchers.take(ec.id, req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	cur, err := f.snapshot(ctx, ec, w.root, w.depth)
	if err != nil {
		if connect.CodeOf(err) == connect.CodeNotFound {
			return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("the watched directory %s is gone", w.root))
		}
		_ = f.s.watchers.put(req.Msg.GetWatcherId(), w) // a passing failure keeps the watcher
		return nil, err
	}
	evs := diff(w.root, w.snap, cur, w.withEntry)
	w.snap = cur
	if err := f.s.watchers.put(req.Msg.GetWatcherId(), w); err != nil {
		return nil, err
	}
	return connect.NewResponse(&efs.GetWatcherEventsResponse{Events: evs}), nil
}

func (f *fsService) RemoveWatcher(ctx context.Context, req *connect.Request[efs.RemoveWatcherRequest]) (*connect.Response[efs.RemoveWatcherResponse], error) {
	ec, err := f.caller(req.Header())
	if err != nil {
		return nil, err
	}
	if _, err := ec.c.Get(ctx, ec.id); err != nil {
		return nil, rpcError(err)
	}
	if _, err := f.s.watchers.take(ec.id, req.Msg.GetWatcherId()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&efs.RemoveWatcherResponse{}), nil
}
