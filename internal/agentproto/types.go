package agentproto

import "time"

// KeepFDsEnv is the agent's environment variable "N": the N descriptors
// after the listener (fd 3) are the edge's (the trust split's cgroup files,
// CgroupFDEnv, then the mounts it made for setup in a user namespace:
// SetupConfig.RootFD, Bind.FD), kept, close-on-exec; the agent closes every
// other inherited one. (Not an argument: the sandbox reads PID 1's command
// line.)
const KeepFDsEnv = "WARREN_AGENT_KEEP_FDS"

// SetupConfig tells a freshly started agent how to build its sandbox. The
// agent receives it while still privileged and in the host's root; it is
// already in its cgroups and its new namespaces (pid, mount, uts, ipc, net).
type SetupConfig struct {
	// RootDir is an empty host directory; the agent mounts the sandbox root
	// there (inside its own mount namespace) and pivots into it.
	RootDir string `json:"root_dir"`
	// Lowers are read-only layer directories, top-most first (overlay order).
	Lowers []string `json:"lowers"`
	// Upper and Work are the overlay's private writable dir and work dir.
	Upper string `json:"upper"`
	Work  string `json:"work"`
	// Binds are read-only layer directories attached at paths of the root.
	Binds []Bind `json:"binds,omitempty"`
	// RootFD, when > 0, is an inherited descriptor of a detached mount the
	// edge made of the root (user namespaces: the edge idmaps the layers,
	// see confine.MountRoot); Lowers, Upper and Work are then not used.
	RootFD int `json:"root_fd,omitempty"`
	// Hostname of the sandbox (uts namespace).
	Hostname string `json:"hostname"`
	// Env is the base environment of every session.
	Env map[string]string `json:"env,omitempty"`
	// User is the default user of exec ("" = root).
	User string `json:"user,omitempty"`
	// Cwd is the default directory of exec when it exists (the image's
	// WORKDIR); "" = the user's home directory.
	Cwd string `json:"cwd,omitempty"`
	// Shell runs string commands; default "/bin/sh".
	Shell string `json:"shell,omitempty"`
	// SpawnerCgroups are cgroup directories (host paths, cgroup v1) that
	// the agent's spawner thread, the one that forks every process of the
	// sandbox, joins alone before confinement: a child inherits the
	// cgroups of the thread that forks it, so the sandbox's processes are
	// limited there and the rest of the agent is not (runtime/container:
	// the box).
	SpawnerCgroups []string `json:"spawner_cgroups,omitempty"`
	// ShmMB sizes /dev/shm; default 64 (the edge sends half the memory
	// limit: confine.ShmMBFor).
	ShmMB int64 `json:"shm_mb,omitempty"`
	// TmpMB sizes nothing yet; reserved.

	// Stateless makes a reusable (FnCall) sandbox: the root and /dev are
	// mounted read-only and each of these directories is an empty tmpfs;
	// OpReset kills every process and empties them again.
	Stateless []string `json:"stateless,omitempty"`

	// Net is a VM's network interface, which the agent in the guest
	// configures (a container's is configured from the host: nil).
	Net *VMNet `json:"net,omitempty"`
	// VMLayers is, for a microVM restored from a memory template (booted
	// without disks), how many layer disks it has: the agent loads the disk
	// driver and assembles the root from them before anything else. 0: the
	// VM assembled its root at boot.
	VMLayers int `json:"vm_layers,omitempty"`

	// Unconfined skips confinement (no mounts, no pivot, no privilege drop).
	// Tests only: the agent then serves file operations relative to RootDir
	// (or "/" when empty) and runs commands in its own (host) root.
	Unconfined bool `json:"unconfined,omitempty"`
}

// VMNet is a VM's interface: the one with MAC gets Address (CIDR) and a
// default route through Gateway.
type VMNet struct {
	Address string `json:"address"`
	Gateway string `json:"gateway"`
	MAC     string `json:"mac"`
}

// Bind attaches a host directory (a mounted layer) read-only, nosuid and
// nodev at Target inside the sandbox. A protected bind cannot be shadowed:
// every ancestor directory of Target becomes a mount point of its own, so
// none can be renamed or removed; trusted exec runs from it.
type Bind struct {
	Source string `json:"source"`
	// FD, when > 0, is an inherited descriptor of a detached, read-only
	// (idmapped) copy of Source that the edge made; it is used instead.
	FD        int    `json:"fd,omitempty"`
	Target    string `json:"target"`
	Protected bool   `json:"protected,omitempty"`
}

// SetupResult answers OpSetup once the agent serves from inside the sandbox.
type SetupResult struct {
	Pid   int `json:"pid"`             // the agent's pid as the host sees it (informational)
	Proto int `json:"proto,omitempty"` // the agent's protocol version (Proto)
}

// ExecRequest runs one command. Exactly one of Cmd and Argv is set.
type ExecRequest struct {
	Cmd        string            `json:"cmd,omitempty"`
	Argv       []string          `json:"argv,omitempty"`
	Session    string            `json:"session,omitempty"` // "" = "default"
	Env        map[string]string `json:"env,omitempty"`
	Cwd        string            `json:"cwd,omitempty"`
	Stdin      []byte            `json:"stdin,omitempty"`
	User       string            `json:"user,omitempty"`
	Timeout    time.Duration     `json:"timeout,omitempty"`    // 0 = none
	OutputCap  int64             `json:"output_cap,omitempty"` // per stream; 0 = 16 MiB
	Background bool              `json:"background,omitempty"` // answer at once with CommandID
	// Trusted runs the command with the first protected bind's bin/sh and
	// the protected binds' bin directories first on PATH.
	Trusted bool `json:"trusted,omitempty"`
	// Collect returns the output in the result (Stdout, Stderr) rather
	// than in chunk frames, as long as both together stay within
	// CollectMax bytes; past that it goes on in chunks.
	Collect bool `json:"collect,omitempty"`
	// ResetAfter (stateless sandboxes only) resets the sandbox after the
	// answer, whatever it is: the agent serves the next request once the
	// reset is done (or answers ErrUnusable if it failed).
	ResetAfter bool `json:"reset_after,omitempty"`
	// PTY runs the command on a new pseudo-terminal of that size (its
	// stdin, stdout and stderr; the output comes as stdout chunks), in a
	// session of its own with the terminal as its controlling one. With
	// neither Cmd nor Argv it runs the sandbox's shell. Its input comes in
	// OpInput calls (LiveStdin is implied).
	PTY *WinSize `json:"pty,omitempty"`
	// LiveStdin keeps the command's stdin open after Stdin: OpInput calls
	// feed it and close it.
	LiveStdin bool `json:"live_stdin,omitempty"`
}

// WinSize is a terminal's size in characters.
type WinSize struct {
	Cols uint16 `json:"cols"`
	Rows uint16 `json:"rows"`
}

// InputRequest is OpInput's body: what to do to the running foreground
// exec Call (a call id on the same connection) that has live input. Its
// payload (Request.Payload, or Data for an agent without payloads) is
// written to the command's stdin (the terminal) first; then the terminal
// is resized, the signal sent to the command's process group, stdin
// closed (a terminal gets its EOF character), in that order, each when
// asked. Answered once done: an edge that waits for each answer before
// sending the next has ordered, flow-controlled input.
type InputRequest struct {
	Call   uint64   `json:"call"`
	Data   []byte   `json:"data,omitempty"`
	Resize *WinSize `json:"resize,omitempty"`
	Signal int      `json:"signal,omitempty"`
	EOF    bool     `json:"eof,omitempty"`
}

// CollectMax bounds the output an exec with Collect returns in its result.
const CollectMax = 512 << 10

// ExecResult ends an exec.
type ExecResult struct {
	ExitCode  int     `json:"exit_code"`
	Truncated bool    `json:"truncated"`
	TimedOut  bool    `json:"timed_out,omitempty"`
	Signal    string  `json:"signal,omitempty"`
	Duration  float64 `json:"duration_ms"`
	CommandID string  `json:"command_id,omitempty"`
	// Stdout and Stderr: the output of an exec with Collect (what was not
	// sent in chunks).
	Stdout []byte `json:"stdout,omitempty"`
	Stderr []byte `json:"stderr,omitempty"`
}

// ProcRequest addresses a background command.
type ProcRequest struct {
	CommandID string `json:"command_id"`
	Wait      bool   `json:"wait,omitempty"`   // proc.get: block until it ends
	Signal    int    `json:"signal,omitempty"` // proc.kill: default SIGKILL
}

// ProcStatus is a background command's state and all output kept so far.
type ProcStatus struct {
	CommandID string  `json:"command_id"`
	Running   bool    `json:"running"`
	ExitCode  *int    `json:"exit_code,omitempty"`
	Stdout    []byte  `json:"stdout,omitempty"`
	Stderr    []byte  `json:"stderr,omitempty"`
	Truncated bool    `json:"truncated"`
	TimedOut  bool    `json:"timed_out,omitempty"`
	Signal    string  `json:"signal,omitempty"`
	Duration  float64 `json:"duration_ms"`
}

// PathRequest names one path inside the sandbox.
type PathRequest struct {
	Path string `json:"path"`
}

// WriteRequest writes (or appends) data to a file, creating parent dirs.
type WriteRequest struct {
	Path   string `json:"path"`
	Data   []byte `json:"data,omitempty"`
	Mode   uint32 `json:"mode,omitempty"` // default 0644
	Append bool   `json:"append,omitempty"`
	// At writes Data at Offset of an existing regular file (pwrite; an
	// agent of ProtoOffset or later): the writes of one upload may be in
	// flight together and finish in any order.
	At     bool  `json:"at,omitempty"`
	Offset int64 `json:"offset,omitempty"`
}

type MkdirRequest struct {
	Path    string `json:"path"`
	Mode    uint32 `json:"mode,omitempty"` // default 0755
	Parents bool   `json:"parents,omitempty"`
}

type RemoveRequest struct {
	Path      string `json:"path"`
	Recursive bool   `json:"recursive,omitempty"`
}

type RenameRequest struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// TarPutRequest streams a tar archive into directory Path. The first request
// has an empty Handle; its answer names the handle that later chunks use.
// The request with Final set waits for extraction to finish.
type TarPutRequest struct {
	Path   string `json:"path"`
	Handle string `json:"handle,omitempty"`
	Data   []byte `json:"data,omitempty"`
	Final  bool   `json:"final,omitempty"`
	// Abort ends the upload as broken (its sender went away): nothing of
	// it is extracted, even when it broke where a tar stream could end.
	Abort bool `json:"abort,omitempty"`
}

type TarPutResult struct {
	Handle string `json:"handle"`
	Files  int    `json:"files,omitempty"` // entries extracted (on Final)
}

// FileInfo describes one file.
type FileInfo struct {
	Name    string    `json:"name"`
	Path    string    `json:"path"`
	Size    int64     `json:"size"`
	Mode    uint32    `json:"mode"`
	Type    string    `json:"type"` // file, dir, symlink, other
	ModTime time.Time `json:"mod_time"`
	Target  string    `json:"target,omitempty"`
}

type FileList struct {
	Files []FileInfo `json:"files"`
}

// RerootRequest is OpReroot's.
type RerootRequest struct {
	// RootDev and RootIno identify the new root: the agent checks that
	// its root is that directory before it serves again.
	RootDev uint64 `json:"root_dev"`
	RootIno uint64 `json:"root_ino"`
}

// ResumeRequest is OpResume's: the new sandbox's environment and default
// user, as in SetupConfig.
type ResumeRequest struct {
	Env  map[string]string `json:"env,omitempty"`
	User string            `json:"user,omitempty"`
	Cwd  string            `json:"cwd,omitempty"`
}

// IdentityRequest is OpIdentity's.
type IdentityRequest struct {
	Hostname  string `json:"hostname"`
	MachineID string `json:"machine_id"` // 32 lower-case hex digits
	Entropy   []byte `json:"entropy"`    // from the host's random source, credited to the pool
	// UnixNano is the host's time: a restored guest's clock is its
	// snapshot's (0: leave the clock).
	UnixNano int64 `json:"unix_nano,omitempty"`
	// KernelOnly leaves /etc/hostname and /etc/machine-id alone: the VM's
	// root is its own (restored from a memory template, which had none).
	KernelOnly bool `json:"kernel_only,omitempty"`
	// NoPageReporting ends the guest's free page reporting (the balloon's
	// driver is unbound): its RAM is shared with other VMs (a fork's
	// children), and the host may not discard any of it.
	NoPageReporting bool `json:"no_page_reporting,omitempty"`
}

// ClockRequest asks for OpClock.
type ClockRequest struct {
	UnixNano int64 `json:"unix_nano"` // the host's time
	// OwnRAM: the VM was restored from its own memory snapshot (a pause),
	// so its RAM is no longer shared with a template's or a fork's other
	// VMs: free page reporting may run (again).
	OwnRAM bool `json:"own_ram,omitempty"`
}

// UpperTarResult answers OpUpperTar.
type UpperTarResult struct {
	FrozenMs float64 `json:"frozen_ms"` // how long the writable disk was frozen
}

// ResetResult answers OpReset.
type ResetResult struct {
	Killed  int `json:"killed"`  // processes killed
	Removed int `json:"removed"` // files removed from the stateless directories
}

// The trust split of a sandbox's cgroup in the cgroup v2 hierarchy (on a
// hybrid host, its unified mount): the agent and trusted commands live in
// the sandbox's cgroup, every other process in its child CgroupWork, which
// a trusted command freezes for its duration. The edge opens the split's
// files (CgroupFiles, in that order) and passes them to the agent as the
// consecutive descriptors from the one named by CgroupFDEnv in its
// environment.
const (
	CgroupWork  = "work"
	CgroupFDEnv = "WARREN_AGENT_CGROUP_FD"
)

// CgroupFiles are the split's files the agent gets, relative to the
// sandbox's cgroup, and how the edge opens each (read, write).
var CgroupFiles = []struct {
	Name  string
	Write bool
}{
	{"cgroup.procs", false},                // who is beside the agent
	{CgroupWork + "/cgroup.procs", true},   // moves a process into work
	{CgroupWork + "/cgroup.freeze", true},  // freezes and thaws work
	{CgroupWork + "/cgroup.events", false}, // "frozen 1"
}
