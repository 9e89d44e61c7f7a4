package image

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strings"
	"time"
)

// BusyboxImage is the name of the image EnsureBusybox builds.
const BusyboxImage = "busybox"

var busyboxConfig = Config{
	Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
	Cmd: []string{"/bin/sh"},
}

// EnsureBusybox builds the image "busybox" from the static busybox at
// s.BusyboxPath (Debian's busybox-static) unless the store has it. The
// root holds /bin/busybox, a symlink in /bin for every applet, /etc/passwd,
// /etc/group, /etc/hostname, an empty /etc/resolv.conf, /tmp (1777), /root,
// /home, /proc, /sys and /dev. All times are zero, so the same busybox
// always gives the same digest.
func (s *LocalStore) EnsureBusybox(ctx context.Context) (*Image, error) {
	img, _, err := s.Resolve(ctx, BusyboxImage)
	if err == nil {
		return img, nil
	}
	if !errors.Is(err, ErrNotFound) {
		return nil, err
	}
	layer, err := busyboxLayer(ctx, s.BusyboxPath)
	if err != nil {
		return nil, err
	}
	src := layerSource{open: func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layer)), nil }}
	return s.importLayers(ctx, BusyboxImage, busyboxConfig, []layerSource{src})
}

func busyboxLayer(ctx context.Context, bin string) ([]byte, error) {
	exe, err := os.ReadFile(bin)
	if err != nil {
		return nil, fmt.Errorf("image: busybox: %w (install busybox-static)", err)
	}
	out, err := exec.CommandContext(ctx, bin, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("image: busybox --list: %w", err)
	}
	applets := strings.Fields(string(out))
	sort.Strings(applets)

	var buf bytes.Buffer
	buf.Grow(len(exe) + 256<<10)
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	add := func(h *tar.Header, body []byte) {
		h.ModTime, h.Format = epoch, tar.FormatPAX
		h.Size = int64(len(body))
		if err == nil {
			err = tw.WriteHeader(h)
		}
		if err == nil && len(body) > 0 {
			_, err = tw.Write(body)
		}
	}
	dir := func(n string, mode int64) { add(&tar.Header{Typeflag: tar.TypeDir, Name: n, Mode: mode}, nil) }
	file := func(n string, mode int64, body string) {
		add(&tar.Header{Typeflag: tar.TypeReg, Name: n, Mode: mode}, []byte(body))
	}
	link := func(n, target string) {
		add(&tar.Header{Typeflag: tar.TypeSymlink, Name: n, Linkname: target, Mode: 0o777}, nil)
	}

	dir("./", 0o755)
	dir("bin/", 0o755)
	add(&tar.Header{Typeflag: tar.TypeReg, Name: "bin/busybox", Mode: 0o755}, exe)
	for _, a := range applets {
		if a == "busybox" || strings.ContainsAny(a, "/\x00") || a == "." || a == ".." {
			continue
		}
		link("bin/"+a, "busybox")
	}
	dir("dev/", 0o755)
	dir("etc/", 0o755)
	file("etc/group", 0o644, "root:x:0:\nnogroup:x:65534:\n")
	file("etc/hostname", 0o644, "sandbox\n")
	file("etc/passwd", 0o644, "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")
	file("etc/resolv.conf", 0o644, "")
	dir("home/", 0o755)
	dir("proc/", 0o555)
	dir("root/", 0o700)
	link("sbin", "bin")
	dir("sys/", 0o555)
	dir("tmp/", 0o1777)
	dir("usr/", 0o755)
	link("usr/bin", "../bin")
	link("usr/sbin", "../bin")
	if err == nil {
		err = tw.Close()
	}
	if err != nil {
		return nil, fmt.Errorf("image: busybox layer: %w", err)
	}
	return buf.Bytes(), nil
}
