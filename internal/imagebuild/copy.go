package imagebuild

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/bzip2"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"

	"github.com/warrenhq/warren/api"
)

// copyPlan is what one COPY or ADD puts where.
type copyPlan struct {
	dir      string      // the directory inside the image the entries go to
	entries  []copyEntry // files, bottom-up order of a walk
	archives []string    // ADD: local archives extracted into dir
	tops     []string    // top-level names under dir (for --chown)
	mode     int64       // --chmod, or -1
	ctxDir   string
	ignore   *patternmatcher.PatternMatcher // .dockerignore
	// single is set for one file copied to a path without a trailing
	// slash: if that path is a directory in the image, the file goes into
	// it under its own name (srcName), as in Docker.
	single, srcName string
}

type copyEntry struct {
	src  string // host path
	name string // path relative to plan.dir
	info fs.FileInfo
	link string
}

// copyStep is COPY and ADD (unpack: local tar archives are extracted).
func (b *builder) copyStep(ctx context.Context, n int, text string, sd instructions.SourcesAndDest, chown, chmod string, unpack bool) error {
	op := "COPY"
	if unpack {
		op = "ADD"
	}
	if len(sd.SourceContents) > 0 {
		return parseErr("step %d: %s with a here-document is not supported", n, op)
	}
	plan, err := b.planCopy(op, sd, chmod, unpack)
	if err != nil {
		return fmt.Errorf("step %d: %w", n, err)
	}
	digest, err := plan.digest(chown)
	if err != nil {
		return fmt.Errorf("step %d: %w", n, err)
	}
	return b.fsStep(ctx, n, text, digest, func(ctx context.Context, id string) error {
		return b.doCopy(ctx, id, plan, chown)
	})
}

// ignore is the context's .dockerignore (nil: none), read once.
func (b *builder) ignore(ctxDir string) (*patternmatcher.PatternMatcher, error) {
	if b.ignoreRead {
		return b.ignored, nil
	}
	b.ignoreRead = true
	f, err := os.Open(filepath.Join(ctxDir, ".dockerignore"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	patterns, err := ignorefile.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf(".dockerignore: %w", err)
	}
	if len(patterns) == 0 {
		return nil, nil
	}
	if b.ignored, err = patternmatcher.New(patterns); err != nil {
		return nil, fmt.Errorf(".dockerignore: %w", err)
	}
	return b.ignored, nil
}

// excluded reports whether the context path rel ("a/b") is in .dockerignore.
func excluded(pm *patternmatcher.PatternMatcher, rel string) bool {
	if pm == nil {
		return false
	}
	m, err := pm.MatchesOrParentMatches(filepath.ToSlash(rel))
	return err == nil && m
}

func isURL(s string) bool {
	return strings.Contains(s, "://") || strings.HasPrefix(s, "git@")
}

// planCopy resolves the sources in the build context and the destination.
func (b *builder) planCopy(op string, sd instructions.SourcesAndDest, chmod string, unpack bool) (*copyPlan, error) {
	if b.o.Context == "" {
		return nil, fmt.Errorf("%s needs a build context", op)
	}
	ctxDir, err := filepath.Abs(b.o.Context)
	if err != nil {
		return nil, err
	}
	pm, err := b.ignore(ctxDir)
	if err != nil {
		return nil, err
	}
	plan := &copyPlan{mode: -1, ctxDir: ctxDir, ignore: pm}
	if chmod != "" {
		m, err := strconv.ParseUint(chmod, 8, 32)
		if err != nil || m > 0o7777 {
			return nil, fmt.Errorf("%s --chmod=%s: only octal modes are supported", op, chmod)
		}
		plan.mode = int64(m)
	}
	var srcs []copySource
	for _, s := range sd.SourcePaths {
		found, err := copySources(op, s, ctxDir, pm)
		if err != nil {
			return nil, err
		}
		srcs = append(srcs, found...)
	}
	dest := sd.DestPath
	if dest == "" {
		return nil, fmt.Errorf("%s: no destination", op)
	}
	destDir := strings.HasSuffix(dest, "/") || dest == "." || len(srcs) > 1
	if !path.IsAbs(dest) {
		dest = path.Join(orRoot(b.st.Workdir), dest)
	}
	dest = path.Clean(dest)
	for _, s := range srcs {
		if s.info.IsDir() {
			destDir = true
		}
	}
	if len(srcs) > 1 && !strings.HasSuffix(sd.DestPath, "/") {
		return nil, fmt.Errorf("%s with several sources: the destination %s must end with /", op, sd.DestPath)
	}
	plan.dir = dest
	single := ""
	if !destDir {
		plan.dir, single = path.Dir(dest), path.Base(dest)
	}
	if err := plan.addSources(op, srcs, dest, single, unpack); err != nil {
		return nil, err
	}
	return plan, nil
}

// copySource is one source of a COPY or ADD found in the build context.
type copySource struct {
	path string
	info fs.FileInfo
}

// copySources finds what the source s (a path or glob pattern in the build
// context ctxDir, not a URL) names, in order, leaving out what
// .dockerignore (pm) excludes. A source that is itself a symlink is
// followed, and must lead to something inside the context.
func copySources(op, s, ctxDir string, pm *patternmatcher.PatternMatcher) ([]copySource, error) {
	if isURL(s) {
		if op == "ADD" {
			return nil, fmt.Errorf("ADD %s: remote URLs are not supported (a build reaches no network): download the file into the build context and ADD or COPY it from there", s)
		}
		return nil, fmt.Errorf("COPY %s: not a path in the build context", s)
	}
	rel := strings.TrimPrefix(path.Clean("/"+filepath.ToSlash(s)), "/")
	pattern := filepath.Join(ctxDir, filepath.FromSlash(rel))
	matches, err := filepath.Glob(pattern)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", op, s, err)
	}
	matches = slices.DeleteFunc(matches, func(m string) bool {
		r, err := filepath.Rel(ctxDir, m)
		return err != nil || (r != "." && excluded(pm, r))
	})
	if len(matches) == 0 {
		return nil, fmt.Errorf("%s %s: no such file or directory in the build context %s (or excluded by .dockerignore)", op, s, ctxDir)
	}
	sort.Strings(matches)
	var srcs []copySource
	for _, m := range matches {
		fi, err := os.Lstat(m)
		if err != nil {
			return nil, err
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			// The source itself: follow it, inside the context only.
			real, err := filepath.EvalSymlinks(m)
			if err != nil {
				return nil, fmt.Errorf("%s %s: %w", op, s, err)
			}
			if r, err := filepath.Rel(ctxDir, real); err != nil || r == ".." || strings.HasPrefix(r, "../") {
				return nil, fmt.Errorf("%s %s: the symlink leads out of the build context", op, s)
			}
			if fi, err = os.Stat(real); err != nil {
				return nil, err
			}
			m = real
		}
		srcs = append(srcs, copySource{m, fi})
	}
	return srcs, nil
}

// addSources adds srcs to the plan: a directory's contents, (ADD, unpack
// set) a local archive to extract, or a regular file. dest is the cleaned
// destination; single, when set, is the name one file gets in p.dir.
func (p *copyPlan) addSources(op string, srcs []copySource, dest, single string, unpack bool) error {
	for _, s := range srcs {
		switch {
		case s.info.IsDir():
			if err := p.addDir(s.path); err != nil {
				return err
			}
		case unpack && isArchive(s.path):
			if single != "" {
				p.dir = dest // ADD a.tar /x: extracted into /x
			}
			p.archives = append(p.archives, s.path)
		case s.info.Mode().IsRegular():
			name := s.info.Name()
			if single != "" {
				name = single
				p.single, p.srcName = single, s.info.Name()
			}
			p.entries = append(p.entries, copyEntry{src: s.path, name: name, info: s.info})
			p.tops = append(p.tops, name)
		default:
			return fmt.Errorf("%s %s: not a regular file or directory", op, s.path)
		}
	}
	return nil
}

// addDir adds the contents of dir (not dir itself).
func (p *copyPlan) addDir(dir string) error {
	return filepath.WalkDir(dir, func(q string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, q)
		if err != nil || rel == "." {
			return err
		}
		if inCtx, err := filepath.Rel(p.ctxDir, q); err == nil && excluded(p.ignore, inCtx) {
			if d.IsDir() && !p.ignore.Exclusions() {
				return filepath.SkipDir
			}
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		e := copyEntry{src: q, name: filepath.ToSlash(rel), info: fi}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			if e.link, err = os.Readlink(q); err != nil {
				return err
			}
		case fi.IsDir(), fi.Mode().IsRegular():
		default:
			return nil // sockets, devices, fifos: not copied
		}
		p.entries = append(p.entries, e)
		if !strings.Contains(e.name, "/") {
			p.tops = append(p.tops, e.name)
		}
		return nil
	})
}

// digest is the content digest of the copied files: names, types, modes,
// link targets and contents (not times or owners, which COPY resets).
func (p *copyPlan) digest(chown string) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "dir %s\nchown %s\nmode %o\n", p.dir, chown, p.mode)
	for _, e := range p.entries {
		fmt.Fprintf(h, "%s\x00%o\x00%s\x00", e.name, uint32(e.info.Mode()), e.link)
		if e.info.Mode().IsRegular() {
			if err := hashFile(h, e.src); err != nil {
				return "", err
			}
		}
		h.Write([]byte{'\n'})
	}
	for _, a := range p.archives {
		fmt.Fprintf(h, "archive %s\x00", filepath.Base(a))
		if err := hashFile(h, a); err != nil {
			return "", err
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func hashFile(h hash.Hash, p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(h, f)
	return err
}

// writeTar streams the plan's entries as a tar (owners root).
func (p *copyPlan) writeTar(w io.Writer) error {
	tw := tar.NewWriter(w)
	for _, e := range p.entries {
		hdr, err := tar.FileInfoHeader(e.info, e.link)
		if err != nil {
			return err
		}
		hdr.Name = e.name
		if e.info.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
		if p.mode >= 0 && hdr.Typeflag != tar.TypeSymlink {
			hdr.Mode = p.mode
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if e.info.Mode().IsRegular() {
			f, err := os.Open(e.src)
			if err != nil {
				return err
			}
			_, err = io.CopyN(tw, f, hdr.Size)
			f.Close()
			if err != nil {
				return fmt.Errorf("%s changed while it was copied: %w", e.src, err)
			}
		}
	}
	return tw.Close()
}

// doCopy puts the plan's files into the build sandbox.
func (b *builder) doCopy(ctx context.Context, id string, p *copyPlan, chown string) error {
	if p.single != "" && len(p.entries) == 1 {
		target := path.Join(p.dir, p.single)
		if fi, err := b.c.Stat(ctx, id, target); err == nil && fi.Type == "dir" {
			q := *p
			q.dir = target
			q.entries = []copyEntry{p.entries[0]}
			q.entries[0].name = p.srcName
			q.tops = []string{p.srcName}
			p = &q
		}
	}
	if len(p.entries) > 0 {
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(p.writeTar(pw)) }()
		_, err := b.c.UploadArchive(ctx, id, p.dir, pr)
		pr.Close()
		if err != nil {
			return fmt.Errorf("copy into %s: %w", p.dir, err)
		}
	} else if err := b.mkdirs(ctx, id, p.dir); err != nil {
		return err
	}
	for _, a := range p.archives {
		r, closeFn, err := openArchive(a)
		if err != nil {
			return err
		}
		_, err = b.c.UploadArchive(ctx, id, p.dir, r)
		closeFn()
		if err != nil {
			return fmt.Errorf("extract %s into %s: %w", filepath.Base(a), p.dir, err)
		}
	}
	if chown != "" && len(p.tops) > 0 {
		argv := []string{"chown", "-R", "-h", "--", chown}
		for _, t := range p.tops {
			argv = append(argv, path.Join(p.dir, t))
		}
		res, err := b.c.Exec(ctx, id, api.ExecRequest{Argv: argv, User: rootUser, Cwd: "/"})
		if err != nil {
			return fmt.Errorf("--chown=%s: %w", chown, err)
		}
		if res.ExitCode != 0 {
			return fmt.Errorf("--chown=%s: exit %d: %s", chown, res.ExitCode, strings.TrimSpace(res.Stderr))
		}
	}
	return nil
}

var (
	magicGzip  = []byte{0x1f, 0x8b}
	magicBzip2 = []byte("BZh")
	magicXz    = []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}
)

// isArchive reports whether p is a tar archive ADD extracts (plain, gzip,
// bzip2 or xz; xz is then refused by openArchive with a clear error).
func isArchive(p string) bool {
	f, err := os.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	head := make([]byte, 6)
	n, _ := io.ReadFull(f, head)
	head = head[:n]
	if bytes.HasPrefix(head, magicXz) {
		return true
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return false
	}
	r, closeFn, err := decompress(f, head)
	if err != nil {
		return false
	}
	defer closeFn()
	block := make([]byte, 512)
	if _, err := io.ReadFull(r, block); err != nil {
		return false
	}
	return string(block[257:262]) == "ustar" || tarChecksumOK(block)
}

// tarChecksumOK checks a v7 tar header's checksum.
func tarChecksumOK(b []byte) bool {
	want, err := strconv.ParseUint(strings.TrimRight(strings.TrimSpace(string(b[148:156])), "\x00 "), 8, 32)
	if err != nil {
		return false
	}
	var sum uint64
	for i, c := range b {
		if i >= 148 && i < 156 {
			c = ' '
		}
		sum += uint64(c)
	}
	return sum == want
}

func decompress(r io.Reader, head []byte) (io.Reader, func(), error) {
	switch {
	case bytes.HasPrefix(head, magicGzip):
		z, err := gzip.NewReader(r)
		if err != nil {
			return nil, nil, err
		}
		return z, func() { z.Close() }, nil
	case bytes.HasPrefix(head, magicBzip2):
		return bzip2.NewReader(bufio.NewReader(r)), func() {}, nil
	}
	return r, func() {}, nil
}

// openArchive opens a local archive for extraction, decompressed.
func openArchive(p string) (io.Reader, func(), error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, nil, err
	}
	head := make([]byte, 6)
	n, _ := io.ReadFull(f, head)
	head = head[:n]
	if bytes.HasPrefix(head, magicXz) {
		f.Close()
		return nil, nil, errors.New("ADD " + filepath.Base(p) + ": xz-compressed archives are not supported (use gzip or bzip2, or a plain tar)")
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		f.Close()
		return nil, nil, err
	}
	r, closeFn, err := decompress(f, head)
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("ADD %s: %w", filepath.Base(p), err)
	}
	return r, func() { closeFn(); f.Close() }, nil
}
