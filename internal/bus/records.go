package bus

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Buckets and streams of snapshots and trajectories.
const (
	BucketSnapshots    = "warren-snapshots"
	BucketTrajectories = "warren-trajectories"
	// BucketLayerOwners maps a named layer to the project that owns it.
	BucketLayerOwners = "warren-layer-owners"
	// BucketTemplates holds named sandbox templates, keyed "project/name".
	BucketTemplates    = "warren-templates"
	streamTrajectories = "warren-trajectories"
	subjectTrajPrefix  = "warren.traj."
)

// Records is a JetStream KV bucket of JSON records. Keys are arbitrary
// strings (encoded, so any name is a valid key).
type Records struct {
	kv jetstream.KeyValue
}

// Records opens (creating when missing) a bucket of JSON records.
func (c *Conn) Records(ctx context.Context, bucket string) (*Records, error) {
	kv, err := c.KeyValue(ctx, bucket, 0)
	if err != nil {
		return nil, err
	}
	return &Records{kv: kv}, nil
}

func recordKey(k string) string { return "k" + hex.EncodeToString([]byte(k)) }

// Get decodes the record under key into v; found is false when none exists.
func (r *Records) Get(ctx context.Context, key string, v any) (found bool, rev uint64, err error) {
	e, err := r.kv.Get(ctx, recordKey(key))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, 0, nil
	}
	if err != nil {
		return false, 0, fmt.Errorf("bus: get %s: %w", key, err)
	}
	if err := json.Unmarshal(e.Value(), v); err != nil {
		return false, 0, fmt.Errorf("bus: decode %s: %w", key, err)
	}
	return true, e.Revision(), nil
}

// Put stores v under key.
func (r *Records) Put(ctx context.Context, key string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if _, err := r.kv.Put(ctx, recordKey(key), b); err != nil {
		return fmt.Errorf("bus: put %s: %w", key, err)
	}
	return nil
}

// ErrExists means Create found a record already there.
var ErrExists = errors.New("bus: record exists")

// ErrNotFound: no object under that key.
var ErrNotFound = errors.New("bus: not found")

// Create stores v under key only if no record exists (ErrExists otherwise).
func (r *Records) Create(ctx context.Context, key string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if _, err := r.kv.Create(ctx, recordKey(key), b); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return ErrExists
		}
		return fmt.Errorf("bus: create %s: %w", key, err)
	}
	return nil
}

// Update stores v under key only if the record is still at revision rev
// (ErrExists when someone changed it in between).
func (r *Records) Update(ctx context.Context, key string, v any, rev uint64) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if _, err := r.kv.Update(ctx, recordKey(key), b, rev); err != nil {
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence {
			return ErrExists
		}
		return fmt.Errorf("bus: update %s: %w", key, err)
	}
	return nil
}

// Each calls fn with every record's key and JSON, in no particular order.
func (r *Records) Each(ctx context.Context, fn func(key string, raw []byte) error) error {
	w, err := r.kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return fmt.Errorf("bus: list records: %w", err)
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return nil
			}
			if e == nil {
				return nil // the initial values are all delivered
			}
			k, err := hex.DecodeString(e.Key()[1:])
			if err != nil {
				continue
			}
			if err := fn(string(k), e.Value()); err != nil {
				return err
			}
		}
	}
}

// Delete removes the record under key.
func (r *Records) Delete(ctx context.Context, key string) error {
	if err := r.kv.Delete(ctx, recordKey(key)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("bus: delete %s: %w", key, err)
	}
	return nil
}

// TrajLog is the JetStream stream holding every trajectory's ordered log
// (file storage: it survives a kill -9 of the process; replicated in a
// cluster). Each trajectory is one subject; entries are JSON.
type TrajLog struct {
	js     jetstream.JetStream
	stream jetstream.Stream
}

// TrajectoryLog opens (creating when missing) the trajectory stream.
// An existing stream is opened as it is (no update: in a cluster an update
// needs every replica's peer, and a restarting edge must come up while a
// NATS server is down).
func (c *Conn) TrajectoryLog(ctx context.Context) (*TrajLog, error) {
	cfg := jetstream.StreamConfig{
		Name:              streamTrajectories,
		Subjects:          []string{subjectTrajPrefix + ">"},
		Storage:           jetstream.FileStorage,
		MaxMsgSize:        MaxPayload,
		Duplicates:        2 * time.Minute,
		MaxMsgsPerSubject: -1,
		// The backstop behind the projects' storage quotas: a full
		// stream refuses appends (the step answers 503) and keeps what
		// it holds.
		MaxBytes: TrajLogMaxBytes,
		Discard:  jetstream.DiscardNew,
		Replicas: c.replicas(),
	}
	st, err := openOrCreate(ctx, c,
		func(ctx context.Context) (jetstream.Stream, error) { return c.js.Stream(ctx, streamTrajectories) },
		func(ctx context.Context) (jetstream.Stream, error) {
			return withinStore(cfg.MaxBytes, func(limit int64) (jetstream.Stream, error) {
				cfg.MaxBytes = limit
				return c.js.CreateStream(ctx, cfg)
			})
		},
		jetstream.ErrStreamNameAlreadyInUse)
	if err != nil {
		return nil, fmt.Errorf("bus: trajectory stream: %w", err)
	}
	return &TrajLog{js: c.js, stream: st}, nil
}

func trajSubject(traj string) string { return subjectTrajPrefix + hex.EncodeToString([]byte(traj)) }

// auditSubject holds traj's persisted audit (a token that is not hex, so
// no trajectory's own subject can be it).
func auditSubject(traj string) string {
	return subjectTrajPrefix + "audit." + hex.EncodeToString([]byte(traj))
}

// AppendAudit adds one entry (a step's audit records) to traj's persisted
// audit and waits until it is stored.
func (l *TrajLog) AppendAudit(ctx context.Context, traj string, entry []byte) error {
	if _, err := l.js.Publish(ctx, auditSubject(traj), entry); err != nil {
		return fmt.Errorf("bus: append to trajectory audit: %w", err)
	}
	return nil
}

// ReadAudit returns every entry of traj's persisted audit, in order.
func (l *TrajLog) ReadAudit(ctx context.Context, traj string) ([][]byte, error) {
	return l.readSubject(ctx, auditSubject(traj), 0, 0)
}

// Append adds entry number step to traj's log and waits until it is stored.
// Re-appending the same step (a retry) is ignored by the stream.
func (l *TrajLog) Append(ctx context.Context, traj string, step int64, entry []byte) error {
	_, err := l.js.Publish(ctx, trajSubject(traj), entry, jetstream.WithMsgID(fmt.Sprintf("%s#%d", hex.EncodeToString([]byte(traj)), step)))
	if err != nil {
		return fmt.Errorf("bus: append to trajectory: %w", err)
	}
	return nil
}

// AppendAll adds entries, in order, to the (new, empty) log of traj and
// waits until all are stored. They are not deduplicated.
func (l *TrajLog) AppendAll(ctx context.Context, traj string, entries [][]byte) error {
	subj := trajSubject(traj)
	futs := make([]jetstream.PubAckFuture, 0, len(entries))
	for _, b := range entries {
		f, err := l.js.PublishAsync(subj, b)
		if err != nil {
			return fmt.Errorf("bus: append to trajectory: %w", err)
		}
		futs = append(futs, f)
	}
	for _, f := range futs {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return fmt.Errorf("bus: append to trajectory: %w", err)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// Purge removes traj's log.
func (l *TrajLog) Purge(ctx context.Context, traj string) error {
	if err := l.stream.Purge(ctx, jetstream.WithPurgeSubject(trajSubject(traj))); err != nil {
		return fmt.Errorf("bus: purge trajectory: %w", err)
	}
	if err := l.stream.Purge(ctx, jetstream.WithPurgeSubject(auditSubject(traj))); err != nil {
		return fmt.Errorf("bus: purge trajectory audit: %w", err)
	}
	return nil
}

// Last returns the last entry of traj's log, or nil when it is empty.
func (l *TrajLog) Last(ctx context.Context, traj string) ([]byte, error) {
	m, err := l.stream.GetLastMsgForSubject(ctx, trajSubject(traj))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("bus: read trajectory: %w", err)
	}
	return m.Data, nil
}

// Read returns up to limit entries of traj's log (0 = all) after skipping
// the first skip, in order.
func (l *TrajLog) Read(ctx context.Context, traj string, skip, limit int) ([][]byte, error) {
	return l.readSubject(ctx, trajSubject(traj), skip, limit)
}

// readSubject reads subject's entries (Read), retrying briefly while a
// clustered stream has no responders.
func (l *TrajLog) readSubject(ctx context.Context, subject string, skip, limit int) ([][]byte, error) {
	// A clustered stream answers "no responders" for a moment while its
	// leader moves or a new consumer is being placed (busy nodes, a NATS
	// server that just died): try again briefly.
	wait := 50 * time.Millisecond
	for i := 0; ; i++ {
		out, err := l.read(ctx, subject, skip, limit)
		if err == nil || !errors.Is(err, nats.ErrNoResponders) || i == 5 || ctx.Err() != nil {
			return out, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(wait):
		}
		wait *= 2
	}
}

func (l *TrajLog) read(ctx context.Context, subject string, skip, limit int) ([][]byte, error) {
	cons, err := l.stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{subject},
		DeliverPolicy:  jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("bus: read trajectory: %w", err)
	}
	// The create answer says how many are pending (asking again could reach
	// the new consumer before it is placed).
	info := cons.CachedInfo()
	if info == nil {
		if info, err = cons.Info(ctx); err != nil {
			return nil, fmt.Errorf("bus: read trajectory: %w", err)
		}
	}
	pending := int(info.NumPending)
	var out [][]byte
	seen := 0
	for pending > 0 {
		batch, err := cons.Fetch(min(pending, 1000), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, fmt.Errorf("bus: read trajectory: %w", err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			pending--
			if md, err := m.Metadata(); err == nil {
				pending = int(md.NumPending)
			}
			if seen >= skip && (limit == 0 || len(out) < limit) {
				out = append(out, m.Data())
			}
			seen++
		}
		if err := batch.Error(); err != nil && got == 0 {
			return nil, fmt.Errorf("bus: read trajectory: %w", err)
		}
		if got == 0 || (limit > 0 && len(out) >= limit) {
			break
		}
	}
	return out, nil
}

// The backstops of trajectory storage, set when the stream and the object
// store are made (an existing one keeps its configuration): whatever the
// quotas, the log and the inputs never take more than this of the disk
// JetStream shares with IAM.
var (
	TrajLogMaxBytes    int64 = 16 << 30
	TrajInputsMaxBytes int64 = 64 << 30
)

// withinStore makes a stream with a byte limit of limit, or of half as
// much while the server cannot reserve that much of its store (a small
// disk), down to 64 MiB; below that, without a limit.
func withinStore[T any](limit int64, create func(limit int64) (T, error)) (T, error) {
	for ; limit >= 64<<20; limit /= 2 {
		v, err := create(limit)
		if err == nil || !strings.Contains(err.Error(), "insufficient storage") {
			return v, err
		}
	}
	return create(0)
}

// InputKey is where the input with SHA-256 hash of trajectory traj (a
// TrajKey) is stored: each trajectory keeps its own inputs, so deleting it
// frees them without asking which other trajectory has the same bytes.
func InputKey(traj, hash string) string {
	sum := sha256.Sum256([]byte(traj))
	return hash + "." + hex.EncodeToString(sum[:16])
}

// bucketTrajInputs holds the inputs of logged operations (file data,
// stdin) by SHA-256, so a log can be re-executed.
const bucketTrajInputs = "warren-traj-inputs"

// Inputs is a content-addressed JetStream object store (file storage).
type Inputs struct{ os jetstream.ObjectStore }

// TrajectoryInputs opens (creating when missing) the store of logged
// operations' inputs.
func (c *Conn) TrajectoryInputs(ctx context.Context) (*Inputs, error) {
	cfg := jetstream.ObjectStoreConfig{Bucket: bucketTrajInputs, Storage: jetstream.FileStorage, Replicas: c.replicas(), MaxBytes: TrajInputsMaxBytes}
	os, err := openOrCreate(ctx, c,
		func(ctx context.Context) (jetstream.ObjectStore, error) {
			return c.js.ObjectStore(ctx, bucketTrajInputs)
		},
		func(ctx context.Context) (jetstream.ObjectStore, error) {
			return withinStore(cfg.MaxBytes, func(limit int64) (jetstream.ObjectStore, error) {
				cfg.MaxBytes = limit
				return c.js.CreateObjectStore(ctx, cfg)
			})
		},
		jetstream.ErrBucketExists)
	if err != nil {
		return nil, fmt.Errorf("bus: object store %s: %w", bucketTrajInputs, err)
	}
	return &Inputs{os: os}, nil
}

// Put stores data under key unless it is there already; stored says
// whether it was written now.
func (in *Inputs) Put(ctx context.Context, key string, data []byte) (stored bool, err error) {
	if _, err := in.os.GetInfo(ctx, key); err == nil {
		return false, nil
	}
	if _, err := in.os.PutBytes(ctx, key, data); err != nil {
		return false, fmt.Errorf("bus: store input: %w", err)
	}
	return true, nil
}

// Delete removes the object under key and returns its size (0 when there
// was none).
func (in *Inputs) Delete(ctx context.Context, key string) (int64, error) {
	info, err := in.os.GetInfo(ctx, key)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("bus: delete input: %w", err)
	}
	if err := in.os.Delete(ctx, key); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
		return 0, fmt.Errorf("bus: delete input: %w", err)
	}
	return int64(info.Size), nil
}

// Get returns the data stored under key, or ErrNotFound.
func (in *Inputs) Get(ctx context.Context, key string) ([]byte, error) {
	b, err := in.os.GetBytes(ctx, key)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("bus: read input: %w", err)
	}
	return b, nil
}
