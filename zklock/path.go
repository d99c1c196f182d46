package zklock

import (
	"crypto/rand"
	"encoding/hex"
	"sort"
	"strconv"
	"strings"
)

// Lock node names follow the protected-mode convention of Apache Curator
// and go-zookeeper's CreateProtectedEphemeralSequential:
//
//	_c_<guid>-lock-<sequence>
//
// where guid is 32 random hex digits chosen per acquisition and sequence
// the 10-digit counter ZooKeeper appends. The guid lets an acquisition
// whose create reply was lost find its node again by listing the queue.
const (
	protectedPrefix = "_c_"
	lockInfix       = "-lock-"
	seqDigits       = 10
)

// newGUID returns 32 random hex digits.
func newGUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand panics instead)
	return hex.EncodeToString(b[:])
}

// nodePrefix is the name, without the sequence, of the lock node of the
// acquisition identified by guid.
func nodePrefix(guid string) string { return protectedPrefix + guid + lockInfix }

// escapeKey maps a user key (any bytes) to a single znode name, one to
// one: ASCII letters, digits and "-_.:@,=+~" stay as they are, every other
// byte (including "/" and "%") becomes "%XX" with upper-case hex digits,
// and the names "." and ".." (which ZooKeeper reserves) become "%2E" and
// "%2E%2E". So "orders/1001" is the znode "orders%2F1001" — one level, not
// two — and no key can produce a name ZooKeeper rejects or mangles (the
// result is plain ASCII).
func escapeKey(key string) string {
	if plain(key) {
		return key
	}
	const digits = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(key))
	for i := 0; i < len(key); i++ {
		c := key[i]
		if keepByte(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(digits[c>>4])
		b.WriteByte(digits[c&0xf])
	}
	s := b.String()
	if s == "." || s == ".." {
		return strings.Repeat("%2E", len(s))
	}
	return s
}

// plain reports whether escapeKey leaves key as it is.
func plain(key string) bool {
	for i := 0; i < len(key); i++ {
		if !keepByte(key[i]) {
			return false
		}
	}
	return key != "." && key != ".."
}

func keepByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("-_.:@,=+~", c) >= 0
}

// lockSeq returns the sequence number of a lock node name
// ("..._lock-0000000042"), or ok false for a name that is not a lock node.
// Names of go-zookeeper's zk.Lock and Curator's mutexes parse too: they end
// in "lock-" and the sequence.
func lockSeq(name string) (seq int64, ok bool) {
	i := strings.LastIndex(name, "lock-")
	if i < 0 {
		return 0, false
	}
	digits := name[i+len("lock-"):]
	if len(digits) < seqDigits {
		return 0, false
	}
	n, err := strconv.ParseInt(digits, 10, 64)
	if err != nil {
		return 0, false
	}
	return n, true
}

// queue is the lock nodes of one key in sequence order.
type queue []queued

type queued struct {
	name string
	seq  int64
}

// parseQueue sorts the lock nodes among children by sequence, ignoring
// other names.
func parseQueue(children []string) queue {
	q := make(queue, 0, len(children))
	for _, c := range children {
		if seq, ok := lockSeq(c); ok {
			q = append(q, queued{c, seq})
		}
	}
	sort.Slice(q, func(i, j int) bool { return q[i].seq < q[j].seq })
	return q
}

// position returns how many lock nodes among children are ahead of name
// (lower sequence), the one just ahead (pred, "" when none) and the one
// just ahead of that (pp, "" when none), or index -1 when name is not
// among them. One pass, no sorting: the acquisition path only needs its
// own place.
func position(children []string, name string) (index int, pred, pp string) {
	own, ok := lockSeq(name)
	if !ok {
		return -1, "", ""
	}
	found, best, second := false, int64(-1), int64(-1)
	for _, c := range children {
		if c == name {
			found = true
			continue
		}
		seq, ok := lockSeq(c)
		if !ok || seq >= own {
			continue
		}
		index++
		switch {
		case seq > best:
			second, pp = best, pred
			best, pred = seq, c
		case seq > second:
			second, pp = seq, c
		}
	}
	if !found {
		return -1, "", ""
	}
	return index, pred, pp
}

// findProtected returns the child whose name starts with the protected
// prefix of guid (of any kind), or "".
func findProtected(children []string, guid string) string {
	p := protectedPrefix + guid + "-"
	for _, c := range children {
		if strings.HasPrefix(c, p) {
			return c
		}
	}
	return ""
}

// baseName returns the last component of a znode path.
func baseName(path string) string { return path[strings.LastIndexByte(path, '/')+1:] }
