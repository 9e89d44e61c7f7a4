// Package imagebuild builds warren images from Dockerfiles, client-side:
// it drives a warren server through its API (sdk/go), so it works against a
// remote server as well as a local one.
//
// The Dockerfile is parsed by buildkit's parser and instruction decoder
// (github.com/moby/buildkit/frontend/dockerfile/{parser,instructions}), and
// words are expanded by its shell lexer. Each step that changes files is
// built in a real sandbox: RUN runs its command there; COPY and ADD upload
// the files from the build context into it; WORKDIR makes its directory.
// The sandbox's changes are then packed by the server as a content-addressed
// layer (POST /v1/layers from_sandbox), stored as the named layer
// "build/<key>" version 1, where key is the step's cache key: the sha256 of
// the previous step's key (the first step's: the base image's digest), the
// instruction's text, the build state (ENV, ARG values, WORKDIR, USER,
// SHELL) and, for COPY and ADD, the digest of the copied files' names,
// modes and contents. A step whose layer exists is not run again (CACHED).
// The image is finally committed (POST /v1/images:commit) as the base
// image's layers, the steps' layers and the recorded config; a failing step
// commits nothing.
package imagebuild

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/frontend/dockerfile/shell"
	"github.com/moby/patternmatcher"

	"github.com/warrenhq/warren/api"
	warren "github.com/warrenhq/warren/sdk/go"
)

// LayerPrefix names the cache layers: "build/<key>".
const LayerPrefix = "build/"

// DefaultPath is the PATH of a sandbox whose image sets none (the agent's).
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// rootUser runs build steps as root by number: an image need not have an
// /etc/passwd.
const rootUser = "0"

// Options configure a build.
type Options struct {
	Dockerfile []byte // the Dockerfile's text
	// DockerfileName is used in messages.
	DockerfileName string
	// Context is the build context directory COPY and ADD read from.
	Context   string
	Tag       string            // the image name to store
	BuildArgs map[string]string // --build-arg
	// NoCache runs every step again (the new layers replace nothing: a
	// step whose result differs from the cached one gets a new version).
	NoCache bool
	// Out receives the progress and the output of RUN (nil: discarded).
	Out io.Writer
	// Sandbox tunes the build sandboxes (cpu, memory_mb, disk_mb).
	CPU      float64
	MemoryMB int64
	DiskMB   int64
	// Timeout bounds each RUN (seconds; 0 = 3600).
	Timeout float64
}

// Result is what a build made.
type Result struct {
	Image  *api.Image
	Steps  int
	Cached int // steps answered from the cache
	Built  int // steps run
}

// StepError is a RUN that failed: its exit code and output were streamed.
type StepError struct {
	Step     int
	Cmd      string
	ExitCode int
	Output   string // the last part of its output
}

func (e *StepError) Error() string {
	return fmt.Sprintf("step %d: the command %q returned a non-zero code: %d", e.Step, e.Cmd, e.ExitCode)
}

// ParseError is a Dockerfile that cannot be built (syntax, unsupported
// instruction or flag).
type ParseError struct{ Msg string }

func (e *ParseError) Error() string { return e.Msg }

func parseErr(format string, a ...any) error { return &ParseError{Msg: fmt.Sprintf(format, a...)} }

// state is what the instructions so far have set.
type state struct {
	Env     []string          `json:"env,omitempty"`  // ENV, KEY=VALUE in order
	Args    map[string]string `json:"args,omitempty"` // ARG values in scope
	Workdir string            `json:"workdir,omitempty"`
	User    string            `json:"user,omitempty"`
	Shell   []string          `json:"shell,omitempty"`
}

type builder struct {
	c     *warren.Client
	o     Options
	out   io.Writer
	lex   *shell.Lex
	base  *api.Image
	st    state
	cfg   api.ImageConfig // CMD, ENTRYPOINT, LABEL, EXPOSE
	key   string          // the chain key so far
	chain []string        // layer refs of the steps, bottom first
	res   Result
	// baseEnv is the base image's environment (for expansion).
	baseEnv []string
	// metaArgs are the ARGs before FROM (an ARG without a value in the
	// stage takes its value from them).
	metaArgs map[string]string
	// the context's .dockerignore, read at the first COPY or ADD
	ignored    *patternmatcher.PatternMatcher
	ignoreRead bool
}

// Build parses the Dockerfile, runs its steps and stores the image.
func Build(ctx context.Context, c *warren.Client, o Options) (*Result, error) {
	if o.Out == nil {
		o.Out = io.Discard
	}
	if o.DockerfileName == "" {
		o.DockerfileName = "Dockerfile"
	}
	if o.Timeout == 0 {
		o.Timeout = 3600
	}
	if o.Tag == "" {
		return nil, errors.New("a tag (-t NAME) is required")
	}
	ast, err := parser.Parse(bytes.NewReader(o.Dockerfile))
	if err != nil {
		return nil, parseErr("%s: %v", o.DockerfileName, err)
	}
	for _, n := range ast.AST.Children {
		if strings.EqualFold(n.Value, "arg") {
			continue
		}
		if !strings.EqualFold(n.Value, "from") {
			return nil, parseErr("%s:%d: the first instruction must be FROM (only ARG may come before it), not %s",
				o.DockerfileName, n.StartLine, strings.ToUpper(n.Value))
		}
		break
	}
	stages, metaArgs, err := instructions.Parse(ast.AST, nil)
	if err != nil {
		return nil, parseErr("%s: %v", o.DockerfileName, err)
	}
	if len(stages) == 0 {
		return nil, parseErr("%s: no FROM instruction", o.DockerfileName)
	}
	if len(stages) > 1 {
		return nil, parseErr("%s: %d stages: multi-stage builds are not supported (one FROM per Dockerfile)", o.DockerfileName, len(stages))
	}
	if err := validate(&stages[0]); err != nil {
		return nil, err
	}
	b := &builder{c: c, o: o, out: o.Out, lex: shell.NewLex(ast.EscapeToken)}
	b.st.Args = map[string]string{}
	return b.run(ctx, &stages[0], metaArgs)
}

func (b *builder) printf(format string, a ...any) { fmt.Fprintf(b.out, format, a...) }

func (b *builder) run(ctx context.Context, stage *instructions.Stage, metaArgs []instructions.ArgCommand) (*Result, error) {
	start := time.Now()
	total := 1 + len(stage.Commands)
	b.res.Steps = total
	// ARGs before FROM are in scope for FROM only.
	meta := map[string]string{}
	for _, a := range metaArgs {
		for _, kv := range a.Args {
			if v, ok := b.o.BuildArgs[kv.Key]; ok {
				meta[kv.Key] = v
			} else if kv.Value != nil {
				v, err := b.expand(*kv.Value, meta)
				if err != nil {
					return nil, err
				}
				meta[kv.Key] = v
			}
		}
	}
	b.metaArgs = meta
	baseName, err := b.expand(stage.BaseName, meta)
	if err != nil {
		return nil, err
	}
	b.printf("Step 1/%d : FROM %s\n", total, baseName)
	if err := b.from(ctx, baseName); err != nil {
		return nil, err
	}
	for i, cmd := range stage.Commands {
		n := i + 2
		if err := b.step(ctx, n, total, cmd); err != nil {
			return nil, err
		}
	}
	req := api.CommitImageRequest{Name: b.o.Tag, Layers: b.chain, Config: b.config()}
	if b.base != nil {
		req.Base = b.base.Name
	}
	img, err := b.c.CommitImage(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("commit image %s: %w", b.o.Tag, err)
	}
	b.res.Image = img
	b.printf("Successfully built %s in %.1fs (%d steps, %d cached)\n", shortDigest(img.Digest), time.Since(start).Seconds(), total, b.res.Cached)
	b.printf("Successfully tagged %s\n", img.Name)
	return &b.res, nil
}

// config is what the image records beyond its base's.
func (b *builder) config() *api.ImageConfig {
	c := b.cfg
	c.Env = b.st.Env
	c.WorkingDir = b.st.Workdir
	c.User = b.st.User
	return &c
}

// from finds the base image: one of the server's images, else an OCI
// reference pulled into the server's store.
func (b *builder) from(ctx context.Context, name string) error {
	if name == "scratch" {
		b.key = digestOf("scratch")
		b.printf(" ---> scratch\n")
		return nil
	}
	img, err := b.findImage(ctx, name)
	if err != nil {
		return err
	}
	if img == nil {
		b.printf(" ---> pulling %s\n", name)
		t0 := time.Now()
		stop := b.ticking("pulling")
		img, err = b.c.PullImage(ctx, name, "")
		stop()
		if err != nil {
			return fmt.Errorf("FROM %s: not an image of the server, and pulling it failed: %w", name, err)
		}
		b.printf(" ---> pulled %s in %.1fs\n", shortDigest(img.Digest), time.Since(t0).Seconds())
		if full, err := b.findImage(ctx, img.Name); err == nil && full != nil {
			img = full
		}
	}
	b.base = img
	b.key = img.Digest
	if img.Config != nil {
		b.baseEnv = img.Config.Env
		b.st.Workdir = img.Config.WorkingDir
		b.st.User = img.Config.User
	}
	if !slices.ContainsFunc(b.baseEnv, func(kv string) bool { return strings.HasPrefix(kv, "PATH=") }) {
		// A sandbox without PATH gets the agent's default: $PATH in an
		// ENV means that one (as Docker's default PATH).
		b.baseEnv = append(slices.Clone(b.baseEnv), "PATH="+DefaultPath)
	}
	b.printf(" ---> %s\n", shortDigest(img.Digest))
	return nil
}

func (b *builder) findImage(ctx context.Context, name string) (*api.Image, error) {
	imgs, err := b.c.Images(ctx)
	if err != nil {
		return nil, fmt.Errorf("list images: %w", err)
	}
	for i := range imgs {
		if imgs[i].Name == name {
			return &imgs[i], nil
		}
	}
	return nil, nil
}

// envGetter looks variables up for the lexer: ENV over ARG over the base's
// environment (over meta ARGs for FROM).
type envGetter map[string]string

func (e envGetter) Get(k string) (string, bool) { v, ok := e[k]; return v, ok }
func (e envGetter) Keys() []string              { return slices.Sorted(maps.Keys(e)) }

func (b *builder) vars() map[string]string {
	m := map[string]string{}
	for _, kv := range b.baseEnv {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	maps.Copy(m, b.st.Args)
	for _, kv := range b.st.Env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

func (b *builder) expand(word string, vars map[string]string) (string, error) {
	s, _, err := b.lex.ProcessWord(word, envGetter(vars))
	if err != nil {
		return "", parseErr("expand %q: %v", word, err)
	}
	return s, nil
}

// step runs one instruction.
func (b *builder) step(ctx context.Context, n, total int, cmd instructions.Command) error {
	text := cmdText(cmd)
	b.printf("Step %d/%d : %s\n", n, total, text)
	if ex, ok := cmd.(instructions.SupportsSingleWordExpansion); ok {
		vars := b.vars()
		if err := ex.Expand(func(w string) (string, error) { return b.expand(w, vars) }); err != nil {
			return parseErr("step %d (%s): %v", n, text, err)
		}
	}
	switch c := cmd.(type) {
	case *instructions.EnvCommand:
		for _, kv := range c.Env {
			b.st.Env = setEnv(b.st.Env, kv.Key, kv.Value)
		}
		return b.meta(text)
	case *instructions.ArgCommand:
		for _, kv := range c.Args {
			v, given := b.o.BuildArgs[kv.Key]
			switch {
			case given:
			case kv.Value != nil:
				v = *kv.Value
			default:
				// Without a value: an ARG before FROM's, else unset.
				mv, ok := b.metaArgs[kv.Key]
				if !ok {
					continue
				}
				v = mv
			}
			b.st.Args[kv.Key] = v
		}
		return b.meta(text)
	case *instructions.UserCommand:
		b.st.User = c.User
		return b.meta(text)
	case *instructions.ShellCommand:
		b.st.Shell = c.Shell
		return b.meta(text)
	case *instructions.CmdCommand:
		b.cfg.Cmd = b.cmdLine(c.ShellDependantCmdLine)
		return b.meta(text)
	case *instructions.EntrypointCommand:
		// As in Docker, the new ENTRYPOINT resets a CMD inherited from the
		// base (the server does that at commit), not one set here.
		b.cfg.Entrypoint = b.cmdLine(c.ShellDependantCmdLine)
		return b.meta(text)
	case *instructions.LabelCommand:
		if b.cfg.Labels == nil {
			b.cfg.Labels = map[string]string{}
		}
		for _, kv := range c.Labels {
			b.cfg.Labels[kv.Key] = kv.Value
		}
		return b.meta(text)
	case *instructions.ExposeCommand:
		b.cfg.ExposedPorts = append(b.cfg.ExposedPorts, c.Ports...)
		return b.meta(text)
	case *instructions.MaintainerCommand, *instructions.StopSignalCommand, *instructions.HealthCheckCommand,
		*instructions.VolumeCommand, *instructions.OnbuildCommand:
		b.printf(" ---> ignored: warren images do not use %s\n", strings.ToUpper(cmd.Name()))
		return nil
	case *instructions.WorkdirCommand:
		wd := c.Path
		if !path.IsAbs(wd) {
			wd = path.Join(orRoot(b.st.Workdir), wd)
		}
		b.st.Workdir = path.Clean(wd)
		return b.fsStep(ctx, n, text, "", func(ctx context.Context, id string) error {
			return b.mkdirs(ctx, id, b.st.Workdir)
		})
	case *instructions.RunCommand:
		return b.runStep(ctx, n, text, c)
	case *instructions.CopyCommand:
		return b.copyStep(ctx, n, text, c.SourcesAndDest, c.Chown, c.Chmod, false)
	case *instructions.AddCommand:
		unpack := c.Unpack == nil || *c.Unpack
		return b.copyStep(ctx, n, text, c.SourcesAndDest, c.Chown, c.Chmod, unpack)
	}
	return parseErr("step %d: %s is not supported", n, strings.ToUpper(cmd.Name()))
}

// validate refuses what the builder cannot do before any step runs.
func validate(stage *instructions.Stage) error {
	for i, cmd := range stage.Commands {
		n := i + 2
		switch c := cmd.(type) {
		case *instructions.RunCommand:
			if len(c.FlagsUsed) > 0 {
				return parseErr("step %d: RUN --%s is not supported", n, c.FlagsUsed[0])
			}
			if len(c.Files) > 0 {
				return parseErr("step %d: RUN with a here-document is not supported", n)
			}
		case *instructions.CopyCommand:
			if c.From != "" {
				return parseErr("step %d: COPY --from is not supported (multi-stage builds are not)", n)
			}
			if c.Parents || len(c.ExcludePatterns) > 0 {
				return parseErr("step %d: COPY --parents and --exclude are not supported", n)
			}
			if len(c.SourceContents) > 0 {
				return parseErr("step %d: COPY with a here-document is not supported", n)
			}
		case *instructions.AddCommand:
			if c.Checksum != "" || c.KeepGitDir != nil || len(c.ExcludePatterns) > 0 {
				return parseErr("step %d: ADD --checksum, --keep-git-dir and --exclude are not supported", n)
			}
			if len(c.SourceContents) > 0 {
				return parseErr("step %d: ADD with a here-document is not supported", n)
			}
		case *instructions.EnvCommand, *instructions.ArgCommand, *instructions.UserCommand, *instructions.ShellCommand,
			*instructions.CmdCommand, *instructions.EntrypointCommand, *instructions.LabelCommand, *instructions.ExposeCommand,
			*instructions.MaintainerCommand, *instructions.StopSignalCommand, *instructions.HealthCheckCommand,
			*instructions.VolumeCommand, *instructions.OnbuildCommand, *instructions.WorkdirCommand:
		default:
			return parseErr("step %d: %s is not supported", n, strings.ToUpper(cmd.Name()))
		}
	}
	return nil
}

// meta is a step that changes only the build state: it moves the chain key.
func (b *builder) meta(text string) error {
	b.key = b.nextKey(text, "")
	return nil
}

func orRoot(wd string) string {
	if wd == "" {
		return "/"
	}
	return wd
}

func setEnv(env []string, k, v string) []string {
	out := slices.DeleteFunc(slices.Clone(env), func(kv string) bool {
		key, _, _ := strings.Cut(kv, "=")
		return key == k
	})
	return append(out, k+"="+v)
}

// cmdLine is a CMD or ENTRYPOINT as the image records it.
func (b *builder) cmdLine(c instructions.ShellDependantCmdLine) []string {
	if c.PrependShell {
		return append(b.shell(), strings.Join(c.CmdLine, " "))
	}
	return c.CmdLine
}

func (b *builder) shell() []string {
	if len(b.st.Shell) > 0 {
		return slices.Clone(b.st.Shell)
	}
	return []string{"/bin/sh", "-c"}
}

// cmdText is an instruction as the Dockerfile spells it (continuations
// joined).
func cmdText(cmd instructions.Command) string {
	if s, ok := cmd.(fmt.Stringer); ok {
		return strings.TrimSpace(s.String())
	}
	return cmd.Name()
}

// nextKey is the cache key of a step after b.key.
func (b *builder) nextKey(text, content string) string {
	args := map[string]string{}
	maps.Copy(args, b.st.Args)
	j, _ := json.Marshal(struct {
		Parent  string `json:"parent"`
		Text    string `json:"text"`
		State   state  `json:"state"`
		Content string `json:"content,omitempty"`
	}{b.key, text, b.st, content})
	return digestOf(string(j))
}

func digestOf(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func shortDigest(d string) string {
	d = strings.TrimPrefix(d, "sha256:")
	if len(d) > 12 {
		d = d[:12]
	}
	return d
}

// fsStep runs a step that changes files: answered from the cache, or run
// in a fresh build sandbox whose changes become the step's layer.
func (b *builder) fsStep(ctx context.Context, n int, text, content string, do func(ctx context.Context, id string) error) error {
	key := b.nextKey(text, content)
	name := LayerPrefix + key
	if !b.o.NoCache {
		l, err := b.c.Layer(ctx, name)
		if err == nil && l.Project != "" {
			// Only a root token's layers are trusted: anyone may name a
			// layer build/<key>, and keys can be predicted.
			b.printf(" ---> the cached layer belongs to project %s: not used\n", l.Project)
		} else if err == nil {
			b.key = key
			b.use(l)
			b.res.Cached++
			b.printf(" ---> CACHED %s\n", shortDigest(l.Digest))
			return nil
		}
		if err != nil && !warren.IsNotFound(err) {
			return fmt.Errorf("step %d: cache lookup: %w", n, err)
		}
	}
	t0 := time.Now()
	sb, err := b.sandbox(ctx)
	if err != nil {
		return fmt.Errorf("step %d: %w", n, err)
	}
	b.printf(" ---> running in %s\n", sb.ID)
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_, _ = b.c.Delete(dctx, sb.ID)
	}()
	if err := do(ctx, sb.ID); err != nil {
		return err
	}
	t1 := time.Now()
	b.printf(" ---> packing the changes\n")
	stop := b.ticking("packing")
	l, err := b.c.CreateLayerFromSandbox(ctx, sb.ID, name, 1)
	if warren.IsConflict(err) {
		// --no-cache, or a step whose result is not reproducible: the
		// cache entry gets a new version.
		l, err = b.c.CreateLayerFromSandbox(ctx, sb.ID, name, 0)
	}
	stop()
	if err != nil {
		return fmt.Errorf("step %d: pack the changes: %w", n, err)
	}
	if l.Project != "" {
		return fmt.Errorf("step %d: building images needs a root token (the image catalog is shared by every project; this token's layers belong to project %s)", n, l.Project)
	}
	b.key = key
	b.use(l)
	b.res.Built++
	b.printf(" ---> %s (%d entries, %s; ran %.1fs, packed %.1fs)\n", shortDigest(l.Digest), l.Entries, humanBytes(l.Size),
		t1.Sub(t0).Seconds(), time.Since(t1).Seconds())
	return nil
}

// use stacks a step's layer (one that changed nothing adds no layer).
func (b *builder) use(l *api.Layer) {
	if l.Entries == 0 {
		return
	}
	b.chain = append(b.chain, fmt.Sprintf("%s@%d", l.Name, l.Version))
}

// sandbox starts a build sandbox: the base image with the steps so far.
func (b *builder) sandbox(ctx context.Context) (*api.Sandbox, error) {
	if b.base == nil {
		return nil, errors.New("FROM scratch: only metadata instructions can follow (no shell to run in)")
	}
	req := api.CreateSandboxRequest{Image: b.base.Name, CPU: b.o.CPU, MemoryMB: b.o.MemoryMB, DiskMB: b.o.DiskMB,
		TTL: int64(b.o.Timeout) + 600, Labels: map[string]string{"warren.build": sanitizeLabel(b.o.Tag)}, User: rootUser}
	if req.DiskMB == 0 {
		req.DiskMB = 8192
	}
	if req.MemoryMB == 0 {
		req.MemoryMB = 2048
	}
	for _, ref := range b.chain {
		req.Layers = append(req.Layers, api.LayerAttachment{Layer: ref})
	}
	sb, err := b.c.Create(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("create a build sandbox: %w", err)
	}
	return sb, nil
}

func sanitizeLabel(s string) string {
	var sb strings.Builder
	for _, r := range s {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-' || r == '_' {
			sb.WriteRune(r)
		} else {
			sb.WriteByte('_')
		}
	}
	return sb.String()
}

// mkdirs makes dir (and its parents) as root, through the agent's file
// operations: the image need not have a mkdir.
func (b *builder) mkdirs(ctx context.Context, id, dir string) error {
	if _, err := b.c.Mkdir(ctx, id, api.MkdirRequest{Path: dir, Parents: true, Mode: 0o755}); err != nil {
		return fmt.Errorf("mkdir %s: %w", dir, err)
	}
	return nil
}

// runStep is RUN: the command in a build sandbox, its output streamed.
func (b *builder) runStep(ctx context.Context, n int, text string, c *instructions.RunCommand) error {
	req := api.ExecRequest{Cwd: orRoot(b.st.Workdir), User: b.st.User, Timeout: b.o.Timeout, Env: map[string]string{}}
	// ARG values are in RUN's environment, ENV over them (and both over
	// the base image's, which the sandbox has).
	maps.Copy(req.Env, b.st.Args)
	for _, kv := range b.st.Env {
		k, v, _ := strings.Cut(kv, "=")
		req.Env[k] = v
	}
	shown := strings.Join(c.CmdLine, " ")
	if c.PrependShell {
		if len(b.st.Shell) > 0 {
			req.Argv = append(b.shell(), shown)
		} else {
			req.Cmd = shown
		}
	} else {
		req.Argv = c.CmdLine
		shown = strings.Join(c.CmdLine, " ")
	}
	if req.User == "" {
		req.User = rootUser
	}
	return b.fsStep(ctx, n, text, "", func(ctx context.Context, id string) error {
		if b.st.Workdir != "" {
			if err := b.mkdirs(ctx, id, b.st.Workdir); err != nil {
				return err
			}
		}
		tail := &tailWriter{max: 4096}
		w := io.MultiWriter(b.out, tail)
		res, err := b.c.ExecStream(ctx, id, req, w, w)
		if err != nil {
			return fmt.Errorf("step %d: run: %w", n, err)
		}
		if res.ExitCode != 0 || res.TimedOut {
			code := res.ExitCode
			if res.TimedOut {
				b.printf(" ---> timed out after %.0fs\n", b.o.Timeout)
			}
			return &StepError{Step: n, Cmd: shown, ExitCode: code, Output: tail.String()}
		}
		return nil
	})
}

// tickEvery is how often a long server-side step reports that it goes on.
var tickEvery = 5 * time.Second

// ticking prints " ---> still <what> (Ns)" every tickEvery until stop is
// called (which waits for the reporter to end).
func (b *builder) ticking(what string) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	t0 := time.Now()
	go func() {
		defer wg.Done()
		t := time.NewTicker(tickEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				b.printf(" ---> still %s (%.0fs)\n", what, time.Since(t0).Seconds())
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(done); wg.Wait() }) }
}

// tailWriter keeps the last max bytes written.
type tailWriter struct {
	max int
	buf []byte
}

func (t *tailWriter) Write(p []byte) (int, error) {
	t.buf = append(t.buf, p...)
	if len(t.buf) > t.max {
		t.buf = t.buf[len(t.buf)-t.max:]
	}
	return len(p), nil
}

func (t *tailWriter) String() string { return string(t.buf) }

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
