package vm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"net"
	"os"
	"path/filepath"
	"strconv"

	"github.com/digitalocean/go-qemu/qmp/raw"

	"github.com/warrenhq/warren/internal/runtime"
	"github.com/warrenhq/warren/internal/runtime/microvm"
)

// Tier is the tier's name.
const Tier = "vm"

// VNCName is the VNC server's socket in a sandbox's StateDir.
const VNCName = "vnc.sock"

// screenName is the screendump's file in the StateDir (removed at once).
const screenName = "screen.ppm"

// Runtime is the "vm" tier.
type Runtime struct {
	*microvm.Runtime
}

var (
	_ runtime.Runtime = (*Runtime)(nil)
	_ runtime.Display = (*Runtime)(nil)
)

// New makes the tier: cfg as for the microvm tier (its CgroupParent must
// differ from the microvm tier's).
func New(cfg microvm.Config) (*Runtime, error) {
	cfg.Machine, cfg.TierName, cfg.Extra = microvm.MachineQ35, Tier, extra
	rt, err := microvm.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("vm: %w", err)
	}
	return &Runtime{rt}, nil
}

// extra is a display's QEMU arguments and kernel parameters.
func extra(spec *runtime.Spec) (args, params []string) {
	if !spec.Display {
		return nil, nil
	}
	return []string{
		"-vga", "std",
		"-device", "qemu-xhci", "-device", "usb-tablet",
		"-vnc", "unix:" + filepath.Join(spec.StateDir, VNCName),
	}, []string{"console=tty0"}
}

// Destroy destroys the VM and removes its screen's socket.
func (r *Runtime) Destroy(ctx context.Context, h runtime.Handle) error {
	if err := r.Runtime.Destroy(ctx, h); err != nil {
		return err
	}
	if h.Socket != "" {
		dir := filepath.Dir(h.Socket)
		for _, n := range []string{VNCName, screenName} {
			if err := os.Remove(filepath.Join(dir, n)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("vm: destroy: %w", err)
			}
		}
	}
	return nil
}

// vncPath is h's VNC socket, ErrNoDisplay when it has none.
func vncPath(h runtime.Handle) (string, error) {
	if h.Socket == "" {
		return "", runtime.ErrNoDisplay
	}
	p := filepath.Join(filepath.Dir(h.Socket), VNCName)
	if _, err := os.Stat(p); err != nil {
		return "", runtime.ErrNoDisplay
	}
	return p, nil
}

// DialDisplay connects to h's VNC server.
func (r *Runtime) DialDisplay(ctx context.Context, h runtime.Handle) (net.Conn, error) {
	p, err := vncPath(h)
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", p)
	if err != nil {
		return nil, fmt.Errorf("vm: display: %w", err)
	}
	return c, nil
}

// Screenshot is h's screen as a PNG.
func (r *Runtime) Screenshot(ctx context.Context, h runtime.Handle) ([]byte, error) {
	img, err := r.dump(h)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	if err := png.Encode(&out, img); err != nil {
		return nil, fmt.Errorf("vm: png: %w", err)
	}
	return out.Bytes(), nil
}

// dump is h's screen (QMP screendump, a PPM file in the state directory).
func (r *Runtime) dump(h runtime.Handle) (image.Image, error) {
	if _, err := vncPath(h); err != nil {
		return nil, err
	}
	// QEMU (chrooted, unprivileged) writes the dump to a file opened
	// here and passed to it.
	p := filepath.Join(filepath.Dir(h.Socket), screenName)
	defer os.Remove(p)
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("vm: screendump: %w", err)
	}
	err = r.QMPFile(h, f, func(m *raw.Monitor, path string) error { return m.Screendump(path) })
	f.Close()
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("vm: screendump: %w", err)
	}
	return decodePPM(b)
}

// decodePPM decodes a binary PPM (P6, maxval 255): what QEMU's
// screendump writes.
func decodePPM(b []byte) (image.Image, error) {
	var fields [4]int
	rest := b
	for i := 0; i < 4; i++ {
		rest = skipSpace(rest)
		j := 0
		for j < len(rest) && rest[j] > ' ' {
			j++
		}
		tok := string(rest[:j])
		rest = rest[j:]
		if i == 0 {
			if tok != "P6" {
				return nil, fmt.Errorf("vm: screendump: not a binary PPM (%q)", tok)
			}
			continue
		}
		n, err := strconv.Atoi(tok)
		if err != nil || n <= 0 || n > 1<<14 {
			return nil, fmt.Errorf("vm: screendump: bad PPM header field %q", tok)
		}
		fields[i] = n
	}
	w, h, maxv := fields[1], fields[2], fields[3]
	if maxv != 255 || len(rest) < 1 {
		return nil, fmt.Errorf("vm: screendump: PPM maxval %d", maxv)
	}
	rest = rest[1:] // the one whitespace byte after the header
	if len(rest) < w*h*3 {
		return nil, fmt.Errorf("vm: screendump: PPM of %dx%d has %d bytes of pixels", w, h, len(rest))
	}
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for i := 0; i < w*h; i++ {
		img.Set(i%w, i/w, color.RGBA{rest[3*i], rest[3*i+1], rest[3*i+2], 255})
	}
	return img, nil
}

func skipSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] <= ' ' || b[0] == '#') {
		if b[0] == '#' {
			for len(b) > 0 && b[0] != '\n' {
				b = b[1:]
			}
			continue
		}
		b = b[1:]
	}
	return b
}
