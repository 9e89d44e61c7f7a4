package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/warrenhq/warren/api"
)

// Subjects.
const (
	subjectEdgePrefix = "warren.edge."
	SubjectHeartbeat  = "warren.heartbeat"
	// SubjectEvents prefixes the event stream's subjects (warren.events.<type>).
	SubjectEvents = "warren.events"
	// SubjectAPIServerHeartbeat carries the apiservers' presence (each
	// replica learns how many share the quotas).
	SubjectAPIServerHeartbeat = "warren.apiserver.heartbeat"
)

// Buckets and streams.
const (
	BucketRoster = "warren-roster" // node -> ids of its live sandboxes
	StreamEvents = "warren-events"
)

// Message headers of the request/stream pattern.
const (
	hdrOp     = "Warren-Op"
	hdrKind   = "Warren-Kind"
	hdrStream = "Warren-Stream"

	kindChunk = "chunk"
	kindDone  = "done"
	kindError = "error"
	kindPing  = "ping"
)

// keepaliveEvery is how often a busy handler proves it is alive; a caller
// gives up after idleLimit without any message.
// A caller that has heard nothing for probeEvery pings the subject.
const (
	keepaliveEvery = 5 * time.Second
	idleLimit      = 20 * time.Second
	probeEvery     = 500 * time.Millisecond
)

// ErrNoResponders means nothing serves the subject (the node is not up).
var ErrNoResponders = errors.New("bus: no responders")

// Conn is a NATS connection with warren's request/stream helpers.
type Conn struct {
	nc *nats.Conn
	js jetstream.JetStream

	// One wildcard subscription answers every call that streams nothing
	// back (most calls): no SUB/UNSUB per request.
	muxOnce   sync.Once
	muxErr    error
	muxPrefix string
	muxCalls  sync.Map // token -> chan *nats.Msg
	muxSeq    atomic.Uint64
	// edge: the connection has an edge's credentials (it opens buckets
	// and streams but does not make them).
	edge bool
	// Replicas is the replication factor of the KV buckets and streams this
	// connection creates (1 on one server; 3 on a three-server cluster).
	Replicas int
}

func newConn(nc *nats.Conn) (*Conn, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("bus: jetstream: %w", err)
	}
	return &Conn{nc: nc, js: js}, nil
}

// DialConfig says how to reach an external NATS server or cluster.
type DialConfig struct {
	URLs     string // comma-separated nats:// or tls:// URLs
	Name     string // connection name shown by the server
	Creds    string // a .creds file (JWT + NKey seed)
	NKeySeed string // a file holding an NKey seed
	User     string
	Password string
	Token    string
	TLSCA    string // CA bundle that signs the servers' certificates
	TLSCert  string // client certificate (mutual TLS), with TLSKey
	TLSKey   string
	Replicas int // replication of buckets and streams this process creates; 0 = 1
	// Role (RoleAPIServer or RoleEdge) and Node (an edge's name) choose the
	// connection's inbox prefix, which the role's permissions allow.
	Role, Node string
}

// DialPatience is how long Dial retries when no server answers yet.
var DialPatience = time.Minute

// Dial connects to an external NATS server or cluster.
func Dial(cfg DialConfig, extra ...nats.Option) (*Conn, error) {
	if strings.TrimSpace(cfg.URLs) == "" {
		return nil, errors.New("bus: no NATS URL given")
	}
	opts := []nats.Option{nats.Name(cfg.Name), nats.MaxReconnects(-1), nats.ReconnectBufSize(64 << 20),
		nats.ReconnectWait(250 * time.Millisecond), nats.RetryOnFailedConnect(false)}
	if cfg.Creds != "" {
		opts = append(opts, nats.UserCredentials(cfg.Creds))
	}
	if cfg.NKeySeed != "" {
		o, err := nats.NkeyOptionFromSeed(cfg.NKeySeed)
		if err != nil {
			return nil, fmt.Errorf("bus: nkey seed: %w", err)
		}
		opts = append(opts, o)
	}
	if cfg.Role != "" {
		opts = append(opts, nats.CustomInboxPrefix(InboxPrefix(cfg.Role, cfg.Node)))
	}
	if cfg.User != "" {
		opts = append(opts, nats.UserInfo(cfg.User, cfg.Password))
	}
	if cfg.Token != "" {
		opts = append(opts, nats.Token(cfg.Token))
	}
	if cfg.TLSCA != "" {
		opts = append(opts, nats.RootCAs(cfg.TLSCA))
	}
	if cfg.TLSCert != "" || cfg.TLSKey != "" {
		if cfg.TLSCert == "" || cfg.TLSKey == "" {
			return nil, errors.New("bus: a TLS client certificate needs both the certificate and the key")
		}
		opts = append(opts, nats.ClientCert(cfg.TLSCert, cfg.TLSKey))
	}
	opts = append(opts, extra...)
	// Servers may still be starting (a cluster brought up together): retry
	// the first connection for a while.
	var nc *nats.Conn
	var err error
	deadline := time.Now().Add(DialPatience)
	for {
		nc, err = nats.Connect(cfg.URLs, opts...)
		if err == nil || !errors.Is(err, nats.ErrNoServers) || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		return nil, fmt.Errorf("bus: connect %s: %w", cfg.URLs, err)
	}
	c, err := newConn(nc)
	if err != nil {
		return nil, err
	}
	c.Replicas = cfg.Replicas
	c.edge = cfg.Role == RoleEdge
	return c, nil
}

func (c *Conn) replicas() int {
	if c.Replicas < 1 {
		return 1
	}
	return c.Replicas
}

// NATS exposes the raw connection (for the few callers that need it).
func (c *Conn) NATS() *nats.Conn { return c.nc }

// JetStream exposes the JetStream context.
func (c *Conn) JetStream() jetstream.JetStream { return c.js }

// Close drains and closes the connection.
func (c *Conn) Close() {
	_ = c.nc.Drain()
	c.nc.Close()
}

// opPing is answered by Serve itself: it proves the serving process alive.
const opPing = "_ping"

// Ping asks whoever serves prefix whether it is alive: nil when it answers
// within ctx; ErrNoResponders when nothing serves it (its process is gone).
func (c *Conn) Ping(ctx context.Context, prefix string) error {
	return c.CallRaw(ctx, prefix, opPing, nil, nil, nil)
}

// EdgeSubject is the subject prefix an edge named node serves.
func EdgeSubject(node string) string { return subjectEdgePrefix + node }

// Chunk is one piece of streamed data in an answer.
type Chunk struct {
	Stream string
	Data   []byte
}

// Call sends one request (op with a JSON body) to subject and waits for the
// answer. Chunks go to onChunk in order; the final JSON body is decoded into
// out. An error answered by the handler comes back as *api.Error.
func (c *Conn) Call(ctx context.Context, subject, op string, req any, out any, onChunk func(Chunk) error) error {
	body, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("bus: encode %s: %w", op, err)
	}
	return c.CallRaw(ctx, subject, op, body, out, onChunk)
}

// CallRaw is Call with a pre-encoded body.
func (c *Conn) CallRaw(ctx context.Context, subject, op string, body []byte, out any, onChunk func(Chunk) error) error {
	var inbox string
	var ch chan *nats.Msg
	if onChunk == nil {
		if err := c.startMux(); err != nil {
			return err
		}
		token := strconv.FormatUint(c.muxSeq.Add(1), 36)
		inbox = c.muxPrefix + token
		ch = make(chan *nats.Msg, 16)
		c.muxCalls.Store(token, ch)
		defer c.muxCalls.Delete(token)
	} else {
		inbox = c.nc.NewRespInbox()
		ch = make(chan *nats.Msg, 256)
		sub, err := c.nc.ChanSubscribe(inbox, ch)
		if err != nil {
			return fmt.Errorf("bus: subscribe: %w", err)
		}
		defer sub.Unsubscribe()
		_ = sub.SetPendingLimits(-1, 512<<20)
	}

	msg := requestMsg(ctx, subject, op, inbox, body)
	if err := c.nc.PublishMsg(msg); err != nil {
		return fmt.Errorf("bus: publish %s: %w", op, err)
	}
	return c.awaitAnswer(ctx, subject, op, ch, out, onChunk)
}

// requestMsg is the message of a call of op on subject, answered to inbox:
// the op and the headers ctx carries (outHeadersKey) on it, and a call that
// names no scope made as root.
func requestMsg(ctx context.Context, subject, op, inbox string, body []byte) *nats.Msg {
	msg := nats.NewMsg(subject + "." + op)
	msg.Reply = inbox
	msg.Header.Set(hdrOp, op)
	h, _ := ctx.Value(outHeadersKey{}).(map[string]string)
	for k, v := range h {
		msg.Header.Set(k, v)
	}
	if _, scoped := h[HeaderScope]; !scoped {
		msg.Header.Set(HeaderRoot, "1") // a call that names no scope is made as root
	}
	msg.Data = body
	return msg
}

// awaitAnswer takes the answer of a call of op on subject from ch until
// its end (see Call), while ctx lasts. A call that stays silent is probed
// every probeEvery: a ping that nothing serves means the serving process
// is gone (killed with the call in flight), and the call fails at once
// rather than after idleLimit, which remains for a process that is alive
// but stuck.
func (c *Conn) awaitAnswer(ctx context.Context, subject, op string, ch chan *nats.Msg, out any, onChunk func(Chunk) error) error {
	tick := time.NewTimer(probeEvery)
	defer tick.Stop()
	last := time.Now()
	var probe chan error // set while a probe is out
	var chunkErr error
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			if time.Since(last) >= idleLimit {
				return &api.Error{Code: api.CodeUnavailable, Message: "node stopped answering"}
			}
			if probe == nil && op != opPing {
				probe = make(chan error, 1)
				go func(probe chan error) {
					pctx, cancel := context.WithTimeout(ctx, probeEvery)
					defer cancel()
					probe <- c.Ping(pctx, subject)
				}(probe)
			}
			tick.Reset(probeEvery)
		case err := <-probe:
			probe = nil
			if errors.Is(err, ErrNoResponders) {
				return ErrNoResponders
			}
		case m := <-ch:
			last = time.Now()
			if end, err := answerMsg(m, op, out, onChunk, &chunkErr); end {
				return err
			}
		}
	}
}

// answerMsg takes one message m of op's answer: a chunk goes to onChunk
// (until it fails: *chunkErr), and the answer's end (an error, or done
// with its body decoded into out) ends the call with the error returned.
func answerMsg(m *nats.Msg, op string, out any, onChunk func(Chunk) error, chunkErr *error) (end bool, err error) {
	if m.Header.Get("Status") == "503" {
		return true, ErrNoResponders
	}
	switch m.Header.Get(hdrKind) {
	case kindPing:
	case kindChunk:
		if onChunk != nil && *chunkErr == nil {
			*chunkErr = onChunk(Chunk{Stream: m.Header.Get(hdrStream), Data: m.Data})
		}
	case kindError:
		e := new(api.Error)
		if err := json.Unmarshal(m.Data, e); err != nil || e.Code == "" {
			return true, &api.Error{Code: api.CodeInternal, Message: "malformed error answer"}
		}
		return true, e
	case kindDone:
		if *chunkErr != nil {
			return true, *chunkErr
		}
		if out != nil && len(m.Data) > 0 {
			if err := json.Unmarshal(m.Data, out); err != nil {
				return true, fmt.Errorf("bus: decode %s answer: %w", op, err)
			}
		}
		return true, nil
	default:
		return true, fmt.Errorf("bus: answer of unknown kind %q", m.Header.Get(hdrKind))
	}
	return false, nil
}

// startMux subscribes the shared reply inbox once.
func (c *Conn) startMux() error {
	c.muxOnce.Do(func() {
		c.muxPrefix = c.nc.NewRespInbox() + "."
		sub, err := c.nc.Subscribe(c.muxPrefix+"*", func(m *nats.Msg) {
			token := m.Subject[len(c.muxPrefix):]
			v, ok := c.muxCalls.Load(token)
			if !ok {
				return // the caller gave up
			}
			select {
			case v.(chan *nats.Msg) <- m:
			default: // a caller without streams gets a few pings and one answer
			}
		})
		if err != nil {
			c.muxErr = fmt.Errorf("bus: subscribe: %w", err)
			return
		}
		_ = sub.SetPendingLimits(-1, 512<<20)
	})
	return c.muxErr
}

// Handler serves one request. It streams chunks with w.Chunk and returns the
// final answer (encoded as JSON) or an error (an *api.Error keeps its code).
type Handler func(ctx context.Context, op string, body []byte, w *Replier) (any, error)

// Replier sends the chunks of one answer.
type Replier struct {
	nc    *nats.Conn
	reply string
	mu    sync.Mutex
	// fn, when set, takes the chunks instead (a call that came over the
	// data plane, see FuncReplier).
	fn func(stream string, data []byte) error
}

// FuncReplier is a Replier whose chunks go to fn: a handler written for
// bus calls serves a data-plane call with it.
func FuncReplier(fn func(stream string, data []byte) error) *Replier { return &Replier{fn: fn} }

// Chunk sends one piece of streamed data.
func (w *Replier) Chunk(stream string, data []byte) error {
	if w.fn != nil {
		return w.fn(stream, data)
	}
	m := nats.NewMsg(w.reply)
	m.Header.Set(hdrKind, kindChunk)
	if stream != "" {
		m.Header.Set(hdrStream, stream)
	}
	m.Data = data
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.nc.PublishMsg(m)
}

func (w *Replier) send(kind string, data []byte) {
	m := nats.NewMsg(w.reply)
	m.Header.Set(hdrKind, kind)
	m.Data = data
	w.mu.Lock()
	defer w.mu.Unlock()
	_ = w.nc.PublishMsg(m)
}

// Serve answers every request sent to prefix.<op>, each in its own
// goroutine. queue, when set, spreads requests over a queue group.
func (c *Conn) Serve(ctx context.Context, prefix, queue string, h Handler) (*nats.Subscription, error) {
	return c.ServeOwned(ctx, prefix, queue, h, nil)
}

// ServeOwned is Serve with each request's goroutine (the handler and its
// answer) started by spawn, so that its owner can wait for the requests in
// flight; a request spawn refuses (its owner is closing) is answered
// unavailable at once. A nil spawn starts plain goroutines.
func (c *Conn) ServeOwned(ctx context.Context, prefix, queue string, h Handler, spawn func(func()) bool) (*nats.Subscription, error) {
	cb := func(m *nats.Msg) {
		if m.Reply == "" {
			return
		}
		if spawn == nil {
			go c.handle(ctx, m, h)
			return
		}
		if !spawn(func() { c.handle(ctx, m, h) }) {
			c.refuse(m)
		}
	}
	var sub *nats.Subscription
	var err error
	if queue != "" {
		sub, err = c.nc.QueueSubscribe(prefix+".>", queue, cb)
	} else {
		sub, err = c.nc.Subscribe(prefix+".>", cb)
	}
	if err != nil {
		return nil, fmt.Errorf("bus: serve %s: %w", prefix, err)
	}
	_ = sub.SetPendingLimits(-1, 512<<20)
	return sub, nil
}

// refuse answers a request its server no longer takes (it is closing):
// a ping still finds the process alive (its calls in flight go on),
// anything else is unavailable.
func (c *Conn) refuse(m *nats.Msg) {
	w := &Replier{nc: c.nc, reply: m.Reply}
	if opOf(m) == opPing {
		w.send(kindDone, nil)
		return
	}
	b, _ := json.Marshal(&api.Error{Code: api.CodeUnavailable, Message: "the node is shutting down"})
	w.send(kindError, b)
}

func opOf(m *nats.Msg) string {
	if op := m.Header.Get(hdrOp); op != "" {
		return op
	}
	return m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
}

func (c *Conn) handle(ctx context.Context, m *nats.Msg, h Handler) {
	w := &Replier{nc: c.nc, reply: m.Reply}
	op := opOf(m)
	if op == opPing {
		w.send(kindDone, nil) // alive (the handler is not involved)
		return
	}
	ctx = context.WithValue(ctx, inHeadersKey{}, m.Header)
	// A timer, not a goroutine, proves a slow handler alive: most answer
	// long before the first ping is due.
	var pingMu sync.Mutex
	stopped := false
	var ping *time.Timer
	pingMu.Lock()
	ping = time.AfterFunc(keepaliveEvery, func() {
		pingMu.Lock()
		defer pingMu.Unlock()
		if stopped {
			return
		}
		w.send(kindPing, nil)
		ping.Reset(keepaliveEvery)
	})
	pingMu.Unlock()
	out, err := safeCall(ctx, h, op, m.Data, w)
	pingMu.Lock()
	stopped = true
	ping.Stop()
	pingMu.Unlock()
	if b, failed := api.AnswerBody(out, err); failed {
		w.send(kindError, b)
	} else {
		w.send(kindDone, b)
	}
}

func safeCall(ctx context.Context, h Handler, op string, body []byte, w *Replier) (out any, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("handler panic in %s: %v", op, r)
		}
	}()
	return h(ctx, op, body, w)
}

// Publish sends a fire-and-forget message (heartbeats, events).
func (c *Conn) Publish(subject string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return c.nc.Publish(subject, b)
}

// Subscribe delivers every message on subject to fn.
func (c *Conn) Subscribe(subject string, fn func(data []byte)) (*nats.Subscription, error) {
	return c.nc.Subscribe(subject, func(m *nats.Msg) { fn(m.Data) })
}

// KeyValue opens (creating when missing) a JetStream KV bucket. A cluster
// that is still electing its leaders answers late: it retries for a minute.
func (c *Conn) KeyValue(ctx context.Context, bucket string, ttl time.Duration) (jetstream.KeyValue, error) {
	cfg := jetstream.KeyValueConfig{Bucket: bucket, TTL: ttl, Storage: jetstream.FileStorage, Replicas: c.replicas()}
	kv, err := openOrCreate(ctx, c,
		func(ctx context.Context) (jetstream.KeyValue, error) { return c.js.KeyValue(ctx, bucket) },
		func(ctx context.Context) (jetstream.KeyValue, error) { return c.js.CreateKeyValue(ctx, cfg) },
		jetstream.ErrBucketExists)
	if err != nil {
		return nil, fmt.Errorf("bus: kv %s: %w", bucket, err)
	}
	return kv, nil
}

// openOrCreate returns what open finds, else what create makes (a create
// that lost the race to another process opens the winner's), retrying as
// at start-up.
// An edge's connection only opens: an apiserver makes (EnsureBuckets)
// what edges may not (see auth.go), and the edge waits for it.
func openOrCreate[T any](ctx context.Context, c *Conn, open, create func(context.Context) (T, error), exists error) (T, error) {
	var v T
	err := RetryStartup(ctx, func(ctx context.Context) error {
		var err error
		if v, err = open(ctx); err == nil || c.edge {
			return err
		}
		v, err = create(ctx)
		if errors.Is(err, exists) {
			v, err = open(ctx)
		}
		return err
	})
	return v, err
}

// RetryStartup calls fn until it succeeds, ctx ends or a minute passes: a
// JetStream cluster that is still electing its leaders (at start, or after
// a server died) answers late for a while.
func RetryStartup(ctx context.Context, fn func(context.Context) error) error {
	deadline := time.Now().Add(time.Minute)
	wait := 100 * time.Millisecond
	for {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := fn(cctx)
		cancel()
		if err == nil || ctx.Err() != nil || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		if wait < 2*time.Second {
			wait *= 2
		}
	}
}

func netSplit(addr string) (string, string, error) { return net.SplitHostPort(addr) }

type outHeadersKey struct{}
type inHeadersKey struct{}

// WithHeaders makes the calls made with ctx carry these message headers
// (the apiserver tells an edge on whose behalf it asks).
func WithHeaders(ctx context.Context, h map[string]string) context.Context {
	return context.WithValue(ctx, outHeadersKey{}, h)
}

// WithIncoming makes ctx carry h as the headers of the request a handler
// serves (a data-plane call, whose grant says what a bus call's headers do).
func WithIncoming(ctx context.Context, h map[string]string) context.Context {
	nh := nats.Header{}
	for k, v := range h {
		nh.Set(k, v)
	}
	return context.WithValue(ctx, inHeadersKey{}, nh)
}

// HeaderOf returns a header of the request a handler serves ("" if absent)
// and whether it was present.
func HeaderOf(ctx context.Context, key string) (string, bool) {
	h, ok := ctx.Value(inHeadersKey{}).(nats.Header)
	if !ok || h == nil {
		return "", false
	}
	v, ok := h[key]
	if !ok || len(v) == 0 {
		return "", false
	}
	return v[0], true
}

// Headers the apiserver sets on requests to edges.
const (
	// HeaderScope limits a request to sandboxes of this project and its
	// descendants; absent = no limit (cluster admins, internal callers).
	HeaderScope = "Warren-Scope"
	// HeaderSandbox names the sandbox a request is about.
	HeaderSandbox = "Warren-Sandbox"
	// HeaderRoot marks a request made without a scope (cluster admins,
	// internal callers): an edge refuses a request that carries neither a
	// scope nor this marker. Only apiservers may publish to edges (see
	// auth.go), so the headers an edge sees were set by an apiserver.
	HeaderRoot = "Warren-Root"
)

// Unscoped reports whether the request a handler serves was explicitly
// made without a scope (HeaderRoot set).
func Unscoped(ctx context.Context) bool {
	v, ok := HeaderOf(ctx, HeaderRoot)
	return ok && v == "1"
}
