package bus

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/warrenhq/warren/api"
)

// BucketStorage holds each project's stored bytes (trajectory logs and
// their inputs, snapshots, layers) and its storage_bytes quota, one
// record per project. A project's bytes include its subprojects': every
// charge is added to the project and to each of its ancestors, so a
// quota binds the whole subtree. The apiservers copy the quotas from IAM
// into it (edges may not read IAM), and the parts that store bytes for a
// project check and charge here.
const BucketStorage = "warren-storage"

// StorageRecord is a project's entry in BucketStorage.
type StorageRecord struct {
	Bytes int64 `json:"bytes"`
	// Limit is the project's storage_bytes quota (0 = none of its own).
	Limit int64 `json:"limit,omitempty"`
}

// StorageError says which project's storage quota a write would exceed.
type StorageError struct {
	Project     string
	Used, Limit int64
	Want        int64
}

func (e *StorageError) Error() string {
	name := e.Project
	if name == "" {
		name = "(root)"
	}
	return fmt.Sprintf("project %s would exceed its storage quota: %d of %d bytes used, %d more asked (delete trajectories, snapshots or layers, or raise storage_bytes)",
		name, e.Used, e.Limit, e.Want)
}

// QuotaError turns a *StorageError in err into its answer: 413 with
// reason storage_quota. Other errors are returned as they are.
func QuotaError(err error) error {
	var se *StorageError
	if errors.As(err, &se) {
		return &api.Error{Code: api.CodeTooLarge, Reason: api.ReasonStorageQuota, Message: se.Error()}
	}
	return err
}

// Storage is the per-project storage account.
type Storage struct{ kv jetstream.KeyValue }

// Storage opens (creating when missing) the storage account.
func (c *Conn) Storage(ctx context.Context) (*Storage, error) {
	kv, err := c.KeyValue(ctx, BucketStorage, 0)
	if err != nil {
		return nil, err
	}
	return &Storage{kv: kv}, nil
}

// storageKey is project's key (project ids are names joined by '.').
func storageKey(project string) string {
	if project == "" {
		return "_root"
	}
	return "p." + project
}

// chain lists project and its ancestors, then the root.
func chain(project string) []string {
	var out []string
	for p := project; p != ""; {
		out = append(out, p)
		i := strings.LastIndexByte(p, '.')
		if i < 0 {
			break
		}
		p = p[:i]
	}
	return append(out, "")
}

// Get reads project's record (zero when it has none).
func (s *Storage) Get(ctx context.Context, project string) (StorageRecord, uint64, error) {
	return s.getKey(ctx, storageKey(project))
}

func (s *Storage) getKey(ctx context.Context, key string) (StorageRecord, uint64, error) {
	var r StorageRecord
	e, err := s.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return r, 0, nil
	}
	if err != nil {
		return r, 0, fmt.Errorf("bus: storage %s: %w", key, err)
	}
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return r, 0, fmt.Errorf("bus: storage %s: %w", key, err)
	}
	return r, e.Revision(), nil
}

// update changes project's record with fn, retrying on a concurrent change.
func (s *Storage) update(ctx context.Context, project string, fn func(*StorageRecord)) error {
	return s.updateKey(ctx, storageKey(project), fn)
}

func (s *Storage) updateKey(ctx context.Context, key string, fn func(*StorageRecord)) error {
	for attempt := 0; ; attempt++ {
		r, rev, err := s.getKey(ctx, key)
		if err != nil {
			return err
		}
		fn(&r)
		b, _ := json.Marshal(&r)
		if rev == 0 {
			_, err = s.kv.Create(ctx, key, b)
		} else {
			_, err = s.kv.Update(ctx, key, b, rev)
		}
		if err == nil {
			return nil
		}
		if attempt == 50 || ctx.Err() != nil {
			return fmt.Errorf("bus: storage %s: %w", key, err)
		}
	}
}

// Check refuses (a *StorageError) n more bytes for project when they would
// take it or an ancestor over its limit.
func (s *Storage) Check(ctx context.Context, project string, n int64) error {
	for _, p := range chain(project) {
		r, _, err := s.Get(ctx, p)
		if err != nil {
			return err
		}
		if r.Limit > 0 && r.Bytes+n > r.Limit {
			return &StorageError{Project: p, Used: r.Bytes, Limit: r.Limit, Want: n}
		}
	}
	return nil
}

// Add charges delta bytes (negative: frees them) to project and each of
// its ancestors. A count never goes below zero.
func (s *Storage) Add(ctx context.Context, project string, delta int64) error {
	if delta == 0 {
		return nil
	}
	var first error
	for _, p := range chain(project) {
		err := s.update(ctx, p, func(r *StorageRecord) { r.Bytes = max(r.Bytes+delta, 0) })
		if err != nil && first == nil {
			first = err
		}
	}
	return first
}

// trajKey is the key of trajectory traj's (a TrajKey) own count.
func trajKey(traj string) string {
	sum := sha256.Sum256([]byte(traj))
	return "t." + hex.EncodeToString(sum[:16])
}

// AddTrajectory adds delta bytes to trajectory traj's own count (what
// deleting it frees; its project is charged by Add).
func (s *Storage) AddTrajectory(ctx context.Context, traj string, delta int64) error {
	return s.updateKey(ctx, trajKey(traj), func(r *StorageRecord) { r.Bytes = max(r.Bytes+delta, 0) })
}

// TrajectoryBytes is what trajectory traj holds (its log and its inputs).
func (s *Storage) TrajectoryBytes(ctx context.Context, traj string) (int64, error) {
	r, _, err := s.getKey(ctx, trajKey(traj))
	return r.Bytes, err
}

// ForgetTrajectory drops trajectory traj's count.
func (s *Storage) ForgetTrajectory(ctx context.Context, traj string) error {
	if err := s.kv.Delete(ctx, trajKey(traj)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("bus: storage: %w", err)
	}
	return nil
}

// SetLimit records project's storage_bytes quota (0 = none).
func (s *Storage) SetLimit(ctx context.Context, project string, limit int64) error {
	r, _, err := s.Get(ctx, project)
	if err != nil {
		return err
	}
	if r.Limit == limit {
		return nil
	}
	return s.update(ctx, project, func(r *StorageRecord) { r.Limit = limit })
}
