package redislock

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
)

// tombstones remembers, per Backend, the last locks granted with a fence
// floor (Request.Fence, package redlock) and their fences. A floor runs
// ahead of the server clock, so the release of such a lock leaves a
// tombstone until the server clock passes the fence (see doc.go,
// Fencing); an acquisition of the lock before then asks acquire.lua to
// read the lock first (GET, then SET), which takes a tombstone with one
// write and no TIME, where SET NX GET would need a second SET. It is a
// hint: a wrong one costs the script one redis.call, never a wrong
// grant. Locks taken without a floor are never recorded.
type tombstones struct {
	// offset is the server clock less this process's (µs), from the last
	// grant that read TIME: a lower bound (the reply came after TIME).
	offset atomic.Int64
	mu     sync.Mutex
	slots  [64]tombSlot
}

type tombSlot struct {
	lock  string
	fence int64
}

var tombSeed = maphash.MakeSeed()

func (t *tombstones) slot(lock string) *tombSlot {
	return &t.slots[maphash.String(tombSeed, lock)%uint64(len(t.slots))]
}

// expect reports whether lock may hold a tombstone now: it was last
// granted here with a fence the server clock has not passed (by the
// offset learnt, with a millisecond to spare for PXAT's rounding).
func (t *tombstones) expect(lock string) bool {
	t.mu.Lock()
	s := *t.slot(lock)
	t.mu.Unlock()
	return s.lock == lock && time.Now().UnixMicro()+t.offset.Load() < s.fence+1000
}

// note records a grant of lock with fence; now is the server time the
// script read (µs), 0 when it read none.
func (t *tombstones) note(lock string, fence uint64, now int64) {
	if now > 0 {
		t.offset.Store(now - time.Now().UnixMicro())
	}
	t.mu.Lock()
	*t.slot(lock) = tombSlot{lock: lock, fence: int64(fence)}
	t.mu.Unlock()
}
