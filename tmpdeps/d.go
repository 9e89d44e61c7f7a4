package tmpdeps
import (
 _ "github.com/nats-io/nats-server/v2/server"
 _ "github.com/nats-io/nats.go"
 _ "github.com/nats-io/nats.go/jetstream"
 _ "github.com/containerd/cgroups/v3"
 _ "github.com/containerd/cgroups/v3/cgroup1"
 _ "github.com/elastic/go-seccomp-bpf"
 _ "github.com/spf13/cobra"
 _ "github.com/prometheus/client_golang/prometheus"
 _ "github.com/google/go-containerregistry/pkg/v1/layout"
 _ "github.com/google/go-containerregistry/pkg/v1/tarball"
 _ "golang.org/x/sys/unix"
)
