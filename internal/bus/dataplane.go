package bus

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// BucketDataPlane holds the key that apiservers and edges share to sign
// and check data-plane grants (internal/dataplane).
const BucketDataPlane = "warren-dataplane"

const dataPlaneKey = "grant-key"

// DataPlaneKey returns the cluster's data-plane grant key, made (32 random
// bytes) by the first apiserver that asks (edges only read it). Whoever can
// read it can call any edge's data listener, as whoever can publish to
// the edges' subjects can call any edge: apiservers only (see auth.go).
func (c *Conn) DataPlaneKey(ctx context.Context) ([]byte, error) {
	kv, err := c.KeyValue(ctx, BucketDataPlane, 0)
	if err != nil {
		return nil, err
	}
	var key []byte
	err = RetryStartup(ctx, func(ctx context.Context) error {
		if e, err := kv.Get(ctx, dataPlaneKey); err == nil {
			key = e.Value()
			return nil
		} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return err
		}
		if c.edge {
			return errors.New("no key yet (an apiserver makes it)")
		}
		fresh := make([]byte, 32)
		if _, err := rand.Read(fresh); err != nil {
			return err
		}
		if _, err := kv.Create(ctx, dataPlaneKey, fresh); err != nil {
			return err // another process made it first (ErrKeyExists): read it on the retry
		}
		key = fresh
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("bus: data-plane key: %w", err)
	}
	if len(key) < 16 {
		return nil, errors.New("bus: data-plane key is too short")
	}
	return key, nil
}
