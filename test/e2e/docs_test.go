package e2e

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
)

// The docs test runs every shell and Python example of README.md,
// docs/*.md and sdk/python/README.md against a real `warren serve`, as a
// newcomer would paste them, and fails on the first that does not succeed.
//
// What runs: fenced blocks tagged ```sh or ```python. Untagged blocks
// (output, diagrams, pseudo-requests) are not examples and do not run.
//
// Markers: HTML comments (invisible on the rendered page) on the lines
// right before a block's fence:
//
//	<!-- docs-test: skip REASON -->          the block does not run (say why: `make run`
//	                                         installs packages, a pull needs a registry)
//	<!-- docs-test: replace "OLD" "NEW" -->  run the block with OLD replaced by NEW
//	                                         (to scale an example down for the test)
//
// Every block gets a fresh busybox sandbox: $ID in shell, `sb` (and
// `saved_id`) in Python; `client` and `c` are a warren.Client, `builder`
// another sandbox. Shell blocks run under `bash -e -o pipefail` with
// $TOKEN, $WARREN_URL and $WARREN_TOKEN set, `curl` failing on an HTTP
// error (--fail-with-body) and bin/warren the binary under test;
// /var/lib/warren is the server's data dir and http://127.0.0.1:7070 its URL. Python blocks run with the SDK
// as installed by `pip install ./sdk/python` (into a temporary target,
// never the source tree); a block with a top-level await runs inside
// asyncio.run. The working directory holds the files the examples name:
// a.py, src/, django-1234/ and harness.tar.gz (a toolkit with bin/sh and
// bin/run-tests).
//
// examples/quickstart.py and examples/rl_rollouts.py (scaled down) run too.

var (
	fenceRE  = regexp.MustCompile("^```([a-z]*)\\s*$")
	markerRE = regexp.MustCompile(`^<!-- docs-test: (skip|replace) (.*) -->$`)
	quotedRE = regexp.MustCompile(`"((?:[^"\\]|\\.)*)"`)
)

type docBlock struct {
	where   string // file:line
	lang    string
	code    string
	skip    string
	replace [][2]string
}

// docBlocks extracts the fenced blocks of a markdown file with their markers.
func docBlocks(t *testing.T, path string) []docBlock {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		out     []docBlock
		pending docBlock
		cur     *docBlock
		body    strings.Builder
	)
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if cur != nil {
			if strings.TrimSpace(line) == "```" {
				cur.code = body.String()
				out = append(out, *cur)
				cur = nil
				continue
			}
			body.WriteString(line + "\n")
			continue
		}
		if m := fenceRE.FindStringSubmatch(line); m != nil {
			b := pending
			b.where, b.lang = fmt.Sprintf("%s:%d", filepath.Base(path), n), m[1]
			cur, pending = &b, docBlock{}
			body.Reset()
			continue
		}
		m := markerRE.FindStringSubmatch(strings.TrimSpace(line))
		switch {
		case m == nil:
			pending = docBlock{} // markers must sit right before the fence
		case m[1] == "skip":
			pending.skip = m[2]
		default:
			q := quotedRE.FindAllStringSubmatch(m[2], -1)
			if len(q) != 2 {
				t.Fatalf("%s:%d: want <!-- docs-test: replace \"OLD\" \"NEW\" -->", path, n)
			}
			pending.replace = append(pending.replace, [2]string{q[0][1], q[1][1]})
		}
	}
	if cur != nil {
		t.Fatalf("%s: unclosed fence at %s", path, cur.where)
	}
	return out
}

// docsFixtures makes the working directory the examples expect.
func docsFixtures(t *testing.T, dir string) {
	t.Helper()
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(dir, "bin"), 0o755))
	must(os.Symlink(bins.warren, filepath.Join(dir, "bin", "warren")))
	must(os.WriteFile(filepath.Join(dir, "a.py"), []byte("print(6 * 7)\n"), 0o644))
	must(os.MkdirAll(filepath.Join(dir, "src"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "src", "main.py"), []byte("print('main')\n"), 0o644))
	must(os.MkdirAll(filepath.Join(dir, "django-1234", "app"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "django-1234", "manage.py"), []byte("# django\n"), 0o644))
	must(os.WriteFile(filepath.Join(dir, "django-1234", "app", "models.py"), []byte("# models\n"), 0o644))
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Skip("SKIP: no /bin/busybox for the toolkit example")
	}
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	mod := time.Unix(1700000000, 0)
	for _, e := range []struct {
		name, link string
		data       []byte
		dir        bool
	}{
		{name: "bin/", dir: true},
		{name: "bin/busybox", data: bb},
		{name: "bin/sh", link: "busybox"},
		{name: "bin/run-tests", data: []byte("#!/opt/toolkit/bin/sh\necho all tests passed\n")},
	} {
		h := &tar.Header{Name: e.name, Mode: 0o755, ModTime: mod, Typeflag: tar.TypeReg, Size: int64(len(e.data))}
		switch {
		case e.dir:
			h.Typeflag, h.Size = tar.TypeDir, 0
		case e.link != "":
			h.Typeflag, h.Linkname, h.Size = tar.TypeSymlink, e.link, 0
		}
		must(tw.WriteHeader(h))
		_, err := tw.Write(e.data)
		must(err)
	}
	must(tw.Close())
	must(zw.Close())
	must(os.WriteFile(filepath.Join(dir, "harness.tar.gz"), buf.Bytes(), 0o644))
}

// installSDK installs sdk/python as a user would (pip, from the package,
// offline) into a temporary target and returns it.
func installSDK(t *testing.T) string {
	t.Helper()
	target := t.TempDir()
	cmd := exec.Command("python3", "-m", "pip", "install", "-q", "--no-index", "--disable-pip-version-check", "--target", target, "../../sdk/python")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("pip install ./sdk/python: %v\n%s", err, out)
	}
	return target
}

var topLevelAwait = regexp.MustCompile(`(?m)^(await |async with |async for )`)

func TestDocsExamples(t *testing.T) {
	parallel(t)
	for _, tool := range []string{"python3", "curl", "jq", "bash"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("SKIP: the examples use %s, which this machine lacks", tool)
		}
	}
	start := time.Now()
	s := startServer(t)
	ctx := context.Background()
	work := t.TempDir()
	docsFixtures(t, work)
	sdk := installSDK(t)
	env := append(os.Environ(), "WARREN_URL="+s.URL, "WARREN_TOKEN="+s.Token, "TOKEN="+s.Token, "PYTHONPATH="+sdk,
		"PYTHONDONTWRITEBYTECODE=1")
	builder := s.create(t, api.CreateSandboxRequest{MemoryMB: 64})
	s.sh(t, builder.ID, "mkdir -p /opt/built && echo built > /opt/built/tool")

	files, _ := filepath.Glob("../../docs/*.md")
	files = append([]string{"../../README.md", "../../sdk/python/README.md"}, files...)
	ran := 0
	for _, file := range files {
		for _, b := range docBlocks(t, file) {
			if b.lang != "sh" && b.lang != "python" {
				continue
			}
			if b.skip != "" {
				t.Logf("%s: skipped: %s", b.where, b.skip)
				continue
			}
			code := strings.ReplaceAll(b.code, "/var/lib/warren", s.dataDir)
			code = strings.ReplaceAll(code, "http://127.0.0.1:7070", s.URL)
			for _, r := range b.replace {
				if !strings.Contains(code, r[0]) {
					t.Fatalf("%s: replace %q: not in the block", b.where, r[0])
				}
				code = strings.ReplaceAll(code, r[0], r[1])
			}
			sb := s.create(t, api.CreateSandboxRequest{MemoryMB: 128})
			var cmd *exec.Cmd
			bctx, cancel := context.WithTimeout(ctx, 45*time.Second)
			if b.lang == "sh" {
				script := "curl() { command curl --fail-with-body \"$@\"; }\nexport ID=" + sb.ID + "\n" + code
				cmd = exec.CommandContext(bctx, "bash", "-e", "-o", "pipefail", "-c", script)
			} else {
				if topLevelAwait.MatchString(code) {
					code = "async def __docs_main():\n" + indent(code) + "\nasyncio.run(__docs_main())\n"
				}
				prelude := fmt.Sprintf("import asyncio, warren\nclient = c = warren.Client()\nsb = client.sandbox(%q)\nsaved_id = sb.id\nbuilder = client.sandbox(%q)\n", sb.ID, builder.ID)
				cmd = exec.CommandContext(bctx, "python3", "-c", prelude+code)
			}
			cmd.Dir, cmd.Env = work, env
			// At the block's deadline its whole process group goes (a
			// command it started must not hold the output pipe open and
			// hang the test: a warren shell did once).
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
			cmd.WaitDelay = 5 * time.Second
			t0 := time.Now()
			out, err := cmd.CombinedOutput()
			cancel()
			if err != nil {
				t.Errorf("%s: the %s example failed: %v\n--- example ---\n%s--- output ---\n%s\n--- server log ---\n%s",
					b.where, b.lang, err, code, out, tail(s.logs.String(), 4))
				continue
			}
			ran++
			t.Logf("%s: %s ok in %v", b.where, b.lang, time.Since(t0).Round(time.Millisecond))
		}
	}
	for _, ex := range [][]string{{"../../examples/quickstart.py"}, {"../../examples/rl_rollouts.py", "--rollouts", "4", "--steps", "2"}} {
		abs, _ := filepath.Abs(ex[0])
		cmd := exec.Command("python3", append([]string{abs}, ex[1:]...)...)
		cmd.Dir, cmd.Env = work, env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("%s: %v\n%s", ex[0], err, out)
		}
		ran++
	}
	if ran < 10 {
		t.Fatalf("only %d examples ran: the extraction is broken", ran)
	}
	t.Logf("%d examples ran in %v", ran, time.Since(start).Round(time.Millisecond))
}

func indent(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = "    " + l
	}
	return strings.Join(lines, "\n")
}
