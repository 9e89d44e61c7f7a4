package confine

import (
	"errors"
	"fmt"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// Namespace threads: the edge enters a sandbox's mount and IPC namespaces
// (Reroot, OpenMessageQueues) on OS threads of a small pool kept for that.
// Each job runs on a locked thread with an fs_struct of its own (setns into
// a mount namespace needs one, and changes the thread's root and working
// directory); after the job the thread goes back to the edge's own
// namespaces (which resets root and working directory too) and checks
// that it is there. A thread that cannot get back ends: Go ends a thread
// whose goroutine exits while locked to it. Threads are kept because
// making and ending one for every sandbox cost more than the rest of a
// reroot. The process's main thread is never used: /proc/self shows its
// namespaces for the whole process.

// maxNSThreads bounds the pool.
const maxNSThreads = 4

type nsJob struct {
	pidfd  int
	nstype int
	fn     func() error
	done   chan error
}

var nsPool struct {
	mu          sync.Mutex
	idle, total int
	jobs        chan nsJob
}

// inNamespaces runs fn on a thread that has entered the namespaces nstype
// (CLONE_NEWNS, CLONE_NEWIPC) of the process behind pidfd.
func inNamespaces(pidfd, nstype int, fn func() error) error {
	nsPool.mu.Lock()
	if nsPool.jobs == nil {
		nsPool.jobs = make(chan nsJob)
	}
	if nsPool.idle == 0 && nsPool.total < maxNSThreads {
		nsPool.total++
		go nsThread(nil)
	}
	jobs := nsPool.jobs
	nsPool.mu.Unlock()
	j := nsJob{pidfd: pidfd, nstype: nstype, fn: fn, done: make(chan error, 1)}
	jobs <- j
	return <-j.done
}

// nsThread serves jobs until it cannot get back to the edge's namespaces.
// started, when set, is closed once the thread is known not to be the main
// one.
func nsThread(started chan struct{}) {
	runtime.LockOSThread() // unlocked only on the main thread, before any job
	if unix.Gettid() == unix.Getpid() {
		// Hold the main thread while a replacement starts (on another
		// thread, then), and give it back.
		ok := make(chan struct{})
		go nsThread(ok)
		<-ok
		runtime.UnlockOSThread()
		return
	}
	if started != nil {
		close(started)
	}
	defer func() {
		nsPool.mu.Lock()
		nsPool.total--
		nsPool.mu.Unlock()
	}()
	home, err := openHome()
	if err != nil {
		failNext(err)
		return
	}
	defer home.close()
	for {
		nsPool.mu.Lock()
		nsPool.idle++
		jobs := nsPool.jobs
		nsPool.mu.Unlock()
		j := <-jobs
		nsPool.mu.Lock()
		nsPool.idle--
		nsPool.mu.Unlock()
		err := unix.Setns(j.pidfd, j.nstype)
		if err != nil {
			err = fmt.Errorf("confine: enter the sandbox's namespaces: %w", err)
		} else {
			err = j.fn()
		}
		if herr := home.back(); herr != nil {
			j.done <- errors.Join(err, herr)
			return // the thread ends with its goroutine
		}
		j.done <- err
	}
}

// failNext answers the next job with err (a thread that could not start
// serving still owes the job that made it start).
func failNext(err error) {
	j := <-nsPool.jobs
	j.done <- err
}

// nsHome is the edge's own mount and IPC namespaces, to come back to.
type nsHome struct {
	mnt, ipc       int
	mntIno, ipcIno uint64
}

// openHome unshares the calling thread's fs_struct and opens its namespaces.
func openHome() (*nsHome, error) {
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return nil, fmt.Errorf("confine: unshare fs: %w", err)
	}
	h := &nsHome{mnt: -1, ipc: -1}
	var err error
	defer func() {
		if err != nil {
			h.close()
		}
	}()
	for _, ns := range []struct {
		name string
		fd   *int
		ino  *uint64
	}{{"mnt", &h.mnt, &h.mntIno}, {"ipc", &h.ipc, &h.ipcIno}} {
		if *ns.fd, err = unix.Open("/proc/thread-self/ns/"+ns.name, unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
			return nil, fmt.Errorf("confine: open own %s namespace: %w", ns.name, err)
		}
		var st unix.Stat_t
		if err = unix.Fstat(*ns.fd, &st); err != nil {
			return nil, err
		}
		*ns.ino = st.Ino
	}
	return h, nil
}

func (h *nsHome) close() {
	unix.Close(h.mnt)
	unix.Close(h.ipc)
}

// back returns the calling thread to the edge's namespaces and checks it.
func (h *nsHome) back() error {
	if err := unix.Setns(h.mnt, unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("confine: back to own mount namespace: %w", err)
	}
	if err := unix.Setns(h.ipc, unix.CLONE_NEWIPC); err != nil {
		return fmt.Errorf("confine: back to own IPC namespace: %w", err)
	}
	for _, ns := range []struct {
		name string
		ino  uint64
	}{{"mnt", h.mntIno}, {"ipc", h.ipcIno}} {
		var st unix.Stat_t
		if err := unix.Stat("/proc/thread-self/ns/"+ns.name, &st); err != nil || st.Ino != ns.ino {
			return fmt.Errorf("confine: not back in own %s namespace (%v)", ns.name, err)
		}
	}
	return nil
}
