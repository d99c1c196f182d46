package redislock

import "github.com/dlock-go/dlock"

// lockName returns the name of the lock of key: PREFIX{KEY}. Every other
// name of the lock (queue, heartbeats, release channel) starts with it, so
// they share the hash tag {KEY} and its Redis Cluster slot. A key starting
// with '}' or '\' gets a leading '\' inside the braces: a tag may not be
// empty, and the escape keeps distinct keys distinct.
func (b *Backend) lockName(key string) string {
	if key[0] == '}' || key[0] == '\\' {
		return b.cfg.prefix + "{\\" + key + "}"
	}
	return b.cfg.prefix + "{" + key + "}"
}

// channelName returns the release channel of lock.
func channelName(lock string) string { return lock + ":rel" }

// lockKeys returns the keys the scripts that may serve the queue take:
// the lock and its FIFO queue.
func lockKeys(lock string) []string {
	keys, _ := lockNames(lock)
	return keys
}

// lockNames returns lockKeys(lock) and the release channel, cut from one
// string: a single allocation for all the names.
func lockNames(lock string) (keys []string, channel string) {
	n := len(lock)
	s := lock + ":q" + lock + ":rel"
	return []string{lock, s[:n+2]}, s[n+2:]
}

// LockName returns the Redis key of the lock key: PREFIX{KEY}, a string
// (see the package documentation for its value). The FIFO queue is
// LockName(key)+":q", a waiter's heartbeat LockName(key)+":w:"+member and
// the release channel LockName(key)+":rel". It returns "" for an invalid
// key.
func (b *Backend) LockName(key string) string {
	if dlock.ValidateKey(key) != nil {
		return ""
	}
	return b.lockName(key)
}
