package edge

import (
	"context"
	"errors"

	"github.com/warrenhq/warren/internal/bus"
)

// Storage accounting. What the edge stores for a project (its
// trajectories' log entries and inputs, its snapshots' layers) is charged
// to the project in the storage account (bus.Storage), and a write that
// would take the project or an ancestor over its storage_bytes quota is
// refused before it runs.

// checkStorage refuses n more bytes for project beyond a storage quota.
// An account that cannot be read does not stop the work (the streams'
// limits are the backstop).
func (e *Edge) checkStorage(ctx context.Context, project string, n int64) error {
	err := e.storage.Check(ctx, project, n)
	var se *bus.StorageError
	if errors.As(err, &se) {
		return bus.QuotaError(err)
	}
	if err != nil {
		e.log.Warn("read the storage account", "project", project, "err", err)
	}
	return nil
}

// charge adds n stored bytes (negative: freed) to project's account.
func (e *Edge) charge(ctx context.Context, project string, n int64) {
	if err := e.storage.Add(context.WithoutCancel(ctx), project, n); err != nil {
		e.log.Warn("charge stored bytes", "project", project, "bytes", n, "err", err)
	}
}

// chargeTrajectory charges n bytes of trajectory key (a TrajKey) to its
// project and to the trajectory's own count.
func (e *Edge) chargeTrajectory(ctx context.Context, project, key string, n int64) {
	e.charge(ctx, project, n)
	if err := e.storage.AddTrajectory(context.WithoutCancel(ctx), key, n); err != nil {
		e.log.Warn("count a trajectory's bytes", "trajectory", key, "bytes", n, "err", err)
	}
}
