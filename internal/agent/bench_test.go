package agent_test

import (
	"sort"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/agentproto"
)

// BenchmarkExecRoundTrip measures a client->agent->client exec of `true`
// over the unix socket, reporting p50/p99.
func BenchmarkExecRoundTrip(b *testing.B) {
	a := startAgent(b, agentproto.SetupConfig{})
	for _, bc := range []struct {
		name string
		req  agentproto.ExecRequest
	}{
		{"argv", agentproto.ExecRequest{Argv: []string{"true"}}},
		{"cmd", agentproto.ExecRequest{Cmd: "true"}},
		{"cmd-echo", agentproto.ExecRequest{Cmd: "echo hi"}},
		{"ping", agentproto.ExecRequest{}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			lat := make([]time.Duration, 0, b.N)
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				var err error
				if bc.name == "ping" {
					err = a.c.Call(ctx(b), agentproto.OpPing, nil, nil, nil)
				} else {
					var r agentproto.ExecResult
					err = a.c.Call(ctx(b), agentproto.OpExec, &bc.req, &r, nil)
					if err == nil && r.ExitCode != 0 {
						b.Fatalf("exit %d", r.ExitCode)
					}
				}
				if err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(t0))
			}
			sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		})
	}
}
