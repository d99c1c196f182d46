package redislock

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/resp"
)

// A pipeConn is a Backend's own connection to one Redis server, on which
// the script calls of all its goroutines are pipelined: a call is written
// as soon as no other write is under way, without waiting for the replies
// of earlier calls, and one reader goroutine hands every reply to its
// caller in order (see doc.go, Pipelining). It is dialled on first use
// with the go-redis client's address, dialer, credentials and database,
// and again after a failure.
type pipeConn struct {
	opt *redis.Options

	mu      sync.Mutex
	cur     *wire         // the live connection, nil before the first dial or after a failure
	dialing chan struct{} // closed when the dial under way ends
	dialErr error         // that dial's failure
	closed  bool
}

// newPipeConn returns a pipeConn for the server behind rdb, or nil when
// rdb is not a client of one server this package can dial itself: a
// ClusterClient, a Sentinel failover client (go-redis moves its
// connections at a fail-over), or a client with an OnConnect hook or a
// streaming credentials provider, which only go-redis can run.
func newPipeConn(rdb Client) *pipeConn {
	c, ok := rdb.(*redis.Client)
	if !ok {
		return nil
	}
	o := c.Options()
	if o.Addr == "FailoverClient" || o.OnConnect != nil || o.StreamingCredentialsProvider != nil || o.Dialer == nil {
		return nil
	}
	return &pipeConn{opt: o}
}

// run runs script s with keys and args and returns its reply as go-redis
// would (redis.Nil for a nil reply). A script the server does not have
// (NOSCRIPT) is sent again by its source.
func (pc *pipeConn) run(ctx context.Context, s *redis.Script, keys []string, args []any) (any, error) {
	c := scriptCall{s, keys, args}
	v, err := pc.do(ctx, "EVALSHA", &c)
	if noScriptReply(err) {
		v, err = pc.do(ctx, "EVAL", &c)
	}
	return v, err
}

// runMany runs calls in one write and returns their replies as
// commands, as runScripts does. Those that got NOSCRIPT are sent again in
// one write behind a SCRIPT LOAD of each of their scripts (not with their
// sources: a renewal of 100,000 leases would send a gigabyte).
func (pc *pipeConn) runMany(ctx context.Context, calls []scriptCall) []*redis.Cmd {
	cs := make([]*scriptCall, len(calls))
	for i := range calls {
		cs[i] = &calls[i]
	}
	vs, errs := pc.doMany(ctx, nil, cs)
	var again []int
	for i, err := range errs {
		if noScriptReply(err) {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		var loads []*redis.Script
		retry := make([]*scriptCall, len(again))
		for j, i := range again {
			retry[j] = cs[i]
			if !slices.Contains(loads, cs[i].s) {
				loads = append(loads, cs[i].s)
			}
		}
		rv, rerrs := pc.doMany(ctx, loads, retry)
		for j, i := range again {
			vs[i], errs[i] = rv[j], rerrs[j]
		}
	}
	cmds := make([]*redis.Cmd, len(calls))
	for i := range cmds {
		cmds[i] = redis.NewCmd(ctx)
		cmds[i].SetVal(vs[i])
		cmds[i].SetErr(errs[i])
	}
	return cmds
}

func noScriptReply(err error) bool {
	e, ok := err.(resp.Error)
	return ok && strings.HasPrefix(string(e), "NOSCRIPT")
}

// do sends one call with cmd (EVALSHA, or EVAL with its source) and waits
// for its reply or the end of ctx, as doMany does for several.
func (pc *pipeConn) do(ctx context.Context, cmd string, c *scriptCall) (any, error) {
	w, err := pc.wire(ctx)
	if err == nil {
		err = ctx.Err() // ended meanwhile: not sent
	}
	if err != nil {
		return nil, err
	}
	p := pcallPool.Get().(*pcall)
	p.buf = c.append(p.buf[:0], cmd)
	if err := w.send(p); err != nil {
		p.recycle()
		return nil, err
	}
	select {
	case <-p.done:
		v, err := p.v, p.err
		p.recycle()
		return v, err
	case <-ctx.Done():
		// The reader still signals p.done: p cannot be reused.
		return nil, ctx.Err()
	}
}

// append appends c as a command: EVALSHA, or EVAL with the script's
// source.
func (c *scriptCall) append(b []byte, cmd string) []byte {
	script := c.s.Hash()
	if cmd == "EVAL" {
		script = scriptSource(c.s)
	}
	return appendCommand(b, cmd, script, c.keys, c.args)
}

// doMany sends a SCRIPT LOAD of each of loads, then calls (EVALSHA), in
// one write, and waits for the calls' replies or the end of ctx. When ctx
// ends first every call gets ctx's error (their replies are read and
// dropped).
func (pc *pipeConn) doMany(ctx context.Context, loads []*redis.Script, calls []*scriptCall) ([]any, []error) {
	vs, errs := make([]any, len(calls)), make([]error, len(calls))
	fail := func(err error) ([]any, []error) {
		for i := range errs {
			errs[i] = err
		}
		return vs, errs
	}
	w, err := pc.wire(ctx)
	if err == nil {
		err = ctx.Err() // ended meanwhile: not sent
	}
	if err != nil {
		return fail(err)
	}
	loads = w.toLoad(loads, calls)
	g := &pgroup{done: make(chan struct{}, 1)}
	g.left.Store(int64(len(loads) + len(calls)))
	pcs := make([]*pcall, 0, len(loads)+len(calls))
	for _, s := range loads {
		pcs = append(pcs, &pcall{buf: resp.AppendCommand(nil, "SCRIPT", "LOAD", scriptSource(s)), group: g})
	}
	for _, c := range calls {
		pcs = append(pcs, &pcall{buf: c.append(nil, "EVALSHA"), group: g})
	}
	if err := w.send(pcs...); err != nil {
		return fail(err)
	}
	select {
	case <-g.done:
		for i, p := range pcs[len(loads):] {
			vs[i], errs[i] = p.v, p.err
		}
		return vs, errs
	case <-ctx.Done():
		// Which replies came is not known without waiting for the rest:
		// all report the end of ctx.
		return fail(ctx.Err())
	}
}

// wire returns the live connection, dialling one if there is none. A
// dial runs on the first caller's goroutine, bounded by its ctx and the
// client's DialTimeout; callers meanwhile wait for it.
func (pc *pipeConn) wire(ctx context.Context) (*wire, error) {
	for {
		pc.mu.Lock()
		switch {
		case pc.closed:
			pc.mu.Unlock()
			return nil, errClosed
		case pc.cur != nil && !pc.cur.failed():
			w := pc.cur
			pc.mu.Unlock()
			return w, nil
		case pc.dialing != nil:
			ch := pc.dialing
			pc.mu.Unlock()
			select {
			case <-ch:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			pc.mu.Lock()
			err := pc.dialErr
			pc.mu.Unlock()
			if err != nil {
				return nil, err
			}
			continue
		}
		ch := make(chan struct{})
		pc.dialing, pc.cur = ch, nil
		pc.mu.Unlock()
		w, err := dialWire(ctx, pc.opt)
		pc.mu.Lock()
		pc.dialing, pc.dialErr = nil, err
		if err == nil {
			if pc.closed {
				w.fail(errClosed)
			} else {
				pc.cur = w
			}
		}
		pc.mu.Unlock()
		close(ch)
		if err != nil {
			return nil, err
		}
	}
}

// close fails every call on the connection with errClosed and closes it;
// later calls fail with errClosed too.
func (pc *pipeConn) close() {
	pc.mu.Lock()
	w := pc.cur
	pc.closed, pc.cur = true, nil
	pc.mu.Unlock()
	if w != nil {
		w.fail(errClosed)
	}
}

// A wire is one dialled connection of a pipeConn. Calls are queued, then
// written by whichever caller finds no write under way (it writes every
// call queued meanwhile too), and moved to sent as they are written; the
// reader goroutine takes the head of sent for every reply. After a
// failure every call on it fails with the same error.
type wire struct {
	nc           net.Conn
	br           *bufio.Reader
	readTimeout  time.Duration // 0: none
	writeTimeout time.Duration // 0: none

	mu      sync.Mutex
	queue   []*pcall // not written yet
	sent    []*pcall // written, in order, waiting for their replies
	writing bool
	err     error
	loaded  map[*redis.Script]bool // scripts a batch loaded (toLoad)
	out     []byte                 // the write buffer, owned by the writer
}

// A pcall is one command on a wire: its encoding, and its reply once
// done is signalled (once).
type pcall struct {
	buf  []byte
	v    any
	err  error
	done chan struct{}
	// group, when set, is signalled instead of done once every call of
	// its batch has its reply (doMany): one wake-up for the batch.
	group *pgroup
}

// A pgroup is the calls of one doMany.
type pgroup struct {
	left atomic.Int64
	done chan struct{}
}

// finish records that c has its reply (v, err set) and tells its waiter.
func (c *pcall) finish() {
	if g := c.group; g != nil {
		if g.left.Add(-1) == 0 {
			g.done <- struct{}{}
		}
		return
	}
	c.done <- struct{}{}
}

var pcallPool = sync.Pool{New: func() any { return &pcall{done: make(chan struct{}, 1)} }}

// recycle puts c, done with, back in the pool.
func (c *pcall) recycle() {
	c.v, c.err = nil, nil
	if cap(c.buf) > 4096 {
		c.buf = nil
	}
	pcallPool.Put(c)
}

// timeout turns a go-redis timeout setting into a deadline span: -1 and
// -2 (no timeout, no deadline) give 0.
func timeout(d time.Duration) time.Duration { return max(d, 0) }

// dialWire dials the server with the client's dialer and readies the
// connection as go-redis would (AUTH, SELECT, CLIENT SETNAME), on RESP2.
func dialWire(ctx context.Context, o *redis.Options) (*wire, error) {
	if o.DialTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.DialTimeout)
		defer cancel()
	}
	nc, err := o.Dialer(ctx, o.Network, o.Addr)
	if err != nil {
		return nil, err
	}
	w := &wire{nc: nc, br: bufio.NewReaderSize(nc, 32<<10), readTimeout: timeout(o.ReadTimeout), writeTimeout: timeout(o.WriteTimeout)}
	if err := w.handshake(ctx, o); err != nil {
		nc.Close()
		return nil, err
	}
	go w.read()
	return w, nil
}

// handshake authenticates the connection and selects the database, before
// the reader starts.
func (w *wire) handshake(ctx context.Context, o *redis.Options) error {
	user, pass := o.Username, o.Password
	var err error
	switch {
	case o.CredentialsProviderContext != nil:
		user, pass, err = o.CredentialsProviderContext(ctx)
	case o.CredentialsProvider != nil:
		user, pass = o.CredentialsProvider()
	}
	if err != nil {
		return err
	}
	var cmds [][]string
	if pass != "" {
		if user == "" {
			user = "default" // as go-redis' HELLO does
		}
		cmds = append(cmds, []string{"AUTH", user, pass})
	}
	if o.DB != 0 {
		cmds = append(cmds, []string{"SELECT", strconv.Itoa(o.DB)})
	}
	if o.ClientName != "" {
		cmds = append(cmds, []string{"CLIENT", "SETNAME", o.ClientName})
	}
	if len(cmds) == 0 {
		return nil
	}
	var buf []byte
	for _, c := range cmds {
		buf = resp.AppendCommand(buf, c...)
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(max(w.readTimeout, 5*time.Second))
	}
	w.nc.SetDeadline(deadline)
	defer w.nc.SetDeadline(time.Time{})
	if _, err := w.nc.Write(buf); err != nil {
		return err
	}
	for _, c := range cmds {
		if _, err := readReply(w.br); err != nil {
			return fmt.Errorf("redislock: %s: %w", c[0], err)
		}
	}
	return nil
}

// toLoad returns loads and the scripts of calls not loaded on w yet (by
// an earlier batch), and records them as loaded: a batch on a fresh
// connection (the renewal connection's first) loads its scripts in the
// same write instead of learning of them from NOSCRIPT, a round trip
// later.
func (w *wire) toLoad(loads []*redis.Script, calls []*scriptCall) []*redis.Script {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.loaded == nil {
		w.loaded = map[*redis.Script]bool{}
	}
	for _, s := range loads {
		w.loaded[s] = true
	}
	for _, c := range calls {
		if !w.loaded[c.s] {
			w.loaded[c.s] = true
			loads = append(loads, c.s)
		}
	}
	return loads
}

func (w *wire) failed() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err != nil
}

// send queues cs and, if no write is under way, writes them and every
// call queued until the queue is empty.
func (w *wire) send(cs ...*pcall) error {
	w.mu.Lock()
	if w.err != nil {
		err := w.err
		w.mu.Unlock()
		return err
	}
	w.queue = append(w.queue, cs...)
	if w.writing {
		w.mu.Unlock()
		return nil
	}
	w.writing = true
	// Let the goroutines that are about to call too queue their calls, so
	// that one write carries them all: under load it cuts the writes
	// (and the server's reads) about fivefold.
	w.mu.Unlock()
	runtime.Gosched()
	w.mu.Lock()
	for len(w.queue) > 0 && w.err == nil {
		out := w.out[:0]
		for _, q := range w.queue {
			out = append(out, q.buf...)
		}
		// Into sent before the bytes leave: a reply can come at once.
		w.sent = append(w.sent, w.queue...)
		clear(w.queue)
		w.queue = w.queue[:0]
		if w.readTimeout > 0 {
			w.nc.SetReadDeadline(time.Now().Add(w.readTimeout))
		}
		w.mu.Unlock()
		if w.writeTimeout > 0 {
			w.nc.SetWriteDeadline(time.Now().Add(w.writeTimeout))
		}
		_, err := w.nc.Write(out)
		if cap(out) <= 64<<10 {
			w.out = out
		}
		if err != nil {
			w.fail(err)
		}
		w.mu.Lock()
	}
	w.writing = false
	w.mu.Unlock()
	return nil
}

// read is the reader goroutine: it hands every reply to the oldest call
// sent, until the connection fails.
func (w *wire) read() {
	for {
		v, err := readReply(w.br)
		if err != nil && !isReply(err) {
			w.fail(err)
			return
		}
		w.mu.Lock()
		if len(w.sent) == 0 {
			w.mu.Unlock()
			w.fail(errors.New("redislock: reply without a command"))
			return
		}
		c := w.sent[0]
		w.sent[0] = nil
		w.sent = w.sent[1:]
		if len(w.sent) == 0 {
			w.sent = w.sent[:0:0]
			if w.readTimeout > 0 {
				w.nc.SetReadDeadline(time.Time{})
			}
		} else if w.readTimeout > 0 {
			w.nc.SetReadDeadline(time.Now().Add(w.readTimeout))
		}
		w.mu.Unlock()
		c.v, c.err = v, err
		c.finish()
	}
}

// fail closes the connection and fails every call on it with err (the
// first failure wins).
func (w *wire) fail(err error) {
	w.mu.Lock()
	if w.err != nil {
		w.mu.Unlock()
		return
	}
	w.err = err
	calls := append(w.sent, w.queue...)
	w.sent, w.queue = nil, nil
	w.mu.Unlock()
	w.nc.Close()
	for _, c := range calls {
		c.v, c.err = nil, err
		c.finish()
	}
}

// appendCommand appends cmd script numkeys keys... args... in RESP.
func appendCommand(b []byte, cmd, script string, keys []string, args []any) []byte {
	b = resp.AppendHeader(b, '*', 3+len(keys)+len(args))
	b = resp.AppendBulk(b, cmd)
	b = resp.AppendBulk(b, script)
	b = resp.AppendBulk(b, strconv.Itoa(len(keys)))
	for _, k := range keys {
		b = resp.AppendBulk(b, k)
	}
	for _, a := range args {
		b = appendArg(b, a)
	}
	return b
}

// appendArg appends one argument as go-redis writes it.
func appendArg(b []byte, a any) []byte {
	switch a := a.(type) {
	case string:
		return resp.AppendBulk(b, a)
	case []byte:
		b = resp.AppendHeader(b, '$', len(a))
		b = append(b, a...)
		return append(b, '\r', '\n')
	case int:
		return resp.AppendBulk(b, strconv.Itoa(a))
	case int64:
		return resp.AppendBulk(b, strconv.FormatInt(a, 10))
	case uint64:
		return resp.AppendBulk(b, strconv.FormatUint(a, 10))
	case bool:
		if a {
			return resp.AppendBulk(b, "1")
		}
		return resp.AppendBulk(b, "0")
	}
	return resp.AppendBulk(b, fmt.Sprint(a))
}

// readReply reads one reply as go-redis' Cmd.Result returns it: int64,
// string, []any (nil for a null element, a redis.Error for an error),
// redis.Nil for a null reply and a redis.Error for an error reply. Its
// error is a reply (redis.Nil or a resp.Error) or a failure to read one.
func readReply(br *bufio.Reader) (any, error) {
	v, err := resp.Read(br)
	switch v := v.(type) {
	case nil:
		if err == nil {
			err = redis.Nil
		}
		return nil, err
	case resp.Error:
		return nil, v
	}
	return v, err
}

// isReply reports whether err is the reply of a command (an error reply
// or redis.Nil) rather than a failure to read one.
func isReply(err error) bool {
	_, ok := err.(resp.Error)
	return ok || err == redis.Nil
}
