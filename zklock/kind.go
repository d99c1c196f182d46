package zklock

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync"

	"github.com/dlock-go/dlock"
	"github.com/go-zookeeper/zk"
)

// Semaphores and read-write locks share the queue of their key with its
// lock nodes; the kind of a node, and a permit's number of permits, are
// in its name (see the package documentation, Kinds of holds).

// maxPermits bounds a semaphore's number of permits: a waiter first in
// line watches every holder.
const maxPermits = 1 << 16

// SupportsKind implements dlock.KindSupporter: KindLock, KindPermit and
// KindRead.
func (b *Backend) SupportsKind(k dlock.Kind) bool { return supported(k) }

func supported(k dlock.Kind) bool {
	switch k {
	case dlock.KindLock, dlock.KindPermit, dlock.KindRead:
		return true
	}
	return false
}

// kindPrefix is the name, without the sequence, of the node of the
// acquisition guid of a hold of kind k (permits for KindPermit).
func kindPrefix(guid string, k dlock.Kind, permits int) string {
	switch k {
	case dlock.KindRead:
		return protectedPrefix + guid + "-read" + lockInfix
	case dlock.KindPermit:
		return protectedPrefix + guid + "-sem" + strconv.Itoa(permits) + lockInfix
	}
	return nodePrefix(guid)
}

// guidLen is the length of the guid in a protected name.
const guidLen = 32

// nodeKind returns the kind of the lock node name, and its number of
// permits for KindPermit. Names zklock did not make (zk.Lock's, for
// instance) are KindLock: exclusive, the safe reading.
func nodeKind(name string) (k dlock.Kind, permits int) {
	end := strings.LastIndex(name, "lock-")
	start := len(protectedPrefix) + guidLen
	if !strings.HasPrefix(name, protectedPrefix) || end < start {
		return dlock.KindLock, 0
	}
	switch mid := name[start:end]; {
	case mid == "-read-":
		return dlock.KindRead, 0
	case strings.HasPrefix(mid, "-sem") && strings.HasSuffix(mid, "-"):
		n, err := strconv.Atoi(mid[len("-sem") : len(mid)-1])
		if err == nil && n >= 1 {
			return dlock.KindPermit, n
		}
	}
	return dlock.KindLock, 0
}

// checkKind refuses a request of an unknown kind or of fewer than one
// permit.
func checkKind(r dlock.Request) error {
	switch {
	case !supported(r.Kind):
		return fmt.Errorf("zklock: %w: %s holds", errors.ErrUnsupported, r.Kind)
	case r.Kind == dlock.KindPermit && (r.Permits < 1 || r.Permits > maxPermits):
		return fmt.Errorf("zklock: %w: a semaphore has 1..%d permits, got %d", dlock.ErrInvalidOption, maxPermits, r.Permits)
	}
	return nil
}

// encodeData returns a lock node's data: the owner token, or, when there
// is a value (an elected leader's) or the token starts with a zero byte,
// a zero byte, the token's length as a uvarint, the token and the value.
func encodeData(token, value string) []byte {
	if value == "" && (token == "" || token[0] != 0) {
		return []byte(token)
	}
	buf := make([]byte, 0, 1+binary.MaxVarintLen64+len(token)+len(value))
	buf = append(buf, 0)
	buf = binary.AppendUvarint(buf, uint64(len(token)))
	buf = append(buf, token...)
	return append(buf, value...)
}

// decodeData undoes encodeData. Data it cannot parse is all token.
func decodeData(data []byte) (token, value string) {
	if len(data) == 0 || data[0] != 0 {
		return string(data), ""
	}
	n, k := binary.Uvarint(data[1:])
	if k <= 0 || n > uint64(len(data)-1-k) {
		return string(data), ""
	}
	rest := data[1+k:]
	return string(rest[:n]), string(rest[n:])
}

// wrongKind is the error of a request whose kind does not mix with a
// node ahead of its own.
func wrongKind(key string, r dlock.Request, other dlock.Kind) error {
	return fmt.Errorf("%w: %q is held or queued for with %s holds, not %s holds", dlock.ErrWrongType, key, other, r.Kind)
}

// permitAhead reports whether a semaphore's node is ahead of name among
// children (a lock cannot queue behind it).
func permitAhead(children []string, name string) bool {
	own, _ := lockSeq(name)
	for _, c := range children {
		if !strings.Contains(c, "-sem") {
			continue
		}
		if seq, ok := lockSeq(c); ok && seq < own {
			if k, _ := nodeKind(c); k == dlock.KindPermit {
				return true
			}
		}
	}
	return false
}

// sharedWatch is a watch a waiter of a permit or read hold keeps on a
// node ahead of its own.
type sharedWatch struct {
	path   string
	holder bool // a data change is no news: watch again (else list again)
	final  bool // its deletion is the grant, while our node exists
	ch     <-chan zk.Event
}

// runShared takes a permit or read node through the queue: it lists,
// places the node by the rules of its kind (placeShared), and, while not
// granted, watches what concerns it and lists again when that changes.
func (w *waiter) runShared(ctx context.Context) (dlock.Grant, error) {
	for {
		children, err := w.list(ctx)
		if err != nil {
			if err := w.retry(ctx, err); err != nil {
				return dlock.Grant{}, err
			}
			continue
		}
		w.answered()
		watches, behind, err := w.placeShared(children)
		switch {
		case err != nil:
			return dlock.Grant{}, err
		case watches == nil:
			return w.grantShared(ctx, behind)
		case !w.wait:
			return dlock.Grant{}, nil
		}
		s, err := w.watchShared(ctx, watches)
		if err == nil && s == stepAwait {
			s, err = w.awaitShared(ctx, watches)
		}
		switch {
		case err != nil:
			if err := w.retry(ctx, err); err != nil {
				return dlock.Grant{}, err
			}
		case s == stepGrant:
			return w.grantShared(ctx, false) // a read hold: no signal
		}
	}
}

// placeShared applies the rules of the request's kind to a listing. A
// read hold is granted when no lock node (a writer's) is ahead; else it
// watches the nearest writer ahead, whose deletion is a release (then no
// writer is ahead: the writer was first) or a writer giving up (then list
// again, unless it was the only writer ahead: then that deletion is the
// grant). A permit is granted when fewer than N nodes are ahead. The
// first waiter (N ahead) watches all N, and learns of any release; a
// waiter further back watches its predecessor, which changes its data when
// it is granted (signal) — then this waiter is first — or leaves. watches
// nil is a grant; behind reports nodes behind ours.
func (w *waiter) placeShared(children []string) (watches []sharedWatch, behind bool, err error) {
	q := parseQueue(children)
	i := -1
	for j := range q {
		if q[j].name == w.name {
			i = j
			break
		}
	}
	if i < 0 {
		return nil, false, w.vanished()
	}
	behind = i < len(q)-1
	ahead := q[:i]
	if w.r.Kind == dlock.KindRead {
		writer, writers := "", 0
		for _, n := range ahead {
			switch k, _ := nodeKind(n.name); k {
			case dlock.KindPermit:
				return nil, false, wrongKind(w.r.Key, w.r, k)
			case dlock.KindLock:
				writer = n.name
				writers++
			}
		}
		if writer == "" {
			return nil, behind, nil
		}
		return []sharedWatch{{path: w.keyPath + "/" + writer, holder: true, final: writers == 1}}, behind, nil
	}
	for _, n := range ahead {
		k, permits := nodeKind(n.name)
		switch {
		case k != dlock.KindPermit:
			return nil, false, wrongKind(w.r.Key, w.r, k)
		case permits != w.r.Permits:
			return nil, false, fmt.Errorf("%w: %q has %d permits, the request says %d", dlock.ErrPermits, w.r.Key, permits, w.r.Permits)
		}
	}
	n := w.r.Permits
	switch {
	case len(ahead) < n:
		return nil, behind, nil
	case len(ahead) == n:
		for _, a := range ahead {
			watches = append(watches, sharedWatch{path: w.keyPath + "/" + a.name, holder: true})
		}
		return watches, behind, nil
	}
	return []sharedWatch{{path: w.keyPath + "/" + ahead[len(ahead)-1].name}}, behind, nil
}

// watchShared sets the watches (GetW) and, when a watch is final, an
// existence watch on our own node, pipelined. It returns stepAwait, or
// stepList to list again at once (a node already left, or a predecessor
// already signalled its grant), or stepGrant (a final node already left
// while ours exists).
func (w *waiter) watchShared(ctx context.Context, watches []sharedWatch) (step, error) {
	type res struct {
		ch  <-chan zk.Event
		st  *zk.Stat
		err error
	}
	var ownc chan result[statResult]
	for _, sw := range watches {
		if sw.final && !w.own.armed() {
			ownc = make(chan result[statResult], 1)
			go func() {
				res, err := w.b.watchOwn(ctx, w.path)
				ownc <- result[statResult]{res, err}
			}()
			break
		}
	}
	out := make([]res, len(watches))
	var wg sync.WaitGroup
	for i := range watches {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := await(ctx, func() (res, error) {
				_, st, ch, err := w.b.conn.GetW(watches[i].path)
				return res{ch, st, err}, err
			})
			r.err = err
			out[i] = r
		}()
	}
	wg.Wait()
	if ownc != nil {
		r := <-ownc
		if s, err := w.useOwn(ctx, r.v, r.err, stepAwait); err != nil || s != stepAwait {
			return s, err
		}
	}
	s := stepAwait
	var err error
	for i, r := range out {
		switch {
		case errors.Is(r.err, zk.ErrNoNode) && watches[i].final && w.own.armed():
			return stepGrant, nil
		case errors.Is(r.err, zk.ErrNoNode):
			s = stepList
		case r.err != nil:
			err = r.err
		case !watches[i].holder && r.st != nil && r.st.Version > 0 &&
			(w.signal.path != watches[i].path || w.signal.version != r.st.Version):
			// The predecessor was granted: we may be first in line. A
			// version already acted on was no grant (someone else wrote
			// the node): then wait for its next change, not list in a
			// loop.
			w.signal.path, w.signal.version = watches[i].path, r.st.Version
			s = stepList
			watches[i].ch = r.ch
		default:
			watches[i].ch = r.ch
		}
	}
	if err != nil {
		return 0, err
	}
	return s, nil
}

// awaitShared waits for an event on the watches: a holder's data change
// (a leader proclaiming, a permit's grant signal) is watched again; the
// deletion of a final node, while our node's watch has not fired, is the
// grant (stepGrant); anything else lists again (stepList).
func (w *waiter) awaitShared(ctx context.Context, watches []sharedWatch) (step, error) {
	const fixed = 3
	cases := make([]reflect.SelectCase, fixed, fixed+len(watches))
	cases[0] = reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())}
	cases[1] = reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(w.b.ctx.Done())}
	cases[2] = reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(w.own.ch())}
	for _, sw := range watches {
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(sw.ch)})
	}
	for {
		i, v, recvOK := reflect.Select(cases)
		switch {
		case i == 0:
			return 0, ctx.Err()
		case i == 1:
			return 0, errClosed
		case i == 2:
			if recvOK && v.Interface().(zk.Event).Type == zk.EventNodeDeleted {
				return 0, w.vanished()
			}
			w.own.watch = nil // no longer watched: no shortcut
			cases[2].Chan = reflect.ValueOf((<-chan zk.Event)(nil))
			continue
		}
		sw := watches[i-fixed]
		var ev zk.Event
		if recvOK {
			ev = v.Interface().(zk.Event)
		}
		switch {
		case ev.Type == zk.EventNodeDeleted && sw.final && w.own.armed():
			return stepGrant, nil
		case !recvOK || !sw.holder || ev.Type != zk.EventNodeDataChanged:
			return stepList, nil
		}
		ch, err := w.b.watchNode(ctx, sw.path)
		if err != nil {
			return stepList, nil // gone, or no answer: list again
		}
		cases[i].Chan = reflect.ValueOf(ch)
	}
}

// grantShared grants the node, reading its czxid first when the create
// did not tell it. A permit granted with nodes behind it signals its
// grant (signal).
func (w *waiter) grantShared(ctx context.Context, behind bool) (dlock.Grant, error) {
	if w.czxid == 0 {
		res, err := w.b.watchOwn(ctx, w.path)
		if err != nil {
			return dlock.Grant{}, err
		}
		if !res.exists {
			return dlock.Grant{}, w.vanished()
		}
		w.own = &res
		w.czxid, w.session = res.stat.Czxid, res.stat.EphemeralOwner
	}
	if w.r.Kind == dlock.KindPermit && behind {
		w.b.signal(w.path, w.session, encodeData(w.r.Token, ""))
	}
	return w.b.granted(w.r, w.path, w.czxid, w.session, w.own)
}

// signal rewrites the data of a granted permit's node, unchanged, in the
// background: its successor, if it waits, watches it for that change
// (see placeShared). The write is retried until it is done, the node is
// gone, its session has ended or the Backend is closed.
func (b *Backend) signal(path string, session int64, data []byte) {
	b.background(session, func(ctx context.Context) bool {
		_, err := await(ctx, func() (*zk.Stat, error) { return b.conn.Set(path, data, -1) })
		return err == nil || errors.Is(err, zk.ErrNoNode)
	})
}
