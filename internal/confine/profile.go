package confine

import "golang.org/x/sys/unix"

// The seccomp profile of every sandbox. It is an allow list modelled on
// Docker's default profile (github.com/moby/profiles/seccomp) for a
// container holding exactly SandboxCaps: everything not listed fails with
// EPERM, and so does every syscall of a non-native ABI (i386, x32).
//
// Beyond Docker's profile it refuses:
//   - ptrace, process_vm_readv/writev: no reading or steering other
//     processes (the agent is PID 1 and holds the edge channel);
//   - ioctls that swap, move, clone or deduplicate file extents
//     (XFS_IOC_SWAPEXT, EXT4_IOC_MOVE_EXT, FICLONE, FICLONERANGE,
//     FIDEDUPERANGE): they act below the overlay and have been used to
//     reach protected data and to corrupt filesystems; TIOCSTI and TIOCLINUX
//     push input into a terminal another process reads;
//   - clone and unshare with any namespace flag, clone3 (its flags sit
//     behind a pointer seccomp cannot read: answered ENOSYS so libcs fall
//     back to clone), setns;
//   - socket families outside the list below (AF_ALG, AF_VSOCK, ...).
//
// The rest of the denials come from what Docker leaves out for a container
// without CAP_SYS_ADMIN and friends: bpf, perf_event_open, userfaultfd,
// keyctl/add_key/request_key, kexec_load/kexec_file_load,
// init_module/finit_module/delete_module, mount/umount2/pivot_root and the
// new mount API (move_mount, open_tree, fsopen, fsconfig, fsmount, fspick,
// mount_setattr), open_by_handle_at, reboot, swapon/swapoff, io_uring,
// fanotify_init, quotactl, syslog, acct, settimeofday, and so on.

// allowedSyscalls are allowed whatever their arguments, grouped by purpose.
var allowedSyscalls = [][]string{
	// files: open, read, write, seek, sync
	{"open", "openat", "openat2", "creat", "close", "close_range", "read", "readv", "pread64",
		"preadv", "preadv2", "write", "writev", "pwrite64", "pwritev", "pwritev2", "lseek",
		"sendfile", "splice", "tee", "vmsplice", "copy_file_range", "fsync", "fdatasync",
		"sync", "syncfs", "sync_file_range", "fallocate", "ftruncate", "truncate", "fadvise64",
		"readahead", "flock", "fcntl", "dup", "dup2", "dup3", "pipe", "pipe2", "ioctl"},
	// file system metadata and directories
	{"stat", "fstat", "lstat", "newfstatat", "statx", "statfs", "fstatfs", "access",
		"faccessat", "faccessat2", "chdir", "fchdir", "getcwd", "getdents", "getdents64",
		"mkdir", "mkdirat", "rmdir", "rename", "renameat", "renameat2", "link", "linkat",
		"unlink", "unlinkat", "symlink", "symlinkat", "readlink", "readlinkat", "chmod",
		"fchmod", "fchmodat", "fchmodat2", "chown", "fchown", "fchownat", "lchown", "umask",
		"utime", "utimes", "utimensat", "futimesat", "mknod", "mknodat", "name_to_handle_at",
		"chroot", "statmount", "listmount"},
	// extended attributes
	{"getxattr", "lgetxattr", "fgetxattr", "getxattrat", "setxattr", "lsetxattr", "fsetxattr",
		"setxattrat", "listxattr", "llistxattr", "flistxattr", "listxattrat", "removexattr",
		"lremovexattr", "fremovexattr", "removexattrat"},
	// file change notification
	{"inotify_init", "inotify_init1", "inotify_add_watch", "inotify_rm_watch", "fanotify_mark"},
	// memory
	{"brk", "mmap", "munmap", "mremap", "mprotect", "madvise", "mincore", "msync", "mlock",
		"mlock2", "mlockall", "munlock", "munlockall", "remap_file_pages", "memfd_create",
		"memfd_secret", "membarrier", "pkey_alloc", "pkey_free", "pkey_mprotect",
		"map_shadow_stack", "mseal", "cachestat", "process_mrelease"},
	// processes and threads (clone, unshare: see conditionalSyscalls)
	{"fork", "vfork", "execve", "execveat", "exit", "exit_group", "wait4", "waitid", "kill",
		"tkill", "tgkill", "getpid", "getppid", "gettid", "getpgid", "setpgid", "getpgrp",
		"getsid", "setsid", "set_tid_address", "set_robust_list", "get_robust_list", "rseq",
		"arch_prctl", "modify_ldt", "prctl", "seccomp", "capget", "capset", "pidfd_open",
		"pidfd_send_signal", "getrlimit", "setrlimit", "prlimit64", "getrusage", "times",
		"getpriority", "setpriority", "ioprio_get", "ioprio_set", "uname", "sysinfo",
		"restart_syscall", "landlock_create_ruleset", "landlock_add_rule",
		"landlock_restrict_self", "uretprobe"},
	// credentials
	{"getuid", "geteuid", "getgid", "getegid", "getresuid", "getresgid", "getgroups",
		"setuid", "setgid", "setreuid", "setregid", "setresuid", "setresgid", "setfsuid",
		"setfsgid", "setgroups"},
	// signals
	{"rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigpending", "rt_sigsuspend",
		"rt_sigtimedwait", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "sigaltstack", "pause",
		"signalfd", "signalfd4", "alarm"},
	// time and timers
	{"clock_gettime", "clock_getres", "clock_nanosleep", "clock_adjtime", "adjtimex",
		"gettimeofday", "time", "nanosleep", "getitimer", "setitimer", "timer_create",
		"timer_delete", "timer_gettime", "timer_settime", "timer_getoverrun",
		"timerfd_create", "timerfd_gettime", "timerfd_settime"},
	// scheduling and futexes
	{"sched_yield", "sched_getaffinity", "sched_setaffinity", "sched_getattr",
		"sched_setattr", "sched_getparam", "sched_setparam", "sched_getscheduler",
		"sched_setscheduler", "sched_get_priority_max", "sched_get_priority_min",
		"sched_rr_get_interval", "getcpu", "futex", "futex_waitv", "futex_wake", "futex_wait",
		"futex_requeue"},
	// polling and events
	{"poll", "ppoll", "select", "pselect6", "epoll_create", "epoll_create1", "epoll_ctl",
		"epoll_wait", "epoll_pwait", "epoll_pwait2", "eventfd", "eventfd2"},
	// async I/O (not io_uring)
	{"io_setup", "io_destroy", "io_submit", "io_cancel", "io_getevents", "io_pgetevents"},
	// System V and POSIX IPC (private to the ipc namespace)
	{"shmget", "shmat", "shmdt", "shmctl", "semget", "semop", "semtimedop", "semctl",
		"msgget", "msgsnd", "msgrcv", "msgctl", "mq_open", "mq_unlink", "mq_timedsend",
		"mq_timedreceive", "mq_notify", "mq_getsetattr"},
	// networking (socket: see conditionalSyscalls)
	{"socketpair", "bind", "listen", "accept", "accept4", "connect", "getsockname",
		"getpeername", "getsockopt", "setsockopt", "sendto", "sendmsg", "sendmmsg",
		"recvfrom", "recvmsg", "recvmmsg", "shutdown"},
	// randomness
	{"getrandom"},
}

// enosysSyscalls are answered ENOSYS so that callers fall back to an older
// syscall the profile can inspect.
var enosysSyscalls = []string{"clone3"}

// namespaceFlags are refused in clone and unshare.
const namespaceFlags = unix.CLONE_NEWNS | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC | unix.CLONE_NEWUSER |
	unix.CLONE_NEWPID | unix.CLONE_NEWNET | unix.CLONE_NEWCGROUP

// unshareNamespaceFlags adds CLONE_NEWTIME, which only unshare and clone3
// accept (in clone its bit is part of the exit signal).
const unshareNamespaceFlags = namespaceFlags | unix.CLONE_NEWTIME

// deniedIoctls are refused ioctl request numbers.
var deniedIoctls = []uint32{
	xfsIocSwapext,
	ext4IocMoveExt,
	unix.FICLONE,
	unix.FICLONERANGE,
	unix.FIDEDUPERANGE,
	unix.TIOCSTI,
	unix.TIOCLINUX,
}

// Request numbers not exported by x/sys, computed with _IOC
// (dir<<30 | size<<16 | type<<8 | nr).
var (
	// _IOWR('X', 109, struct xfs_swapext): 192 bytes on 64-bit.
	xfsIocSwapext = ioc(iocRead|iocWrite, 'X', 109, 192)
	// _IOWR('f', 15, struct move_extent): 40 bytes.
	ext4IocMoveExt = ioc(iocRead|iocWrite, 'f', 15, 40)
)

const (
	iocWrite = 1
	iocRead  = 2
)

func ioc(dir, typ, nr, size uint32) uint32 {
	return dir<<30 | size<<16 | typ<<8 | nr
}

// allowedSocketFamilies follows Docker's list: everything the kernel still
// implements except AF_ALG (kernel crypto API) and AF_VSOCK (host/guest
// channel, global across network namespaces).
var allowedSocketFamilies = []uint32{
	unix.AF_UNIX, unix.AF_INET, unix.AF_AX25, unix.AF_IPX, unix.AF_APPLETALK, unix.AF_NETROM,
	unix.AF_BRIDGE, unix.AF_ATMPVC, unix.AF_X25, unix.AF_INET6, unix.AF_ROSE,
	unix.AF_NETBEUI, unix.AF_SECURITY, unix.AF_KEY, unix.AF_NETLINK, unix.AF_PACKET,
	unix.AF_ASH, unix.AF_RDS, unix.AF_SNA, unix.AF_PPPOX, unix.AF_LLC, unix.AF_IB,
	unix.AF_MPLS, unix.AF_CAN, unix.AF_TIPC, unix.AF_BLUETOOTH, unix.AF_IUCV, unix.AF_RXRPC,
	unix.AF_PHONET, unix.AF_IEEE802154, unix.AF_NFC, unix.AF_KCM, unix.AF_QIPCRTR,
	unix.AF_SMC, unix.AF_XDP, unix.AF_MCTP,
}

// allowedPersonalities: Linux default, UNAME26, ADDR_NO_RANDOMIZE and the
// query value, as in Docker.
var allowedPersonalities = []uint32{0x0, 0x0008, 0x20000, 0x20008, 0xffffffff}
