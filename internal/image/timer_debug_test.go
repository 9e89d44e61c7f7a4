package image

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestTimerDebug(t *testing.T) {
	outside := t.TempDir()
	victim := filepath.Join(outside, "victim")
	os.WriteFile(victim, []byte("safe"), 0o644)
	seeds := [][]ent{
		{dirE("./"), dirE("a/"), fileE("a/b", "hello"), symE("a/l", "b"), hardE("a/h", "a/b")},
		{fileE("../escape", "x")},
		{fileE(outside + "/abs", "x")},
		{symE("l", outside), fileE("l/evil", "x")},
		{symE("l", "../../"+outside), dirE("l/d/")},
		{symE("f", victim), fileE("f", "replaced")},
		{hardE("h", "../victim")},
		{symE("l", outside), hardE("h", "l/victim")},
		{dirE("d/"), fileE("d/.wh..wh..opq", ""), fileE("d/.wh.gone", ""), fileE(".wh..wh.plnk", "")},
		{modeE(fileE("su", "x"), 0o4755), {name: "fifo", typ: '6', mode: 0o600}, {name: "null", typ: '3', mode: 0o666}},
		{fileE("x", "1"), dirE("x/"), fileE("x", "2")},
		{xattrE(fileE("x", ""), "user.a", "b"), xattrE(fileE("y", ""), "trusted.overlay.redirect", "/etc")},
	}
	for i, s := range seeds {
		root := t.TempDir()
		Unpack(context.Background(), bytes.NewReader(mkTar(t, s...)), root, Limits{})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		select {
		case <-ctx.Done():
		case <-time.After(2 * time.Second):
			t.Errorf("seed %d: timer did not fire", i)
		}
		cancel()
	}
}
