package e2b

// filesystem.Filesystem/WatchDir by polling: warren's files API has no
// change notification, so the watched tree is listed every watchEvery
// and compared with the last listing. What this cannot see: a change
// undone within one interval, and a rename, which is reported as a
// remove of the old name and a create of the new one.

import (
	"context"
	"errors"
	"fmt"
	"path"
	"sort"
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
func diff(root string, old, cur watchSnap, withEntry bool) []*efs.WatchDirResponse_FilesystemEvent {
	var evs []*efs.WatchDirResponse_FilesystemEvent
	add := func(p string, t efs.EventType, fi *api.FileInfo) {
		rel, err := relTo(root, p)
		if err != nil {
			return
		}
		ev := &efs.WatchDirResponse_FilesystemEvent{Name: rel, Type: t}
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
