package bus

import (
	"context"
	"encoding/hex"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// BucketNetworkRules holds the cluster's named network rules (one record
// per name, api.NetworkRule). Apiservers write it (admins only); edges
// only read and watch it (auth.go).
const BucketNetworkRules = "warren-network-rules"

// RecordUpdate is one change Watch delivers: a record put (Raw set) or
// deleted (Raw nil), with its revision.
type RecordUpdate struct {
	Key string
	Raw []byte
	Rev uint64
}

// Watch delivers every record (the initial values, then ready once, then
// each change as it happens) to fn, in the caller's goroutine, until ctx
// ends.
func (r *Records) Watch(ctx context.Context, fn func(RecordUpdate), ready func()) error {
	w, err := r.kv.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("bus: watch records: %w", err)
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return nil
			}
			if e == nil {
				ready()
				continue
			}
			k, err := hex.DecodeString(e.Key()[1:])
			if err != nil {
				continue
			}
			u := RecordUpdate{Key: string(k), Rev: e.Revision()}
			if e.Operation() == jetstream.KeyValuePut {
				u.Raw = e.Value()
			}
			fn(u)
		}
	}
}
