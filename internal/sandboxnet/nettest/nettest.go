// Package nettest builds, for tests, a stand-in for the internet inside a
// network namespace the test owns, so that no test sends a packet off the
// machine: a namespace holding 10.1.2.3, 10.9.9.9 and 169.254.169.254,
// each with TCP listeners (greeting "hello") on 80 and 443 (and HoldPort,
// SourcePort), a
// DNS server naming them on Mirror (DNS), reached from
// the host through a veth (host end 10.1.2.1/24) with routes for the
// other two addresses. Everything is removed when the test ends.
package nettest

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// Addresses of the fake internet.
const (
	Mirror    = "10.1.2.3"        // in 10.1.2.0/24, the host end's subnet
	Elsewhere = "10.9.9.9"        // routed through Mirror
	Metadata  = "169.254.169.254" // routed through Mirror
	HostEnd   = "10.1.2.1"        // the host's address facing it
	// DNS is the fake internet's resolver (on Mirror, port 53, UDP and
	// TCP): MirrorName and FilesName are Mirror, ElsewhereName is
	// Elsewhere, each for TTL; every other name is NXDOMAIN.
	DNS           = Mirror + ":53"
	MirrorName    = "mirror.test"
	FilesName     = "files.mirror.test"
	ElsewhereName = "elsewhere.test"
	TTL           = 60
)

// NSProc starts a process alone in a new network namespace and returns its
// pid; it is killed when the test ends.
func NSProc(t testing.TB) int {
	t.Helper()
	cmd := exec.Command("sleep", "600")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	if err := cmd.Start(); err != nil {
		t.Skipf("SKIP: cannot make a network namespace: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd.Process.Pid
}

// InNS runs f on an OS thread in pid's network namespace.
func InNS(t testing.TB, pid int, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			t.Error(err)
			return
		}
		defer orig.Close()
		ns, err := netns.GetFromPid(pid)
		if err != nil {
			t.Error(err)
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			t.Error(err)
			return
		}
		f()
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread() // else the thread dies with the goroutine
		}
	}()
	<-done
}

// FakeInternet makes the namespace and its routes.
func FakeInternet(t testing.TB) {
	t.Helper()
	lockInternet(t)
	pid := NSProc(t)
	name := fmt.Sprintf("wtinet%d", os.Getpid()%100000)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: "inet0", PeerNamespace: netlink.NsPid(pid)}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("fake internet veth: %v", err)
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(name); err == nil {
			_ = netlink.LinkDel(l)
		}
	})
	host, err := netlink.LinkByName(name)
	must(t, err)
	must(t, netlink.AddrAdd(host, &netlink.Addr{IPNet: cidr(HostEnd + "/24")}))
	must(t, netlink.LinkSetUp(host))
	for _, dst := range []string{Elsewhere + "/32", Metadata + "/32"} {
		must(t, netlink.RouteAdd(&netlink.Route{LinkIndex: host.Attrs().Index, Dst: cidr(dst), Gw: net.ParseIP(Mirror)}))
	}
	InNS(t, pid, func() {
		l, err := netlink.LinkByName("inet0")
		if err != nil {
			t.Error(err)
			return
		}
		for _, a := range []string{Mirror + "/24", Elsewhere + "/32", Metadata + "/32"} {
			must(t, netlink.AddrAdd(l, &netlink.Addr{IPNet: cidr(a)}))
		}
		lo, _ := netlink.LinkByName("lo")
		must(t, netlink.LinkSetUp(lo))
		must(t, netlink.LinkSetUp(l))
		serveDNS(t)
		for _, port := range []string{"80", "443", HoldPort, SourcePort} {
			ln, err := net.Listen("tcp4", "0.0.0.0:"+port)
			if err != nil {
				t.Error(err)
				return
			}
			t.Cleanup(func() { ln.Close() })
			switch port {
			case HoldPort:
				go hold(ln)
			case SourcePort:
				go source(ln)
			default:
				go Serve(ln)
			}
		}
	})
}

// serveDNS answers the fake internet's names on DNS (in its namespace).
func serveDNS(t testing.TB) {
	names := map[string]string{MirrorName + ".": Mirror, FilesName + ".": Mirror, ElsewhereName + ".": Elsewhere}
	h := dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		out := new(dns.Msg)
		out.SetReply(q)
		qs := q.Question[0]
		addr, ok := names[strings.ToLower(qs.Name)]
		switch {
		case !ok:
			out.SetRcode(q, dns.RcodeNameError)
		case qs.Qtype == dns.TypeA:
			out.Answer = append(out.Answer, &dns.A{Hdr: dns.RR_Header{Name: qs.Name, Rrtype: dns.TypeA,
				Class: dns.ClassINET, Ttl: TTL}, A: net.ParseIP(addr).To4()})
		}
		_ = w.WriteMsg(out)
	})
	pc, err := net.ListenPacket("udp4", DNS)
	if err != nil {
		t.Error(err)
		return
	}
	ln, err := net.Listen("tcp4", DNS)
	if err != nil {
		pc.Close()
		t.Error(err)
		return
	}
	udp, tcp := &dns.Server{PacketConn: pc, Handler: h}, &dns.Server{Listener: ln, Handler: h}
	started := make(chan struct{}, 2)
	for _, s := range []*dns.Server{udp, tcp} {
		s.NotifyStartedFunc = func() { started <- struct{}{} }
		go func() { _ = s.ActivateAndServe() }()
	}
	<-started
	<-started
	t.Cleanup(func() { _ = udp.Shutdown(); _ = tcp.Shutdown() })
}

// HoldPort greets and keeps the connection open until the client closes.
const HoldPort = "8080"

func hold(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			_, _ = c.Write([]byte("hello"))
			_, _ = io.Copy(io.Discard, c)
		}()
	}
}

// Serve greets every connection with "hello" and closes it.
func Serve(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		_, _ = c.Write([]byte("hello"))
		c.Close()
	}
}

// Dial connects from inside pid's namespace; nil when it reads the
// greeting.
func Dial(t testing.TB, pid int, addr string) error {
	var err error
	InNS(t, pid, func() {
		var c net.Conn
		c, err = net.DialTimeout("tcp4", addr, 3*time.Second)
		if err != nil {
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		b := make([]byte, 5)
		_, err = c.Read(b)
	})
	return err
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func cidr(s string) *net.IPNet {
	ip, n, _ := net.ParseCIDR(s)
	n.IP = ip
	return n
}
