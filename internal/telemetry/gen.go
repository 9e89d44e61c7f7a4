package telemetry

// The BPF object and its Go bindings (exec_bpfel.go, exec_bpfel.o) are
// generated and checked in, so building warren needs no clang. After a
// change to bpf/exec.c, regenerate them (Debian: apt-get install clang
// llvm) with:
//
//	go generate ./internal/telemetry/
//
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang -strip llvm-strip -target bpfel -type event exec bpf/exec.c -- -O2 -g -Wall
