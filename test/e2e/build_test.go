package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/warrenhq/warren/api"
	warren "github.com/warrenhq/warren/sdk/go"
)

const buildDockerfile = `# syntax is buildkit's
ARG BASE=busybox
FROM $BASE
ARG BASE
ARG GREETING=hello
ENV APP_HOME=/opt/app \
    PATH=/opt/app/bin:$PATH
WORKDIR $APP_HOME
COPY app.txt ./
COPY bin/ bin/
RUN echo "$GREETING from $(pwd) as $(id -u) on $BASE" > built.txt && \
    chmod 755 bin/tool && echo "run-output-line"
ADD files.tar.gz /opt/data/
COPY app.txt /etc
COPY --chown=nobody:nogroup --chmod=0640 app.txt /opt/owned.txt
RUN ["sh", "-c", "cat /opt/data/inner.txt > /opt/app/inner-copy.txt"]
USER nobody
LABEL org.example.test=yes
EXPOSE 8080
CMD ["tool"]
`

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func gzipTar(t *testing.T, files map[string]string) string {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for name, content := range files {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(content)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(content))
	}
	tw.Close()
	zw.Close()
	return buf.String()
}

// TestImageBuild builds a Dockerfile FROM busybox with the CLI, uses the
// image, rebuilds it from the cache, rebuilds after a changed COPY input,
// and checks that a failing RUN and a broken Dockerfile store nothing.
func TestImageBuild(t *testing.T) {
	parallel(t)
	s := startServer(t)
	ctx := context.Background()
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"Dockerfile":   buildDockerfile,
		"app.txt":      "app v1\n",
		"bin/tool":     "#!/bin/sh\necho tool ran\n",
		"unused.txt":   "not copied\n",
		"files.tar.gz": gzipTar(t, map[string]string{"inner.txt": "from the archive\n"}),
	})
	build := func(extra ...string) (string, time.Duration, error) {
		t0 := time.Now()
		out, err := s.warren(t, append([]string{"image", "build", "-t", "demo/app:1", "--build-arg", "GREETING=hi"}, append(extra, dir)...)...)
		return out, time.Since(t0), err
	}
	out, took, err := build()
	if err != nil {
		t.Fatalf("build: %v\n%s\nserver log:\n%s", err, out, tail(s.logs.String(), 40))
	}
	t.Logf("first build: %v\n%s", took, out)
	for _, want := range []string{"Step 1/16 : FROM busybox", "Step 8/16 : RUN echo", "run-output-line", "Successfully tagged demo/app:1"} {
		if !strings.Contains(out, want) {
			t.Errorf("build output lacks %q", want)
		}
	}

	// The image: files, environment, working directory and user.
	imgs, err := s.C.Images(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var img *api.Image
	for i := range imgs {
		if imgs[i].Name == "demo/app:1" {
			img = &imgs[i]
		}
	}
	if img == nil || img.Config == nil {
		t.Fatalf("image demo/app:1 missing or without config: %+v", imgs)
	}
	if img.Config.WorkingDir != "/opt/app" || img.Config.User != "nobody" || img.Config.Labels["org.example.test"] != "yes" ||
		strings.Join(img.Config.Cmd, " ") != "tool" || strings.Join(img.Config.ExposedPorts, ",") != "8080" {
		t.Errorf("config %+v", img.Config)
	}
	sb := s.create(t, api.CreateSandboxRequest{Image: "demo/app:1"})
	check := func(cmd, want string) {
		t.Helper()
		r := s.sh(t, sb.ID, cmd)
		if r.ExitCode != 0 || strings.TrimSpace(r.Stdout) != want {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want %q", cmd, r.ExitCode, r.Stdout, r.Stderr, want)
		}
	}
	check("pwd", "/opt/app")
	check("id -u", "65534")
	check("echo $APP_HOME", "/opt/app")
	check("echo $PATH", "/opt/app/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	check("cat app.txt", "app v1")
	check("cat /etc/app.txt", "app v1") // into an existing directory
	check("stat -c %u:%g:%a /opt/owned.txt", "65534:65534:640")
	check("cat built.txt", "hi from /opt/app as 0 on busybox")
	check("tool", "tool ran")
	check("cat /opt/data/inner.txt", "from the archive")
	check("cat inner-copy.txt", "from the archive")
	check("ls /opt/app", "app.txt\nbin\nbuilt.txt\ninner-copy.txt")
	check("test -e unused.txt || echo absent", "absent")
	check("stat -c %u:%g /opt/app/app.txt", "0:0")
	// The ARG is not part of the image's environment.
	check("echo ${GREETING:-unset}", "unset")
	// The create request's user wins over the image's.
	root := s.create(t, api.CreateSandboxRequest{Image: "demo/app:1", User: "root"})
	if r := s.sh(t, root.ID, "id -u; pwd"); strings.TrimSpace(r.Stdout) != "0\n/opt/app" {
		t.Errorf("user root: %q", r.Stdout)
	}

	// A rebuild with nothing changed only looks the steps up.
	out, took, err = build()
	if err != nil {
		t.Fatalf("rebuild: %v\n%s", err, out)
	}
	t.Logf("cached rebuild: %v\n%s", took, out)
	if n := strings.Count(out, "CACHED"); n != 8 || strings.Contains(out, "running in") {
		t.Errorf("rebuild: %d CACHED steps, want all 8 file steps cached:\n%s", n, out)
	}
	if took > 5*time.Second {
		t.Errorf("cached rebuild took %v", took)
	}
	imgs, _ = s.C.Images(ctx)
	for _, im := range imgs {
		if im.Name == "demo/app:1" && im.Digest != img.Digest {
			t.Errorf("cached rebuild changed the image: %s -> %s", img.Digest, im.Digest)
		}
	}

	// A changed COPY input: the steps before it come from the cache, it
	// and every later step run again.
	writeFiles(t, dir, map[string]string{"app.txt": "app v2\n"})
	out, _, err = build()
	if err != nil {
		t.Fatalf("build after a change: %v\n%s", err, out)
	}
	if n := strings.Count(out, "CACHED"); n != 1 || strings.Count(out, "running in") != 7 {
		t.Errorf("after changing app.txt: %d cached (want 1: WORKDIR), %d run (want 7):\n%s", n, strings.Count(out, "running in"), out)
	}
	// --no-cache runs every step again (new versions of the cache layers
	// where the result differs); the next build is all cached again.
	if out, _, err := build("--no-cache"); err != nil || strings.Contains(out, "CACHED") || strings.Count(out, "running in") != 8 {
		t.Errorf("--no-cache: %v\n%s", err, out)
	}
	if out, _, err := build(); err != nil || strings.Count(out, "CACHED") != 8 {
		t.Errorf("after --no-cache: %v\n%s", err, out)
	}
	sb2 := s.create(t, api.CreateSandboxRequest{Image: "demo/app:1"})
	if r := s.sh(t, sb2.ID, "cat app.txt"); strings.TrimSpace(r.Stdout) != "app v2" {
		t.Errorf("rebuilt image: app.txt %q", r.Stdout)
	}

	// A failing RUN fails the build with its output and exit code and
	// stores no image.
	bad := t.TempDir()
	writeFiles(t, bad, map[string]string{"Dockerfile": "FROM busybox\nRUN echo partial > /x\nRUN echo boom-output; exit 3\n"})
	out, err = s.warren(t, "image", "build", "-t", "demo/bad", bad)
	if err == nil || !strings.Contains(out, "boom-output") || !strings.Contains(out, "returned a non-zero code: 3") {
		t.Errorf("failing RUN: err %v\n%s", err, out)
	}
	imgs, _ = s.C.Images(ctx)
	for _, im := range imgs {
		if im.Name == "demo/bad" {
			t.Errorf("a failed build stored an image: %+v", im)
		}
	}
	// Its build sandboxes are gone.
	if sbs, err := s.C.List(ctx, warren.ListOptions{Labels: map[string]string{"warren.build": "demo_bad"}}); err == nil {
		for _, x := range sbs {
			if x.State == api.StateRunning {
				t.Errorf("build sandbox %s still running", x.ID)
			}
		}
	}

	// Dockerfiles that cannot be built: clear CLI errors, nothing stored.
	for _, tc := range []struct{ df, want string }{
		{"FROM busybox\nFOO bar\n", "unknown instruction"},
		{"RUN true\n", "FROM"},
		{"FROM busybox\nADD https://example.com/x.tar /x/\n", "remote URLs are not supported"},
		{"FROM busybox\nCOPY missing.txt /x\n", "no such file"},
		{"FROM busybox AS a\nFROM busybox\nCOPY --from=a /bin/sh /x\n", "multi-stage"},
		{"FROM busybox\nRUN --mount=type=cache,target=/x true\n", "not supported"},
	} {
		d := t.TempDir()
		writeFiles(t, d, map[string]string{"Dockerfile": tc.df})
		out, err := s.warren(t, "image", "build", "-t", "demo/broken", d)
		if err == nil || !strings.Contains(out, tc.want) {
			t.Errorf("Dockerfile %q: err %v, output lacks %q:\n%s", tc.df, err, tc.want, out)
		}
	}
	// The commit endpoint answers bad input with 4xx.
	for _, body := range []string{`{"name":""}`, `{"name":"x","layers":["BAD NAME"]}`, `{"name":"x","base":"nope"}`,
		`{"name":"x","config":{"working_dir":"rel"}}`, `{"name":"x","layers":["build/none@1"]}`} {
		code, resp := s.rawRequest(t, http.MethodPost, "/v1/images:commit", s.Token, []byte(body), nil)
		if code < 400 || code >= 500 {
			t.Errorf("commit %s: %d %s", body, code, resp)
		}
	}
}

// TestImageDefaults: a committed image's env, working directory and user
// are the defaults of its sandboxes, in a new container and in a recycled
// one (rerooted from another image); a create's user wins.
func TestImageDefaults(t *testing.T) {
	parallel(t)
	s := startServer(t)
	ctx := context.Background()
	img, err := s.C.CommitImage(ctx, api.CommitImageRequest{Name: "defaults", Base: "busybox",
		Config: &api.ImageConfig{Env: []string{"GREETING=hi"}, WorkingDir: "/tmp", User: "nobody"}})
	if err != nil {
		t.Fatal(err)
	}
	if img.Config == nil || img.Config.WorkingDir != "/tmp" || img.Config.User != "nobody" ||
		strings.Join(img.Config.Env, " ") != "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin GREETING=hi" {
		t.Fatalf("committed config %+v", img.Config)
	}
	const probe = "id -u; pwd; echo $GREETING"
	fresh := s.create(t, api.CreateSandboxRequest{Image: "defaults"})
	if r := s.sh(t, fresh.ID, probe); r.Stdout != "65534\n/tmp\nhi\n" {
		t.Errorf("new container: %+v", r)
	}
	// A session that moves keeps its directory.
	if r := s.sh(t, fresh.ID, "cd / && pwd"); r.Stdout != "/\n" {
		t.Errorf("cd: %+v", r)
	}
	if r := s.sh(t, fresh.ID, "pwd"); r.Stdout != "/\n" {
		t.Errorf("after cd: %+v", r)
	}
	// A recycled container of a busybox sandbox takes the image's defaults.
	a := s.create(t, api.CreateSandboxRequest{Image: "busybox"})
	if _, err := s.C.Delete(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	s.recycling(t, func(r api.NodeRecycling) bool { return r.Waiting == 1 })
	b := s.create(t, api.CreateSandboxRequest{Image: "defaults"})
	s.recycling(t, func(r api.NodeRecycling) bool { return r.Reused == 1 })
	if r := s.sh(t, b.ID, probe); r.Stdout != "65534\n/tmp\nhi\n" {
		t.Errorf("recycled container: %+v", r)
	}
	// And back: a busybox sandbox in that container has none of them.
	if _, err := s.C.Delete(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	s.recycling(t, func(r api.NodeRecycling) bool { return r.Waiting == 1 })
	c := s.create(t, api.CreateSandboxRequest{Image: "busybox"})
	s.recycling(t, func(r api.NodeRecycling) bool { return r.Reused == 2 })
	if r := s.sh(t, c.ID, probe); r.Stdout != "0\n/root\n\n" {
		t.Errorf("busybox after the image in a recycled container: %+v", r)
	}
	// The create request's user wins over the image's.
	d := s.create(t, api.CreateSandboxRequest{Image: "defaults", User: "root"})
	if r := s.sh(t, d.ID, probe); r.Stdout != "0\n/tmp\nhi\n" {
		t.Errorf("user root: %+v", r)
	}
}

// TestImageBuildFromRegistry: FROM an OCI reference the server does not
// have pulls it (here from go-containerregistry's registry on loopback),
// and the pulled image's config is the build's starting state.
func TestImageBuildFromRegistry(t *testing.T) {
	parallel(t)
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	host := strings.TrimPrefix(reg.URL, "http://")
	rootfs := rootfsTar(t)
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(rootfs)), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config.Env = []string{"PATH=/bin", "FROM_REGISTRY=1"}
	cf.Config.WorkingDir = "/tmp"
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	ref, err := name.ParseReference(host + "/base/bb:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}

	s := startServer(t)
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"Dockerfile": "FROM " + ref.String() + "\nRUN echo made-in-$(pwd)-$FROM_REGISTRY > made\n"})
	out, err := s.warren(t, "image", "build", "-t", "from-registry", dir)
	if err != nil || !strings.Contains(out, "pulling "+ref.String()) {
		t.Fatalf("build: %v\n%s\n%s", err, out, tail(s.logs.String(), 20))
	}
	sb := s.create(t, api.CreateSandboxRequest{Image: "from-registry"})
	if r := s.sh(t, sb.ID, "cat made; pwd; echo $FROM_REGISTRY"); r.Stdout != "made-in-/tmp-1\n/tmp\n1\n" {
		t.Fatalf("image from a pulled base: %+v", r)
	}
	// The second build finds the pulled base on the server: no pull.
	out, err = s.warren(t, "image", "build", "-t", "from-registry", dir)
	if err != nil || strings.Contains(out, "pulling") || !strings.Contains(out, "CACHED") {
		t.Fatalf("rebuild: %v\n%s", err, out)
	}
}

// TestImageBuildCacheTrust: a project cannot plant a cache entry a root
// build would use (keys are predictable and anyone may name a layer
// build/<key>), and a project token cannot store images in the shared
// catalog.
func TestImageBuildCacheTrust(t *testing.T) {
	parallel(t)
	// A build on a first server tells the key (the same on any server with
	// the same busybox image).
	ctx := context.Background()
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"Dockerfile": "FROM busybox\nRUN echo genuine > /made\n"})
	first := startServer(t)
	if out, err := first.warren(t, "image", "build", "-t", "trust", dir); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	ls, err := first.C.Layers(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	var key string
	for _, l := range ls {
		if strings.HasPrefix(l.Name, "build/") {
			key = l.Name
		}
	}
	if key == "" {
		t.Fatalf("no build/ layer: %+v", ls)
	}
	first.stop()
	// On a second server a tenant names that layer first.
	s := startServer(t)
	if _, err := s.C.CreateProject(ctx, api.CreateProjectRequest{Name: "tenant"}); err != nil {
		t.Fatal(err)
	}
	tk, err := s.C.CreateToken(ctx, api.CreateTokenRequest{Principal: "t", Project: "tenant", Role: api.RoleAdmin})
	if err != nil {
		t.Fatal(err)
	}
	tenant := warren.New(s.URL, tk.Secret)
	var poison bytes.Buffer
	tw := tar.NewWriter(&poison)
	tw.WriteHeader(&tar.Header{Name: "made", Mode: 0o644, Size: 7, Typeflag: tar.TypeReg})
	tw.Write([]byte("poison\n"))
	tw.Close()
	if _, err := tenant.CreateLayerFromTar(ctx, key, 1, bytes.NewReader(poison.Bytes())); err != nil {
		t.Fatalf("the tenant names a layer %s: %v", key, err)
	}
	// Layer names are per project: the tenant's build/<key> is its own
	// (~tenant/build/<key>), which root's build never resolves, so the step
	// runs again.
	out, err := s.warren(t, "image", "build", "-t", "trust", dir)
	if err != nil || strings.Contains(out, "CACHED") {
		t.Fatalf("rebuild: %v\n%s", err, out)
	}
	sb := s.create(t, api.CreateSandboxRequest{Image: "trust"})
	if r := s.sh(t, sb.ID, "cat /made"); r.Stdout != "genuine\n" {
		t.Fatalf("the image holds %q", r.Stdout)
	}
	// A tenant's build stops at its first step with a clear message.
	tdir := t.TempDir()
	writeFiles(t, tdir, map[string]string{"Dockerfile": "FROM busybox\nRUN echo tenant-step > /t\n"})
	cmd := exec.Command(bins.warren, "--url", s.URL, "--token", tk.Secret, "image", "build", "-t", "busybox", tdir)
	b, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(b), "needs a root token") {
		t.Fatalf("tenant build: %v\n%s", err, b)
	}
}
