// SPDX-License-Identifier: (MIT OR GPL-2.0-only)
//
// warren's kernel-side telemetry (issue 20): one set of programs per node,
// filtered by each sandbox's cgroup v2 id. Built into exec_bpfel.o by
// bpf2go (see ../gen.go for the command); the object is checked in.
//
// Structures are declared here, the few fields used only, with
// preserve_access_index: clang emits CO-RE relocations and the loader
// fixes the offsets against the running kernel's BTF.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef int s32;
typedef unsigned long long u64;
typedef long long s64;
typedef u8 __u8;
typedef u16 __u16;
typedef u32 __u32;
typedef s32 __s32;
typedef u64 __u64;
typedef s64 __s64;
typedef u16 __be16;
typedef u32 __be32;
typedef u32 __wsum;

#include "headers/bpf_helpers.h"

#define BPF_MAP_TYPE_HASH 1
#define BPF_MAP_TYPE_RINGBUF 27
#define BPF_MAP_TYPE_ARRAY 2
#define BPF_RB_NO_WAKEUP 1
#define BPF_RB_FORCE_WAKEUP 2
#define BPF_RB_AVAIL_DATA 0

// RING_SIZE is the ring buffer's size. Events are submitted without a
// wakeup (the reader drains the ring every few tens of milliseconds)
// unless it is a quarter full: a wakeup per exec costs the exec more
// than the program does (docs/BENCHMARKS.md).
#define RING_SIZE (1 << 22)

struct pid_namespace;

// upid is declared whole: numbers[] is indexed by level, so its size
// (not only nr's offset) must be the kernel's.
struct upid {
	int nr;
	struct pid_namespace *ns;
} __attribute__((preserve_access_index));

struct pid {
	unsigned int level;
	struct upid numbers[1];
} __attribute__((preserve_access_index));

struct mm_struct {
	unsigned long arg_start;
	unsigned long arg_end;
} __attribute__((preserve_access_index));

struct task_struct {
	int tgid;
	struct mm_struct *mm;
	struct task_struct *real_parent;
	struct pid *thread_pid;
} __attribute__((preserve_access_index));

struct pt_regs {
	unsigned long orig_ax;
	unsigned long di;
	unsigned long si;
	unsigned long dx;
	unsigned long r10;
} __attribute__((preserve_access_index));

struct linux_binprm {
	const char *filename;
} __attribute__((preserve_access_index));

#define PATH_CAP 256
#define ARGV_CAP 1024
#define MAX_LEVELS 16

// Event kinds (telemetry.go mirrors them).
#define KIND_EXEC 1
#define KIND_REFUSED 2 // a syscall failed with EPERM (seccomp, capabilities)
#define KIND_SIGNAL 3  // a signal sent to the sandbox's PID 1 (its agent)
#define KIND_FILE 4    // a syscall that asks to write, rename, unlink or chmod a file
#define KIND_CONNECT 5 // a TCP connection attempt (a socket entering SYN_SENT)

// slot is what the edge registers per sandbox cgroup: the sandbox's
// cookie and the trajectory step running now (0 = between steps).
#define PROT_CAP 64

struct slot {
	u64 cookie;
	s64 step;
	u32 flags;    // SLOT_AGENT: the cgroup of the sandbox's agent (and trusted commands)
	u32 prot_len; // bytes of prot (0: none)
	// prot is the sandbox's protected directory (its first protected
	// layer's mount point, no trailing slash): opens for reading under it
	// are recorded too (Files).
	char prot[PROT_CAP];
};

#define SLOT_AGENT 1

struct event {
	u64 cookie;
	s64 step;
	u64 time_ns; // CLOCK_MONOTONIC (bpf_ktime_get_ns)
	u32 kind;
	u32 pid;      // in the sandbox's pid namespace
	u32 ppid;     // the parent's, in the same namespace
	u32 host_pid; // tgid on the host
	u32 uid;      // on the host
	u32 argv_len; // bytes of argv (NUL-separated) copied
	u32 argv_truncated;
	u32 beside; // file, connect: by a process in the agent's cgroup other than the agent
	s32 nr;     // refused: the syscall; signal: the signal
	s32 target; // signal: 1 (the target is its namespace's pid 1)
	s32 result; // signal: what the kernel did with it (TRACE_SIGNAL_*)
	char path[PATH_CAP];
	char argv[ARGV_CAP];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, u64); // cgroup v2 id
	__type(value, struct slot);
} sandboxes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, RING_SIZE);
} events SEC(".maps");

// lost counts events dropped because the ring buffer was full.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, u64);
} lost SEC(".maps");

// Force the event type into BTF for bpf2go.
const struct event *unused_event __attribute__((unused));

// find returns the slot of the sandbox the current task runs in: its own
// cgroup, or the nearest registered ancestor (a sandbox's child cgroups).
static __always_inline struct slot *find(void)
{
	u64 id = bpf_get_current_cgroup_id();
	struct slot *s = bpf_map_lookup_elem(&sandboxes, &id);
	if (s)
		return s;
	for (int i = MAX_LEVELS - 1; i >= 1; i--) {
		id = bpf_get_current_ancestor_cgroup_id(i);
		if (id == 0)
			continue;
		s = bpf_map_lookup_elem(&sandboxes, &id);
		if (s)
			return s;
	}
	return 0;
}

// upid_at reads level's entry of t's pid (zero when t has no such level).
static __always_inline struct upid upid_at(struct task_struct *t, unsigned int level)
{
	struct upid up = {};
	struct pid *p = t->thread_pid;
	if (!p || p->level < level)
		return up;
	bpf_probe_read_kernel(&up, sizeof(up), &p->numbers[level & 31]);
	return up;
}

// ns_pids sets the pid of t and of its parent as t's own pid namespace
// numbers them (the parent is 0 when it lives outside that namespace).
static __always_inline void ns_pids(struct task_struct *t, u32 *pid, u32 *ppid)
{
	struct pid *p = t->thread_pid;
	unsigned int level = p ? p->level : 0;
	struct upid me = upid_at(t, level);
	*pid = me.nr;
	struct upid parent = upid_at(t->real_parent, level);
	*ppid = parent.ns == me.ns ? parent.nr : 0;
}

// is_agent reports whether the current task is pid 1 of its pid namespace:
// in a sandbox's agent cgroup, the agent itself.
static __always_inline int is_agent(void)
{
	struct task_struct *t = bpf_get_current_task_btf();
	struct pid *p = t->thread_pid;
	if (!p)
		return 0;
	return upid_at(t, p->level).nr == 1;
}

// reserve starts an event of kind for slot s (NULL when the ring is full;
// counted in lost).
static __always_inline struct event *reserve(struct slot *s, u32 kind)
{
	struct event *ev = bpf_ringbuf_reserve(&events, sizeof(*ev), 0);
	if (!ev) {
		u32 zero = 0;
		u64 *n = bpf_map_lookup_elem(&lost, &zero);
		if (n)
			__sync_fetch_and_add(n, 1);
		return 0;
	}
	struct task_struct *task = bpf_get_current_task_btf();
	ev->cookie = s->cookie;
	ev->step = s->step;
	ev->time_ns = bpf_ktime_get_ns();
	ev->kind = kind;
	ev->host_pid = bpf_get_current_pid_tgid() >> 32;
	ev->uid = (u32)bpf_get_current_uid_gid();
	ns_pids(task, &ev->pid, &ev->ppid);
	ev->argv_truncated = 0;
	ev->beside = 0;
	ev->argv_len = 0;
	ev->nr = 0;
	ev->target = 0;
	ev->result = 0;
	ev->path[0] = 0;
	return ev;
}

static __always_inline void submit(struct event *ev)
{
	u64 queued = bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA);
	bpf_ringbuf_submit(ev, queued > RING_SIZE / 4 ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP);
}

SEC("tp_btf/sched_process_exec")
int exec(u64 *ctx)
{
	struct slot *s = find();
	if (!s)
		return 0;
	struct task_struct *task = (struct task_struct *)ctx[0];
	struct linux_binprm *bprm = (struct linux_binprm *)ctx[2];

	struct event *ev = reserve(s, KIND_EXEC);
	if (!ev)
		return 0;
	if (bpf_probe_read_kernel_str(ev->path, sizeof(ev->path), bprm->filename) < 0)
		ev->path[0] = 0;

	struct mm_struct *mm = task->mm;
	unsigned long start = mm->arg_start, end = mm->arg_end;
	u64 len = end - start;
	if (end < start)
		len = 0;
	if (len > ARGV_CAP) {
		len = ARGV_CAP;
		ev->argv_truncated = 1;
	}
	if (len > 0 && bpf_probe_read_user(ev->argv, len, (void *)start) == 0)
		ev->argv_len = len;
	submit(ev);
	return 0;
}

// sys_exit sees every syscall's end on the host; only those that failed
// with EPERM (what seccomp's refusals and missing capabilities answer)
// go further than one comparison.
#define EPERM 1
SEC("tp_btf/sys_exit")
int sys_exit(u64 *ctx)
{
	long ret = (long)ctx[1];
	if (ret != -EPERM)
		return 0;
	struct slot *s = find();
	if (!s)
		return 0;
	struct pt_regs *regs = (struct pt_regs *)ctx[0];
	struct event *ev = reserve(s, KIND_REFUSED);
	if (!ev)
		return 0;
	ev->nr = (int)regs->orig_ax;
	submit(ev);
	return 0;
}

// signal_generate: a signal sent from a sandbox process to a task that is
// pid 1 of its pid namespace (a sandbox's agent). SIGCHLD, which every
// child's exit sends its parent, is not recorded.
#define SIGCHLD 17
SEC("tp_btf/signal_generate")
int signal_generate(u64 *ctx)
{
	int sig = (int)ctx[0];
	struct task_struct *target = (struct task_struct *)ctx[2];
	if (sig == SIGCHLD || !target)
		return 0;
	struct pid *tp = target->thread_pid;
	if (!tp)
		return 0;
	struct upid up = upid_at(target, tp->level);
	if (up.nr != 1)
		return 0;
	struct slot *s = find();
	if (!s)
		return 0;
	struct event *ev = reserve(s, KIND_SIGNAL);
	if (!ev)
		return 0;
	ev->nr = sig;
	ev->target = 1;
	ev->result = (int)ctx[4];
	submit(ev);
	return 0;
}

// x86_64 syscall numbers of the file operations sys_enter watches.
#define NR_open 2
#define NR_rename 82
#define NR_creat 85
#define NR_unlink 87
#define NR_chmod 90
#define NR_openat 257
#define NR_unlinkat 263
#define NR_renameat 264
#define NR_fchmodat 268
#define NR_renameat2 316
#define NR_openat2 437
#define NR_fchmodat2 452

#define O_ACCMODE 3
#define O_CREAT 0x40
#define O_TRUNC 0x200

struct open_how {
	u64 flags;
};

// under reports whether path p lies in dir d (len bytes, no trailing
// slash): p is d or begins with d and '/'.
static __always_inline int under(const char *p, const char *d, u32 len)
{
	if (len == 0 || len >= PROT_CAP)
		return 0;
	for (u32 i = 0; i < PROT_CAP; i++) {
		if (i >= len)
			return p[i] == '/' || p[i] == 0;
		if (p[i] != d[i])
			return 0;
	}
	return 0;
}

// sensitive reports whether a read of p is worth a record: the kernel's
// page maps and core (/proc/kpage*, /proc/kcore), another process's memory
// or environment (/proc/<pid>/mem, /proc/<pid>/environ, also under task/),
// or the sandbox's protected directory.
static __always_inline int sensitive(const char *p, struct slot *s)
{
	if (under(p, s->prot, s->prot_len))
		return 1;
	if (p[0] != '/' || p[1] != 'p' || p[2] != 'r' || p[3] != 'o' || p[4] != 'c' || p[5] != '/')
		return 0;
	if (p[6] == 'k' && ((p[7] == 'p' && p[8] == 'a' && p[9] == 'g' && p[10] == 'e') ||
			    (p[7] == 'c' && p[8] == 'o' && p[9] == 'r' && p[10] == 'e')))
		return 1;
	// The last component, within the first 48 bytes: "mem" or "environ".
	int last = -1;
	for (int i = 6; i < 48; i++) {
		if (p[i] == 0)
			break;
		if (p[i] == '/')
			last = i;
	}
	if (last < 0 || last > 40)
		return 0;
	const char *c = p + last + 1;
	if (c[0] == 'm' && c[1] == 'e' && c[2] == 'm' && c[3] == 0)
		return 1;
	return c[0] == 'e' && c[1] == 'n' && c[2] == 'v' && c[3] == 'i' && c[4] == 'r' && c[5] == 'o' && c[6] == 'n' && c[7] == 0;
}

// sys_enter sees every syscall's start on the host; only the file
// operations above, from a sandbox's processes (not its agent's cgroup),
// go further than a switch. It records the attempt with the path as the
// process named it (relative paths are relative to its cwd). An open for
// reading is recorded only when its path is sensitive (above).
SEC("tp_btf/sys_enter")
int sys_enter(u64 *ctx)
{
	long nr = (long)ctx[1];
	struct pt_regs *regs = (struct pt_regs *)ctx[0];
	const char *path = 0, *to = 0;
	s64 flags = 0;
	int read = 0;
	switch (nr) {
	case NR_open:
		flags = regs->si;
		read = !(flags & (O_ACCMODE | O_CREAT | O_TRUNC));
		path = (const char *)regs->di;
		break;
	case NR_openat:
		flags = regs->dx;
		read = !(flags & (O_ACCMODE | O_CREAT | O_TRUNC));
		path = (const char *)regs->si;
		break;
	case NR_openat2: {
		struct open_how how = {};
		if (bpf_probe_read_user(&how, sizeof(how), (void *)regs->dx) < 0)
			return 0;
		flags = how.flags;
		read = !(flags & (O_ACCMODE | O_CREAT | O_TRUNC));
		path = (const char *)regs->si;
		break;
	}
	case NR_creat:
	case NR_unlink:
	case NR_chmod:
		path = (const char *)regs->di;
		break;
	case NR_unlinkat:
	case NR_fchmodat:
	case NR_fchmodat2:
		path = (const char *)regs->si;
		break;
	case NR_rename:
		path = (const char *)regs->di;
		to = (const char *)regs->si;
		break;
	case NR_renameat:
	case NR_renameat2:
		path = (const char *)regs->si;
		to = (const char *)regs->r10;
		break;
	default:
		return 0;
	}
	// In the agent's cgroup: the agent's own work is not recorded; the
	// rest there is a trusted command, or a process the agent started
	// and has not moved into work/ yet (the edge tells them apart).
	struct slot *s = find();
	if (!s || ((s->flags & SLOT_AGENT) && is_agent()))
		return 0;
	struct event *ev = reserve(s, KIND_FILE);
	if (!ev)
		return 0;
	ev->beside = s->flags & SLOT_AGENT;
	ev->nr = nr;
	ev->result = flags;
	if (bpf_probe_read_user_str(ev->path, sizeof(ev->path), path) < 0)
		ev->path[0] = 0;
	if (read && !sensitive(ev->path, s)) {
		bpf_ringbuf_discard(ev, BPF_RB_NO_WAKEUP);
		return 0;
	}
	if (to) {
		long n = bpf_probe_read_user_str(ev->argv, PATH_CAP, to);
		if (n > 0)
			ev->argv_len = n;
	}
	submit(ev);
	return 0;
}

// The few fields of a socket the connect program reads. The kernel keeps
// them in anonymous unions; CO-RE finds them by name.
struct in6_addr {
	u8 s6_addr[16];
} __attribute__((preserve_access_index));

struct sock_common {
	__be32 skc_daddr;
	__be16 skc_dport;
	unsigned short skc_family;
	struct in6_addr skc_v6_daddr;
} __attribute__((preserve_access_index));

struct sock {
	struct sock_common __sk_common;
} __attribute__((preserve_access_index));

#define TCP_SYN_SENT 2
#define AF_INET 2
#define AF_INET6 10

// inet_sock_set_state: a TCP socket of a sandbox process enters SYN_SENT,
// which only connect() does, in the caller's context (so the cgroup is
// the caller's). The event's path holds the destination address's bytes
// (4 or 16), nr the family and target the port. Cheap: it runs on TCP
// state changes only.
SEC("tp_btf/inet_sock_set_state")
int inet_sock_set_state(u64 *ctx)
{
	struct sock *sk = (struct sock *)ctx[0];
	int newstate = (int)ctx[2];
	if (newstate != TCP_SYN_SENT || !sk)
		return 0;
	struct slot *s = find();
	if (!s || ((s->flags & SLOT_AGENT) && is_agent()))
		return 0;
	unsigned short family = sk->__sk_common.skc_family;
	if (family != AF_INET && family != AF_INET6)
		return 0;
	struct event *ev = reserve(s, KIND_CONNECT);
	if (!ev)
		return 0;
	ev->beside = s->flags & SLOT_AGENT;
	ev->nr = family;
	u16 port = sk->__sk_common.skc_dport;
	ev->target = (port >> 8) | ((port & 0xff) << 8);
	if (family == AF_INET) {
		__be32 a = sk->__sk_common.skc_daddr;
		__builtin_memcpy(ev->path, &a, 4);
	} else {
		bpf_probe_read_kernel(ev->path, 16, &sk->__sk_common.skc_v6_daddr);
	}
	submit(ev);
	return 0;
}

char __license[] SEC("license") = "Dual MIT/GPL";
