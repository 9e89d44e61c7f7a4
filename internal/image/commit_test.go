package image

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func TestMergeConfig(t *testing.T) {
	base := Config{Env: []string{"PATH=/bin", "A=1"}, Cmd: []string{"sh"}, WorkingDir: "/", User: "u",
		Labels: map[string]string{"a": "1"}, ExposedPorts: []string{"80"}}
	got := mergeConfig(base, Config{Env: []string{"A=2", "B=3"}, Entrypoint: []string{"run"}, Labels: map[string]string{"b": "2"},
		ExposedPorts: []string{"80", "443"}})
	want := Config{Env: []string{"PATH=/bin", "A=2", "B=3"}, Entrypoint: []string{"run"}, WorkingDir: "/", User: "u",
		Labels: map[string]string{"a": "1", "b": "2"}, ExposedPorts: []string{"80", "443"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("merge:\n got %+v\nwant %+v", got, want)
	}
	if base.Env[1] != "A=1" || len(base.Labels) != 1 || len(base.ExposedPorts) != 1 {
		t.Fatalf("merge changed its base: %+v", base)
	}
	// A CMD given with the ENTRYPOINT stays.
	if got := mergeConfig(base, Config{Entrypoint: []string{"e"}, Cmd: []string{"c"}}); !reflect.DeepEqual(got.Cmd, []string{"c"}) {
		t.Fatalf("cmd %v", got.Cmd)
	}
}

func TestCommit(t *testing.T) {
	requireRoot(t)
	s := newStore(t)
	ctx := context.Background()
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "f"), []byte("base"), 0o644)
	if _, err := s.Import(ctx, dir, "base"); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "f"), []byte("step"), 0o644)
	l, err := s.CreateLayerFromDir(ctx, "build/step", 1, dir)
	if err != nil {
		t.Fatal(err)
	}
	img, err := s.Commit(ctx, "built:1", "base", []string{"build/step@1"}, Config{Env: []string{"X=1"}, WorkingDir: "/w"})
	if err != nil {
		t.Fatal(err)
	}
	base, _, _ := s.Resolve(ctx, "base")
	if len(img.Layers) != 2 || img.Layers[0] != base.Layers[0] || img.Layers[1] != l.Digest ||
		img.Config.WorkingDir != "/w" || !reflect.DeepEqual(img.Config.Env, []string{"X=1"}) {
		t.Fatalf("image %+v", img)
	}
	// The image keeps its layer when the named layer goes.
	if _, err := s.DeleteLayer(ctx, "build/step", 0); err != nil {
		t.Fatal(err)
	}
	if _, blobs, err := s.Resolve(ctx, "built:1"); err != nil || len(blobs) != 2 {
		t.Fatalf("after the named layer went: %v %v", blobs, err)
	}
	// Same inputs, same digest; unknown base or layer: not found.
	again, err := s.Commit(ctx, "built:2", "base", []string{}, Config{})
	if err != nil || len(again.Layers) != 1 {
		t.Fatalf("%+v %v", again, err)
	}
	if _, err := s.Commit(ctx, "x", "nope", nil, Config{}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown base: %v", err)
	}
	if _, err := s.Commit(ctx, "x", "scratch", []string{"build/none@1"}, Config{}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown layer: %v", err)
	}
	if _, err := s.Commit(ctx, "bad name", "", nil, Config{}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad name: %v", err)
	}
}
