package zklock

import (
	"encoding/binary"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"
)

// A Backend made by Connect reads what go-zookeeper does not expose off
// the wire of its connection:
//
//   - the session timeout the server negotiated, from the ConnectResponse
//     that opens every connection (int32 protocolVersion, int32 timeOut in
//     ms, int64 sessionId, passwd), which TTLs are checked against;
//   - the zxid of the reply to each lock node's create, which is the new
//     node's czxid — the fence — so a grant needs no extra read of the
//     node. Requests are frames of int32 xid, int32 opcode, then for a
//     create the path; replies start with int32 xid, int64 zxid, int32 err;
//   - the watch events (xid -1; then int32 type, int32 state, the path)
//     of the watches on held nodes (see wirewatch.go).
//
// The one byte it changes is the watch flag of the Exists requests
// readWire asks for (wirewatch.go).
//
// Every frame is prefixed with its int32 length. A Backend from New (or a
// create whose reply was not seen) gets the czxid another way: see
// createOnce.
//
// It also bounds the session handshake, which go-zookeeper gives
// 10 × 2/3 of the session timeout: a server whose port accepts connections
// but which does not answer (a ZooKeeper restarting under load) would keep
// the client from trying again, and from learning that its session
// expired, for 6.7 session timeouts — the lock then looks held, or its
// waiters blind, long after the server serves again. Like the Java
// client, the handshake gets 2/3 of the session timeout (handshakeBound).

const (
	opCreate      = 1
	opExists      = 3
	maxCreateHead = 12 + 4<<10 // xid, opcode, path length and up to 4 KiB of path
	replyHead     = 16         // xid, zxid, err
	eventHead     = 12         // after the reply head of a watch event: type, state, path length
	maxReplyHead  = replyHead + eventHead + 4<<10
	connectHead   = 16 // protocolVersion, timeOut, sessionId
)

// sniffConn watches the frames of one connection. Writes come from one
// goroutine at a time, and so do reads.
type sniffConn struct {
	net.Conn
	b      *Backend
	out    frames
	in     frames
	outAny bool // the ConnectRequest has been written
	inAny  bool // the ConnectResponse has been read

	handshake time.Duration // bound of the handshake's deadlines; 0: none
	shook     atomic.Bool   // the ConnectResponse has been read

	mu      sync.Mutex
	creates map[int32]string // xid → path prefix of our creates awaiting their reply
}

// handshakeBound is the bound of the session handshake of a connection
// requesting sessionTimeout: 2/3 of it, as go-zookeeper and the Java
// client allow for any other answer.
func handshakeBound(sessionTimeout time.Duration) time.Duration { return sessionTimeout * 2 / 3 }

func newSniffConn(c net.Conn, b *Backend, handshake time.Duration) *sniffConn {
	b.gen.Add(1) // before any request on c: the wire watches of earlier connections are gone
	s := &sniffConn{Conn: c, b: b, handshake: handshake, creates: make(map[int32]string)}
	s.out = frames{max: maxCreateHead, fn: s.request}
	s.in = frames{max: maxReplyHead, fn: s.reply}
	return s
}

func (c *sniffConn) Write(p []byte) (int, error) {
	// go-zookeeper writes one whole frame per Write.
	if c.outAny && c.out.idle() && len(p) > 4 && int(be32(p)) == len(p)-4 {
		c.b.flipExists(p[4:])
	}
	c.out.feed(p) // before the bytes leave: the reply cannot come first
	return c.Conn.Write(p)
}

func (c *sniffConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.in.feed(p[:n])
	return n, err
}

// SetReadDeadline bounds deadlines set before the handshake is done.
func (c *sniffConn) SetReadDeadline(t time.Time) error {
	return c.Conn.SetReadDeadline(c.bound(t))
}

// SetWriteDeadline bounds deadlines set before the handshake is done.
func (c *sniffConn) SetWriteDeadline(t time.Time) error {
	return c.Conn.SetWriteDeadline(c.bound(t))
}

// bound returns t, or now + c.handshake when that is earlier and the
// ConnectResponse has not been read. A zero t (no deadline) is kept.
func (c *sniffConn) bound(t time.Time) time.Time {
	if t.IsZero() || c.handshake <= 0 || c.shook.Load() {
		return t
	}
	if lim := time.Now().Add(c.handshake); t.After(lim) {
		return lim
	}
	return t
}

// request notes the xid of each create of a lock node.
func (c *sniffConn) request(head []byte) {
	if !c.outAny {
		c.outAny = true // the ConnectRequest
		return
	}
	if len(head) < 12 || int32(binary.BigEndian.Uint32(head[4:8])) != opCreate {
		return
	}
	n := int(binary.BigEndian.Uint32(head[8:12]))
	if n < 0 || 12+n > len(head) {
		return
	}
	path := string(head[12 : 12+n])
	if !strings.Contains(path, "/"+protectedPrefix) {
		return
	}
	c.mu.Lock()
	c.creates[int32(binary.BigEndian.Uint32(head[0:4]))] = path
	c.mu.Unlock()
}

// reply records the negotiated session timeout, and the zxid of each
// successful create of a lock node.
func (c *sniffConn) reply(head []byte) {
	if !c.inAny {
		c.inAny = true
		c.shook.Store(true)
		if len(head) >= connectHead {
			timeout := int32(binary.BigEndian.Uint32(head[4:8]))
			session := binary.BigEndian.Uint64(head[8:16])
			if session != 0 && timeout > 0 { // session 0: the old session expired
				c.b.negotiated.Store(int64(timeout) * int64(time.Millisecond))
			}
			c.b.wireConnected(int64(session), timeout)
		}
		return
	}
	if len(head) < replyHead {
		return
	}
	xid := int32(binary.BigEndian.Uint32(head[0:4]))
	if xid == -1 && len(head) >= replyHead+eventHead {
		typ := int32(be32(head[16:20]))
		n := int(be32(head[24:28]))
		if n >= 0 && 28+n <= len(head) {
			c.b.wireEvent(zk.EventType(typ), head[28:28+n])
		}
		return
	}
	if xid < 0 { // pings (-2)
		return
	}
	c.mu.Lock()
	path, ok := c.creates[xid]
	delete(c.creates, xid)
	c.mu.Unlock()
	if ok && binary.BigEndian.Uint32(head[12:16]) == 0 {
		c.b.czxids.put(path, int64(binary.BigEndian.Uint64(head[4:12])))
	}
}

// frames splits a byte stream into length-prefixed frames and hands the
// first max bytes of each frame's body to fn when the frame ends.
type frames struct {
	max    int
	fn     func(head []byte)
	lenBuf [4]byte
	lenN   int
	left   int // body bytes of the current frame still to come
	head   []byte
}

// idle reports whether f is between frames.
func (f *frames) idle() bool { return f.left == 0 && f.lenN == 0 }

func be32(b []byte) uint32 { return binary.BigEndian.Uint32(b) }

func (f *frames) feed(p []byte) {
	for len(p) > 0 {
		if f.left == 0 {
			k := copy(f.lenBuf[f.lenN:], p)
			f.lenN += k
			p = p[k:]
			if f.lenN < len(f.lenBuf) {
				return
			}
			f.lenN = 0
			f.left = int(binary.BigEndian.Uint32(f.lenBuf[:]))
			f.head = f.head[:0]
			if f.left == 0 {
				f.fn(nil)
			}
			continue
		}
		k := min(len(p), f.left)
		if room := f.max - len(f.head); room > 0 {
			f.head = append(f.head, p[:min(k, room)]...)
		}
		f.left -= k
		p = p[k:]
		if f.left == 0 {
			f.fn(f.head)
		}
	}
}

// zxidTable holds the czxids sniffed from create replies until the
// creates that made them pick them up. Entries of creates abandoned
// before they could (their context ended) are dropped when the table
// grows past maxZxids.
type zxidTable struct {
	mu sync.Mutex
	m  map[string]int64
}

const maxZxids = 1024

func (t *zxidTable) put(prefix string, zxid int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil || len(t.m) >= maxZxids {
		t.m = make(map[string]int64)
	}
	t.m[prefix] = zxid
}

// take returns and forgets the czxid of the node created with prefix, 0
// when none was seen.
func (t *zxidTable) take(prefix string) int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	z := t.m[prefix]
	delete(t.m, prefix)
	return z
}
