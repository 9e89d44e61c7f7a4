package e2e

import (
	"context"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// e2bSDKDir holds the official e2b npm package (test/e2b-sdk, installed by
// scripts/install-deps.sh at the version package.json pins).
const e2bSDKDir = "../e2b-sdk"

// runE2BSDK runs a script of test/e2b-sdk with node against the E2B front
// at base, authenticated by token, and returns its output.
func runE2BSDK(t *testing.T, script, base, token string, env ...string) (string, error) {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("SKIP: node is not installed (the official e2b SDK is a node package)")
	}
	if _, err := os.Stat(filepath.Join(e2bSDKDir, "node_modules", "e2b", "package.json")); err != nil {
		t.Fatalf("the e2b SDK is not installed in test/e2b-sdk: run scripts/install-deps.sh (%v)", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, script)
	cmd.Dir = e2bSDKDir
	cmd.Env = append(os.Environ(),
		"E2B_API_URL="+base, "E2B_SANDBOX_URL="+base,
		"E2B_API_KEY=e2b_"+hex.EncodeToString([]byte(token)),
		"E2B_DEBUG=", "E2B_DOMAIN=warren.invalid")
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestE2BOfficialSDK drives warren with the official e2b JS SDK, unchanged
// (test/e2b-sdk/sdk.mjs): create; commands.run with onStdout (seen before
// the command ends), a failing command, background + kill; files write
// (one and many), read, list, exists, makeDir, rename, remove, a missing
// file; getInfo, Sandbox.list, setTimeout, connect, pause and resume;
// stdin (sendStdin, closeStdin), a PTY (pty.create, sendInput, resize,
// kill), getHost (a server in the sandbox through the E2B listener);
// kill twice; an unknown template.
func TestE2BOfficialSDK(t *testing.T) {
	parallel(t)
	e2bAddr := freePort(t)
	s := startServer(t, "--e2b-listen", e2bAddr)
	portsrvBinary(t) // sdk.mjs copies it into the sandbox (getHost)
	out, err := runE2BSDK(t, "sdk.mjs", "http://"+e2bAddr, s.Token, "E2B_PORTSRV="+portsrv.path)
	t.Logf("sdk.mjs:\n%s", out)
	if err != nil || !strings.Contains(out, "all checks passed") {
		t.Fatalf("the official SDK failed against warren (%v):\n%s\nserver log:\n%s", err, out, tail(s.logs.String(), 30))
	}
}
