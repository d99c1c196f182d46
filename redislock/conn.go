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

	"github.com/dlock-go/dlock/internal/ctxend"
	"github.com/dlock-go/dlock/internal/resp"
)

// A pipeConn is a Backend's own connection to one Redis server, on which
// the script calls of all its goroutines are pipelined: a call is written
// as soon as no other write is under way, without waiting for the replies
// of earlier calls, and whichever goroutine reads hands every reply to
// its caller in order (see wire, and doc.go, Pipelining). It is dialled
// on first use with the go-redis client's address, dialer, credentials
// and database, and again after a failure.
type pipeConn struct {
	opt *redis.Options

	mu      sync.Mutex
	cur     *wire         // the live connection, nil before the first dial or after a failure
	dialing chan struct{} // closed when the dial under way ends
	dialErr error         // that dial's failure, nil when its caller's context ended
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
	var slot *lateSlot
	if ctx.Done() != nil {
		slot, _ = ctx.Value(lateKey{}).(*lateSlot)
	}
	v, err := pc.do(ctx, "EVALSHA", &c, slot)
	if noScriptReply(err) {
		v, err = pc.do(ctx, "EVAL", &c, slot)
	}
	return v, err
}

// A lateSlot, in a call's context (under lateKey), says what becomes of
// the reply of a call whose context ends while it is out: the connection
// hands it to fn on a goroutine of its own, and sets gaveUp.
type lateSlot struct {
	fn     func(v any, err error)
	gaveUp bool // only the caller's goroutine touches it
}

type lateKey struct{}

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
// for its reply or the end of ctx; a reply that comes after goes to
// slot's fn, if slot is not nil.
func (pc *pipeConn) do(ctx context.Context, cmd string, c *scriptCall, slot *lateSlot) (any, error) {
	w, err := pc.wire(ctx)
	if err == nil {
		err = ctx.Err() // ended meanwhile: not sent
	}
	if err != nil {
		return nil, err
	}
	p := pcallPool.Get().(*pcall)
	p.buf = c.append(p.buf[:0], cmd)
	if err := w.send(false, p); err != nil {
		p.recycle()
		return nil, err
	}
	if w.lead(p) {
		return w.readFor(ctx, p, slot)
	}
	select {
	case <-p.done:
	case <-ctx.Done():
		if w.leave(p, slot) {
			return nil, ctx.Err()
		}
		<-p.done // the reply came meanwhile
	}
	v, err := p.v, p.err
	p.recycle()
	return v, err
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
	if err := w.send(true, pcs...); err != nil {
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
// client's DialTimeout; callers meanwhile wait for it and share its
// failure, unless it failed because that caller's context ended: then
// the next of them whose context is live dials again.
func (pc *pipeConn) wire(ctx context.Context) (*wire, error) {
	for {
		pc.mu.Lock()
		switch {
		case pc.closed:
			pc.mu.Unlock()
			return nil, errClosed
		case pc.cur != nil && pc.cur.usable():
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
		shared := err
		if err != nil {
			if ctxErr := ctxend.Err(ctx); ctxErr != nil {
				// Ours alone, reported as any call whose context ends:
				// the callers waiting find no error and dial again.
				err, shared = ctxErr, nil
			}
		}
		pc.mu.Lock()
		pc.dialing, pc.dialErr = nil, shared
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
// call queued meanwhile too), and moved to sent as they are written.
// Replies are read by one goroutine at a time, the reader, who hands each
// to the oldest call sent: a caller who finds nobody reading reads until
// its own reply comes (a lone caller reads its reply itself, as a
// go-redis connection does), and leaves the rest to a reader goroutine
// that reads until no call waits. After a failure every call on it fails
// with the same error.
type wire struct {
	nc           net.Conn
	readTimeout  time.Duration // 0: none
	writeTimeout time.Duration // 0: none

	mu      sync.Mutex
	queue   []*pcall // not written yet
	sent    []*pcall // written, in order, waiting for their replies
	writing bool
	reading bool // a caller or the reader goroutine reads replies
	err     error
	loaded  map[*redis.Script]bool // scripts a batch loaded (toLoad)
	out     []byte                 // the write buffer, owned by the writer

	// The read buffer, owned by the reader: rbuf[rs:re] is read and not
	// parsed yet (a reader who leaves mid-reply leaves its start there).
	rbuf   []byte
	rs, re int
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
	// Under wire.mu: taken, out of the wire's queues (its reply is being
	// handed over); left, given up by its caller before that.
	taken, left bool
	late        func(any, error) // a left call's reply goes there
}

// A pgroup is the calls of one doMany.
type pgroup struct {
	left atomic.Int64
	done chan struct{}
}

// deliver hands c its reply: to its waiter, or to late if its caller left.
// c is out of the wire's queues.
func (c *pcall) deliver(v any, err error) {
	if c.left {
		if late := c.late; late != nil {
			go late(v, err)
		}
		c.recycle()
		return
	}
	c.v, c.err = v, err
	c.finish()
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
	c.v, c.err, c.taken, c.left, c.late = nil, nil, false, false, nil
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
	w := &wire{nc: nc, readTimeout: timeout(o.ReadTimeout), writeTimeout: timeout(o.WriteTimeout)}
	if err := w.handshake(ctx, o); err != nil {
		nc.Close()
		return nil, err
	}
	return w, nil
}

// handshake authenticates the connection and selects the database, before
// any call.
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
	br := bufio.NewReader(w.nc) // nothing follows these replies
	for _, c := range cmds {
		if _, err := readReply(br); err != nil {
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

// usable reports whether calls can go on w: it has not failed and, when
// idle, the server has not closed it meanwhile (nobody reads an idle
// connection, so its end is noticed here, as go-redis' pool does).
func (w *wire) usable() bool {
	w.mu.Lock()
	err := w.err
	if err == nil && !w.reading && !w.writing && len(w.sent) == 0 && len(w.queue) == 0 {
		if err = checkIdle(w.nc); err != nil {
			w.mu.Unlock()
			w.fail(err)
			return false
		}
	}
	w.mu.Unlock()
	return err == nil
}

// send queues cs and, if no write is under way, writes them and every
// call queued until the queue is empty. With read set a reader goroutine
// starts first if nobody reads, so that replies are read while a large
// write goes on (a batch's caller does not read: doMany).
func (w *wire) send(read bool, cs ...*pcall) error {
	w.mu.Lock()
	if w.err != nil {
		err := w.err
		w.mu.Unlock()
		return err
	}
	w.queue = append(w.queue, cs...)
	if read {
		w.startReader()
	}
	if w.writing {
		w.mu.Unlock()
		return nil
	}
	w.writing = true
	if len(w.sent) > 0 {
		// Calls are out, so others are calling: let the goroutines about
		// to call queue their calls too, so that one write carries them
		// all; under load it cuts the writes (and the server's reads)
		// about fivefold. A lone caller does not wait.
		w.mu.Unlock()
		runtime.Gosched()
		w.mu.Lock()
	}
	for len(w.queue) > 0 && w.err == nil {
		out := w.out[:0]
		for _, q := range w.queue {
			out = append(out, q.buf...)
		}
		// Into sent before the bytes leave: a reply can come at once.
		w.sent = append(w.sent, w.queue...)
		clear(w.queue)
		w.queue = w.queue[:0]
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

// errLeft is next's error when the reading caller's context ended.
var errLeft = errors.New("redislock: the reader left")

// lead makes p's caller the reader if nobody reads and p's reply has not
// come, and reports whether it did.
func (w *wire) lead(p *pcall) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.reading || w.err != nil || p.taken {
		return false
	}
	w.reading = true
	return true
}

// leave gives p up, its reply to go to slot's fn, if slot is not nil, and
// reports whether it did: not when p's reply is being handed over.
func (w *wire) leave(p *pcall, slot *lateSlot) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.leaveLocked(p, slot)
}

// leaveLocked is leave with w.mu held.
func (w *wire) leaveLocked(p *pcall, slot *lateSlot) bool {
	if p.taken {
		return false
	}
	p.left = true
	if slot != nil {
		p.late, slot.gaveUp = slot.fn, true
	}
	return true
}

// readFor reads replies as the reader until p's comes, and returns it;
// when ctx ends first it gives p up (leave) and returns ctx's error.
// Either way a reader goroutine goes on if calls still wait.
func (w *wire) readFor(ctx context.Context, p *pcall, slot *lateSlot) (any, error) {
	if ctx.Done() != nil {
		// Wake the read when ctx ends (next tells it from a timeout).
		stop := context.AfterFunc(ctx, func() { w.nc.SetReadDeadline(time.Unix(1, 0)) })
		defer stop()
	}
	for {
		v, err := w.next(ctx)
		if err == errLeft {
			w.mu.Lock()
			left := w.leaveLocked(p, slot)
			w.handOff()
			w.mu.Unlock()
			if left {
				return nil, ctx.Err()
			}
			<-p.done // failed meanwhile (fail)
			v, err = p.v, p.err
			p.recycle()
			return v, err
		}
		if err != nil && !isReply(err) {
			w.fail(err)
			w.mu.Lock()
			w.reading = false
			w.mu.Unlock()
			<-p.done // failed by fail
			v, err = p.v, p.err
			p.recycle()
			return v, err
		}
		w.mu.Lock()
		c := w.pop()
		if c == p {
			w.handOff()
			w.mu.Unlock()
			p.recycle()
			return v, err
		}
		w.mu.Unlock()
		if c == nil {
			w.fail(errors.New("redislock: reply without a command"))
			continue // the next read fails
		}
		c.deliver(v, err)
	}
}

// read is the reader goroutine: it hands every reply to the oldest call
// sent until no call waits (or the connection fails).
func (w *wire) read() {
	for {
		v, err := w.next(context.Background())
		if err != nil && !isReply(err) {
			w.fail(err)
			w.mu.Lock()
			w.reading = false
			w.mu.Unlock()
			return
		}
		w.mu.Lock()
		c := w.pop()
		done := len(w.sent) == 0 && len(w.queue) == 0
		if done || c == nil {
			w.reading = false
		}
		w.mu.Unlock()
		if c == nil {
			w.fail(errors.New("redislock: reply without a command"))
			return
		}
		c.deliver(v, err)
		if done {
			return
		}
	}
}

// handOff is the reading caller's leaving: a reader goroutine goes on if
// calls still wait. w.mu is held.
func (w *wire) handOff() {
	w.reading = false
	w.startReader()
}

// startReader starts the reader goroutine if calls wait and nobody reads;
// w.mu is held.
func (w *wire) startReader() {
	if !w.reading && w.err == nil && len(w.sent)+len(w.queue) > 0 {
		w.reading = true
		go w.read()
	}
}

// pop removes the oldest call sent and returns it, or nil if there is
// none; w.mu is held.
func (w *wire) pop() *pcall {
	if len(w.sent) == 0 {
		return nil
	}
	c := w.sent[0]
	w.sent[0] = nil
	w.sent = w.sent[1:]
	if len(w.sent) == 0 {
		w.sent = w.sent[:0:0]
	}
	c.taken = true
	return c
}

// next returns the next reply, reading the connection as needed; only
// the reader calls it. A read waits at most the client's ReadTimeout for
// bytes; the end of ctx (the reading caller's) stops the read with
// errLeft, and what was read stays in the buffer for the next reader.
func (w *wire) next(ctx context.Context) (any, error) {
	for {
		if w.rs < w.re {
			v, n, err := resp.Parse(w.rbuf[w.rs:w.re])
			if err != nil {
				return nil, err
			}
			if n > 0 {
				w.rs += n
				if w.rs == w.re {
					w.rs, w.re = 0, 0
				}
				return result(v)
			}
		}
		if w.rs > 0 {
			w.re = copy(w.rbuf, w.rbuf[w.rs:w.re])
			w.rs = 0
		}
		if w.re == len(w.rbuf) {
			w.rbuf = slices.Grow(w.rbuf, max(4<<10, len(w.rbuf)))
			w.rbuf = w.rbuf[:cap(w.rbuf)]
		}
		var deadline time.Time
		if w.readTimeout > 0 {
			deadline = time.Now().Add(w.readTimeout)
		}
		w.nc.SetReadDeadline(deadline)
		if ctx.Err() != nil {
			return nil, errLeft
		}
		n, err := w.nc.Read(w.rbuf[w.re:])
		w.re += n
		if err == nil {
			continue
		}
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			return nil, err
		}
		switch {
		case ctx.Err() != nil:
			return nil, errLeft
		case !deadline.IsZero() && !time.Now().Before(deadline):
			return nil, err
		}
		// Woken by a reader that has left: read on.
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
	for _, c := range calls {
		c.taken = true
	}
	w.mu.Unlock()
	w.nc.Close()
	for _, c := range calls {
		c.deliver(nil, err)
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

// readReply reads one reply, as result returns it.
func readReply(br *bufio.Reader) (any, error) {
	v, err := resp.Read(br)
	if err != nil {
		return nil, err
	}
	return result(v)
}

// result returns a reply of resp.Read as go-redis' Cmd.Result does: int64,
// string, []any (nil for a null element, a resp.Error for an error),
// redis.Nil for a null reply and a resp.Error (a redis.Error) for an
// error reply.
func result(v any) (any, error) {
	switch v := v.(type) {
	case nil:
		return nil, redis.Nil
	case resp.Error:
		return nil, v
	}
	return v, nil
}

// isReply reports whether err is the reply of a command (an error reply
// or redis.Nil) rather than a failure to read one.
func isReply(err error) bool {
	_, ok := err.(resp.Error)
	return ok || err == redis.Nil
}
