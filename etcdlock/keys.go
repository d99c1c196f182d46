package etcdlock

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
)

// Key layout. A lock named key has one etcd key per holder or waiter
// (an entry), all under one directory:
//
//	PREFIX + escape(key) + "/" + NAME
//
// escape replaces "%" by "%25" and "/" by "%2F", so the directory of the
// lock "a" never contains the entries of the lock "a/b". The value is
// "COUNT TOKEN": the number of holds (and queued claims) of the owner
// token, then the token itself.
//
// NAME depends on the request. A reentrant request's entry (a stable
// owner, dlock.WithOwner) is named after its token, hex(sha256(token))[:32],
// so that every Backend finds it and the owner's holds share it. Any other
// request carries a random token used once; naming its entry after the
// token would leave one more dead key in the directory with every
// acquisition: etcd keeps a deleted key in its index until the cluster is
// compacted, and every read of the queue (a range over the directory)
// walks them all, so a busy lock slowed down with its history (20,000
// past acquisitions made hand-offs about 3× slower). Such an entry is
// named after the Backend instead: ID + "." + SLOT, where ID is random per
// Backend (base32, so never a token name) and SLOT the smallest number the
// Backend does not use for that lock at the moment (usually 0). A Backend
// taking the same lock again and again reuses one etcd key, as
// concurrency.Mutex does with its session's lease. The Backend remembers
// which slot each (key, token) pair it serves has (see slot and nameOf).

// escapeKey makes key usable as one element of an etcd key path.
func escapeKey(key string) string {
	if !strings.ContainsAny(key, "%/") {
		return key
	}
	return string(appendEscaped(make([]byte, 0, len(key)+8), key))
}

// appendEscaped appends escapeKey(key) to buf.
func appendEscaped(buf []byte, key string) []byte {
	for i := 0; i < len(key); i++ {
		switch c := key[i]; c {
		case '%':
			buf = append(buf, "%25"...)
		case '/':
			buf = append(buf, "%2F"...)
		default:
			buf = append(buf, c)
		}
	}
	return buf
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

// entryName returns the name of token's entry for the lock key when it
// is named after the token (reentrant requests).
func (b *Backend) entryName(key, token string) string {
	return b.dir(key) + tokenID(token)
}

// nameSet is the Backend's entry names in use by non-reentrant requests.
// Guarded by Backend.mu.
type nameSet struct {
	slots map[string]*slot // by entry name
	wide  map[string]int   // lock keys with slots above 0: 1 + the highest slot number in use
}

// slot is an entry name of the Backend in use by a non-reentrant token,
// with the number of the token's acquisitions in flight and holds using
// it (more than one only when a token is used twice at once, which
// fails). Backend.slots maps the names to their slots; the slot of a
// (key, token) pair is found by trying the names of the lock's directory
// in order (usually only number 0: see Backend.wide), which keeps the
// memory per held lock small (a Backend may hold 100,000 locks).
type slot struct {
	token string
	refs  int
}

// appendSlotName appends the name of the Backend's slot i in the
// directory of the lock key to buf.
func (b *Backend) appendSlotName(buf []byte, key string, i int) []byte {
	buf = appendEscaped(append(buf, b.prefix...), key)
	buf = append(buf, '/')
	buf = append(buf, b.id...)
	buf = append(buf, '.')
	return strconv.AppendInt(buf, int64(i), 10)
}

// slotLocked returns the slot of (key, token), if it has one, and its
// name appended to buf[:0]. b.mu must be held.
func (b *Backend) slotLocked(buf []byte, key, token string) ([]byte, *slot) {
	for i := range max(b.names.wide[key], 1) {
		name := b.appendSlotName(buf[:0], key, i)
		if s := b.names.slots[string(name)]; s != nil && s.token == token {
			return name, s
		}
	}
	return nil, nil
}

// claimName returns the entry name for a new acquisition by r: the token's
// name for a reentrant request, else a slot of the Backend, which stays
// r's until unclaim (or, once granted, until the hold ends).
func (b *Backend) claimName(r dlock.Request) string {
	if r.Reentrant {
		return b.entryName(r.Key, r.Token)
	}
	var buf [128]byte
	b.mu.Lock()
	defer b.mu.Unlock()
	if name, s := b.slotLocked(buf[:0], r.Key, r.Token); s != nil {
		s.refs++
		return string(name) // the same token twice at once: the entry tells
	}
	for i := 0; ; i++ {
		name := string(b.appendSlotName(buf[:0], r.Key, i))
		if b.names.slots[name] != nil || b.holds.byName[name] != nil {
			continue
		}
		if _, orphaned := b.orphans.byName[name]; orphaned {
			continue
		}
		b.names.slots[name] = &slot{token: r.Token, refs: 1}
		if i > 0 {
			b.names.wide[r.Key] = max(b.names.wide[r.Key], i+1)
		}
		return name
	}
}

// unclaim ends the use of the slot name by an acquisition by r that was
// not granted.
func (b *Backend) unclaim(r dlock.Request, name string) {
	if r.Reentrant {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.unclaimLocked(r.Key, r.Token, name)
}

// unclaimLocked ends one use of the slot name by (key, token): an
// acquisition not granted, or a hold that ended. The slot is free once
// unused; an entry that may remain under it keeps it taken as an orphan.
// b.mu must be held.
func (b *Backend) unclaimLocked(key, token, name string) {
	s := b.names.slots[name]
	if s == nil || s.token != token {
		return
	}
	if s.refs--; s.refs <= 0 {
		b.freeSlotLocked(key, name)
	}
}

// freeSlotLocked deletes the slot name of the lock key. b.mu must be
// held.
func (b *Backend) freeSlotLocked(key, name string) {
	delete(b.names.slots, name)
	b.forgetKindLocked(name)
	n := b.names.wide[key]
	if n == 0 {
		return
	}
	var buf [128]byte
	for n > 1 && b.names.slots[string(b.appendSlotName(buf[:0], key, n-1))] == nil {
		n--
	}
	if n <= 1 {
		delete(b.names.wide, key)
	} else {
		b.names.wide[key] = n
	}
}

// nameOf returns the entry name of (key, token): the Backend's slot for it
// if it has one (a lock it queues or holds for that token), else the
// token's name (which exists only for reentrant locks).
func (b *Backend) nameOf(key, token string) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.nameOfLocked(key, token)
}

// nameOfLocked is nameOf with b.mu held.
func (b *Backend) nameOfLocked(key, token string) string {
	if name, ok := b.kindNameLocked(key, token); ok {
		return name
	}
	var buf [128]byte
	if name, s := b.slotLocked(buf[:0], key, token); s != nil {
		return string(name)
	}
	return b.entryName(key, token)
}

// heldLocked returns the hold of the entry nameOf(key, token) names, or
// nil; without allocating when it is a slot. b.mu must be held.
func (b *Backend) heldLocked(key, token string) *held {
	if name, ok := b.kindNameLocked(key, token); ok {
		return b.holds.byName[name]
	}
	var buf [128]byte
	if name, s := b.slotLocked(buf[:0], key, token); s != nil {
		return b.holds.byName[string(name)]
	}
	return b.holds.byName[b.entryName(key, token)]
}

// LockKey returns the etcd key of the lock key's entry for owner (a
// lease's Key and Owner) while held through b, or for an owner's entry
// through any Backend; its create revision is the lease's fence.
func (b *Backend) LockKey(key, owner string) string {
	return b.nameOf(key, owner)
}

// Guard returns a comparison for the caller's own transactions on the
// same etcd cluster that holds only while l is held: the lock's entry
// exists with create revision l.Fence(). A nil lease never matches.
//
//	txn := cli.Txn(ctx).If(b.Guard(lease)).Then(clientv3.OpPut("stock", "41"))
func (b *Backend) Guard(l *dlock.Lease) clientv3.Cmp {
	if l == nil {
		// Create revisions are never negative: this never holds.
		return clientv3.Compare(clientv3.CreateRevision(b.prefix), "=", int64(-1))
	}
	return clientv3.Compare(clientv3.CreateRevision(b.nameOf(l.Key(), l.Owner())), "=", fenceRev(l.Fence()))
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

// decodeValue parses an entry's value (see decodeEntry); ok is false for
// anything dlock did not write.
func decodeValue(v []byte) (count int, token string, ok bool) {
	count, token, _, ok = decodeEntry(v)
	return count, token, ok
}

// decodeEntry parses an entry's value, "COUNT TOKEN", or "COUNT/LEN
// TOKEN VALUE" (no space between TOKEN and VALUE; LEN is the token's
// length) for an elected leader's value (see encodeEntry); ok is false
// for anything dlock did not write.
func decodeEntry(v []byte) (count int, token, value string, ok bool) {
	s := string(v)
	i := strings.IndexByte(s, ' ')
	if i <= 0 {
		return 0, "", "", false
	}
	head, rest := s[:i], s[i+1:]
	tl := -1
	if j := strings.IndexByte(head, '/'); j >= 0 {
		n, err := strconv.Atoi(head[j+1:])
		if err != nil || n < 0 || n > len(rest) {
			return 0, "", "", false
		}
		head, tl = head[:j], n
	}
	n, err := strconv.Atoi(head)
	if err != nil || n < 1 {
		return 0, "", "", false
	}
	if tl < 0 {
		return n, rest, "", true
	}
	return n, rest[:tl], rest[tl:], true
}
