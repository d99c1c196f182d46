package zklock

import "context"

// Internals exported to the black-box tests.

// EscapeKey is escapeKey.
var EscapeKey = escapeKey

// CreateNode runs the protected create of an acquisition of key whose
// guid is guid, and returns the node's path.
func (b *Backend) CreateNode(ctx context.Context, key, guid string) (string, error) {
	node, err := b.create(ctx, b.KeyPath(key), guid, nodePrefix(guid), []byte("test"))
	return node.path, err
}

// RecoverNode runs the look-up an acquisition does after a lost create
// reply: the path of the node of guid under key's queue, or "".
func (b *Backend) RecoverNode(ctx context.Context, key, guid string) (string, error) {
	return b.recoverCreate(ctx, b.KeyPath(key), guid)
}

// NodePrefix is the name prefix of the lock node of guid.
var NodePrefix = nodePrefix

// Watched reports whether a lock of key held through b has an existence
// watch on its node.
func (b *Backend) Watched(key string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for k, h := range b.holds {
		if k.key == key && b.watchedLocked(h) {
			return true
		}
	}
	return false
}

// WatchDelay is watchDelay.
const WatchDelay = watchDelay

// Frames splits stream, fed in chunks of chunk bytes, into the heads (the
// first max bytes of each frame's body) the wire sniffer sees.
func Frames(stream []byte, max, chunk int) [][]byte {
	var heads [][]byte
	f := frames{max: max, fn: func(h []byte) { heads = append(heads, append([]byte(nil), h...)) }}
	for len(stream) > 0 {
		n := min(chunk, len(stream))
		f.feed(stream[:n])
		stream = stream[n:]
	}
	return heads
}

// SetWatchAhead turns b's protocol switch watchAhead on or off (for
// benchmarks that measure what it saves). Call it before b's first
// acquisition.
func (b *Backend) SetWatchAhead(on bool) { b.watchAhead = on }

// Unwatched returns how many holds of b have no existence watch on their
// node (the armer has not set it yet, or it fired).
func (b *Backend) Unwatched() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, h := range b.holds {
		if !b.watchedLocked(h) {
			n++
		}
	}
	return n
}

// ReapsKept returns how many reaps scheduled by b found their hold
// claimed again by a lease and kept its node.
func (b *Backend) ReapsKept() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.reapsKept
}
