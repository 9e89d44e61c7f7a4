package lifetime

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestGroupWaitsAndRefusesAfterClose(t *testing.T) {
	var g Group
	release := make(chan struct{})
	if !g.Go(func() { <-release }) {
		t.Fatal("Go refused before Close")
	}
	g.Close()
	if g.Go(func() {}) || g.Enter() {
		t.Fatal("Go or Enter accepted after Close")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := g.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait with a goroutine running: %v", err)
	}
	g.Add(1) // a child of counted work is still counted after Close
	close(release)
	done := make(chan error)
	go func() { done <- g.Wait(context.Background()) }()
	select {
	case err := <-done:
		t.Fatalf("Wait returned (%v) with the child still counted", err)
	case <-time.After(20 * time.Millisecond):
	}
	g.Done()
	if err := <-done; err != nil || g.Len() != 0 {
		t.Fatalf("Wait: %v, %d left", err, g.Len())
	}
	if err := g.Wait(context.Background()); err != nil {
		t.Fatalf("a second Wait: %v", err)
	}
}
