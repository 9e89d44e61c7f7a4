package microvm

import (
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// Kernel is a guest kernel directory (scripts/vm-kernel.sh makes one):
// vmlinux, modules/ with modules.order, version.
type Kernel struct {
	Dir     string
	Version string // the "version" file's first line, else the directory's name
}

// OpenKernel checks dir (symlinks resolved) holds a kernel.
func OpenKernel(dir string) (Kernel, error) {
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return Kernel{}, fmt.Errorf("microvm: kernel %s: %w", dir, err)
	}
	if fi, err := os.Stat(filepath.Join(real, "vmlinux")); err != nil || fi.Size() == 0 {
		return Kernel{}, fmt.Errorf("microvm: no vmlinux in %s (make vm-kernel, or bring your own: docs/operations.md)", dir)
	}
	k := Kernel{Dir: real, Version: filepath.Base(real)}
	if b, err := os.ReadFile(filepath.Join(real, "version")); err == nil {
		if v := strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]); v != "" {
			k.Version = v
		}
	}
	return k, nil
}

// Vmlinux is the kernel image.
func (k Kernel) Vmlinux() string { return filepath.Join(k.Dir, "vmlinux") }

// modules lists the kernel's modules in load order (none: all built in).
func (k Kernel) modules() ([]string, error) {
	b, err := os.ReadFile(filepath.Join(k.Dir, "modules", "modules.order"))
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return strings.Fields(string(b)), nil
}

// BuildInitramfs writes (once per content) the initramfs of kernel k with
// the agent at agentPath as /init into cacheDir and returns its path. The
// name is the hash of its inputs, so a new agent or kernel makes a new file
// and an unchanged one is reused.
func BuildInitramfs(k Kernel, agentPath, cacheDir string) (string, error) {
	if err := checkStatic(agentPath); err != nil {
		return "", err
	}
	mods, err := k.modules()
	if err != nil {
		return "", fmt.Errorf("microvm: modules: %w", err)
	}
	files := []cpioFile{{name: "init", src: agentPath, mode: 0o100755}}
	if len(mods) > 0 {
		files = append(files, cpioFile{name: "modules/modules.order", data: []byte(strings.Join(mods, "\n") + "\n"), mode: 0o100644})
	}
	for _, m := range mods {
		files = append(files, cpioFile{name: "modules/" + m, src: filepath.Join(k.Dir, "modules", m), mode: 0o100644, module: true})
	}
	h := sha256.New()
	for i := range files {
		if files[i].data == nil {
			if files[i].data, err = os.ReadFile(files[i].src); err != nil {
				return "", fmt.Errorf("microvm: initramfs: %w", err)
			}
			if files[i].module {
				files[i].data = stripModuleSignature(files[i].data)
			}
		}
		fmt.Fprintf(h, "%s\x00%d\x00", files[i].name, len(files[i].data))
		h.Write(files[i].data)
	}
	out := filepath.Join(cacheDir, "initramfs-"+hex.EncodeToString(h.Sum(nil))[:16]+".cpio")
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", err
	}
	var buf bytes.Buffer
	w := &cpioWriter{w: &buf}
	for _, d := range []string{"dev", "proc", "sys", "modules"} {
		w.entry(d, 0o040755, 0, 0, nil)
	}
	w.entry("dev/console", 0o020600, 5, 1, nil) // the kernel opens it for init's stdio
	for _, f := range files {
		w.entry(f.name, f.mode, 0, 0, f.data)
	}
	w.entry("TRAILER!!!", 0, 0, 0, nil)
	if w.err != nil {
		return "", w.err
	}
	tmp, err := os.CreateTemp(cacheDir, ".initramfs-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(buf.Bytes()); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		return "", err
	}
	return out, nil
}

type cpioFile struct {
	name   string
	src    string
	data   []byte
	mode   uint32
	module bool
}

// moduleSigMagic ends a signed kernel module.
const moduleSigMagic = "~Module signature appended~\n"

// stripModuleSignature removes a module's appended signature: checking it
// costs ~0.4 s of a TCG guest's boot, and the modules come from the kernel
// package the host trusts (the guest's kernel does not require signatures
// unless built with CONFIG_MODULE_SIG_FORCE; Debian's is not).
func stripModuleSignature(b []byte) []byte {
	// The signature, then struct module_signature (12 bytes, its last 4
	// the signature's length, big-endian), then the magic.
	if !bytes.HasSuffix(b, []byte(moduleSigMagic)) || len(b) < len(moduleSigMagic)+12 {
		return b
	}
	info := b[len(b)-len(moduleSigMagic)-12 : len(b)-len(moduleSigMagic)]
	sigLen := int(info[8])<<24 | int(info[9])<<16 | int(info[10])<<8 | int(info[11])
	end := len(b) - len(moduleSigMagic) - 12 - sigLen
	if end <= 0 {
		return b
	}
	return b[:end]
}

// cpioWriter writes the "newc" format the kernel unpacks.
type cpioWriter struct {
	w   io.Writer
	ino uint32
	err error
}

func (c *cpioWriter) entry(name string, mode, rdevMajor, rdevMinor uint32, data []byte) {
	if c.err != nil {
		return
	}
	c.ino++
	nlink := uint32(1)
	if mode&0o170000 == 0o040000 {
		nlink = 2
	}
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, nlink, 0, len(data), 0, 0, rdevMajor, rdevMinor, len(name)+1, 0)
	var b bytes.Buffer
	b.WriteString(hdr)
	b.WriteString(name)
	b.WriteByte(0)
	pad(&b, b.Len())
	b.Write(data)
	pad(&b, len(data))
	_, c.err = c.w.Write(b.Bytes())
}

// pad aligns to 4 bytes (the header is 110 bytes, so name padding counts
// from the entry's start; data padding from the data's).
func pad(b *bytes.Buffer, n int) {
	for n%4 != 0 {
		b.WriteByte(0)
		n++
	}
}

// checkStatic refuses an agent that needs a dynamic loader: the initramfs
// has none, and the kernel would only say "No working init found".
func checkStatic(p string) error {
	f, err := elf.Open(p)
	if err != nil {
		return fmt.Errorf("microvm: agent %s: %w", p, err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return fmt.Errorf("microvm: agent %s is dynamically linked; build it with CGO_ENABLED=0 (it is the VM's /init)", p)
		}
	}
	return nil
}
