package snapshot

// Disk snapshots of VM sandboxes (microvm, vm). A VM's writable layer is
// the overlay's upper directory inside the guest, on the sandbox's
// writable disk (an ext4 image). The host never mounts that image: a
// guest-written filesystem handed to the host kernel's ext4 driver is an
// attack on the host. Instead the agent in the guest freezes the disk's
// filesystem and streams the upper directory as an OCI layer tar
// (agentproto.OpUpperTar); the edge unpacks it with the unpacker that
// takes registry layers (no path outside the target, no symlinked
// parents, limits) into a private directory beside the sandbox's
// writable layer. From there a snapshot goes the containers' way
// (snapshot.go): the same incremental diff, the same normalisation
// (setuid bits and capabilities only where the layers below had them),
// the same EROFS layer, so a VM's snapshot starts a container and a
// container's a VM.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/agentproto"
	"github.com/warrenhq/warren/internal/image"
	"github.com/warrenhq/warren/internal/sandboxspec"
)

// copyVMUpper unpacks the writable changes of VM sandbox src into dst (a
// new directory) and returns how long the guest's disk was frozen.
// maxBytes bounds the content (the sandbox's disk size; 0: the default
// disk size). The caller holds the sandbox (acquire) and its State.mu.
func (s *Snapshotter) copyVMUpper(ctx context.Context, src *Source, dst string, maxBytes int64) (time.Duration, error) {
	id := src.ID
	if src.Agent == nil {
		return 0, conflictf("sandbox %s is not running", id)
	}
	if maxBytes <= 0 {
		maxBytes = sandboxspec.DefaultDiskMB << 20 // never the unpacker's default of 64 GiB for a guest's stream
	}
	if err := os.Mkdir(dst, 0o755); err != nil {
		return 0, fmt.Errorf("snapshot of %s: %w", id, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pr, pw := io.Pipe()
	unpacked := make(chan error, 1)
	go func() {
		_, err := image.Unpack(ctx, pr, dst, image.Limits{MaxBytes: maxBytes})
		if err == nil {
			_, err = io.Copy(io.Discard, pr) // the tar's padding
		}
		pr.CloseWithError(err)
		if err != nil {
			cancel() // the guest stops reading (and thaws its disk)
		}
		unpacked <- err
	}()
	var res agentproto.UpperTarResult
	// io.Pipe's Write returns once the unpacker has taken the bytes: the
	// chunk's buffer is free again.
	err := src.Agent.CallBulk(ctx, agentproto.OpUpperTar, nil, &res, func(r *agentproto.Response) error {
		_, err := pw.Write(r.Data)
		return err
	})
	pw.CloseWithError(err)
	uerr := <-unpacked
	if uerr != nil {
		return 0, conflictf("snapshot of %s: its writable disk cannot be packed: %v", id, uerr)
	}
	if err != nil {
		var ae *agentproto.Error
		if errors.As(err, &ae) && ae.Code == agentproto.ErrInvalid {
			return 0, conflictf("sandbox %s: %s", id, ae.Message)
		}
		return 0, &api.Error{Code: api.CodeUnavailable, Message: fmt.Sprintf("snapshot of %s: reading its writable disk: %v", id, err)}
	}
	return time.Duration(res.FrozenMs * float64(time.Millisecond)), nil
}
