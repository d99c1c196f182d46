package etcdlock

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
)

// Key layout. A lock named key has one etcd key per owner token, all
// under one directory:
//
//	PREFIX + escape(key) + "/" + hex(sha256(token))[:32]
//
// escape replaces "%" by "%25" and "/" by "%2F", so the directory of the
// lock "a" never contains the entries of the lock "a/b". The last element
// is derived from the owner token, so the entry of a (key, token) pair can
// be named without asking the server (Release, Refresh and Guard need no
// lookup) and a reentrant owner finds its own entry. The value is
// "COUNT TOKEN": the number of holds (and queued claims) of that token,
// then the token itself.

// escapeKey makes key usable as one element of an etcd key path.
func escapeKey(key string) string {
	if !strings.ContainsAny(key, "%/") {
		return key
	}
	var b strings.Builder
	for i := 0; i < len(key); i++ {
		switch c := key[i]; c {
		case '%':
			b.WriteString("%25")
		case '/':
			b.WriteString("%2F")
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// tokenID names a token's entry: 128 bits of its SHA-256, in hex.
func tokenID(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:16])
}

// dir returns the directory holding the entries of the lock key.
func (b *Backend) dir(key string) string {
	return b.prefix + escapeKey(key) + "/"
}

// entryName returns the etcd key of token's entry for the lock key.
func (b *Backend) entryName(key, token string) string {
	return b.dir(key) + tokenID(token)
}

// LockKey returns the etcd key that holds (or queues) the lock key for the
// owner token: a lease's Key and Owner. It exists while the lease is held;
// its create revision is the lease's fence. For inspection tools and for
// building guards by hand; Guard is the usual way to use it.
func (b *Backend) LockKey(key, owner string) string {
	return b.entryName(key, owner)
}

// Guard returns a comparison for the caller's own etcd transactions that
// succeeds only while l is still held: the lock's entry exists with create
// revision l.Fence(). Put it in the If of a Txn on the same etcd cluster,
//
//	txn := cli.Txn(ctx).If(b.Guard(lease)).Then(clientv3.OpPut("stock", "41"))
//
// and the write is applied only if no other owner can hold the lock at
// that revision, even when the lease was lost a moment before. A nil lease
// yields a comparison that never succeeds.
func (b *Backend) Guard(l *dlock.Lease) clientv3.Cmp {
	if l == nil {
		// Create revisions are never negative: this never holds.
		return clientv3.Compare(clientv3.CreateRevision(b.prefix), "=", int64(-1))
	}
	return clientv3.Compare(clientv3.CreateRevision(b.entryName(l.Key(), l.Owner())), "=", fenceRev(l.Fence()))
}

// fenceRev converts a fence to an etcd revision. Fences above the int64
// range come from another backend and can never match: -1.
func fenceRev(f uint64) int64 {
	if f > 1<<63-1 {
		return -1
	}
	return int64(f)
}

// encodeValue is the value of an entry: "COUNT TOKEN".
func encodeValue(count int, token string) string {
	return strconv.Itoa(count) + " " + token
}

// decodeValue parses an entry's value; ok is false for anything dlock
// did not write.
func decodeValue(v []byte) (count int, token string, ok bool) {
	s := string(v)
	i := strings.IndexByte(s, ' ')
	if i <= 0 {
		return 0, "", false
	}
	n, err := strconv.Atoi(s[:i])
	if err != nil || n < 1 {
		return 0, "", false
	}
	return n, s[i+1:], true
}
