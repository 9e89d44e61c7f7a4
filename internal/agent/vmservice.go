package agent

// The agent as a service of a VM that boots its own init (the vm tier's
// disk images, internal/runtime/vm): systemd starts it (warren-agent.service,
// scripts/vm-disk.sh) after the root file system is mounted. It assembles
// nothing: the guest's root is the image's. Like the microVM's PID 1, it
// opens the virtio-serial port exclusively and removes its device node, so
// no other process of the guest can read or forge the agent's messages.

import (
	"log/slog"
	"os"
	goruntime "runtime"
)

// VMServiceFlag is the command-line flag that starts the agent as a VM's
// service: `warren-agent --vm-service PORT`.
const VMServiceFlag = "--vm-service"

// VMServiceMain serves the agent protocol on the virtio-serial port called
// port. It never returns; it exits when the port fails (systemd logs why).
func VMServiceMain(port string) {
	goruntime.GOMAXPROCS(min(2, goruntime.NumCPU()))
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	slog.SetDefault(log)
	p, err := openPort(port)
	if err != nil {
		log.Error("agent: vm service", "port", port, "err", err)
		os.Exit(1)
	}
	log.Info("agent: serving as a vm service", "port", port)
	a := New(log)
	a.vmService, a.vm = true, true
	if err := a.Serve(p); err != nil {
		log.Error("agent: serve", "err", err)
	}
	os.Exit(1)
}
